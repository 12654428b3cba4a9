"""The deadlines of a session (`client/deadlines.py`): a server that trickles, stays silent or
stops reading is stopped, locally and behind ssh, and the sync says which wait ran out."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import LAUNCHER, write_config

from sharedmem.client.config import Timeouts
from sharedmem.client.deadlines import Watch


def watch(limits: Timeouts, moved: list[int]) -> tuple[Watch, threading.Event]:
    """A watch over a stand-in session: `moved[0]` is its byte count; the event, its stop."""
    stopped = threading.Event()
    return Watch(limits, "the test server", Path("/c/client.json"), lambda: moved[0],
                 stopped.set), stopped


def test_a_wait_with_no_byte_moving_stops_the_session_and_says_which() -> None:
    kept, stopped = watch(Timeouts(reply_seconds=0.3, session_seconds=60), [0])
    with kept.waiting("its answer to its manifest"):
        assert stopped.wait(5)
    assert kept.reason is not None and kept.reason.startswith(
        "the server (the test server) sent nothing for 0 s while this client waited for its "
        "answer to its manifest, past `timeouts.reply_seconds` (0.3 s) in /c/client.json")


def test_no_deadline_runs_while_the_client_does_its_own_work_or_pauses() -> None:
    kept, stopped = watch(Timeouts(reply_seconds=0.3, session_seconds=0.3), [0])
    time.sleep(0.8)  # not waiting on the server
    with kept.waiting("its bodies message", sending=True), kept.paused():
        time.sleep(0.8)
    kept.stop()
    assert not stopped.is_set() and kept.reason is None


def test_waits_that_outlast_what_the_bytes_moved_allow_stop_the_session() -> None:
    moved = [0]
    kept, stopped = watch(Timeouts(reply_seconds=60, session_seconds=0.5, session_rate=1000),
                          moved)
    with kept.waiting("its answer to its hello"):
        for _ in range(200):  # a trickle: never quiet, but 200 bytes a second buy little time
            if stopped.wait(0.05):
                break
            moved[0] += 10
    assert stopped.is_set() and kept.reason is not None and "answers too slowly" in kept.reason
    assert "`timeouts.session_rate` (1000) bytes in /c/client.json" in kept.reason

STAND_IN = r'''
import json, os, sys, threading, time
mode, pids = sys.argv[1], sys.argv[2]
with open(pids, "a") as out:
    out.write(f"{os.getpid()}\n")
inp, out = sys.stdin.buffer, sys.stdout.buffer
hello = json.loads(inp.readline())
answer = {"type": "hello", "versions": [1, 2, 3], "version": 2, "server": "stand-in",
          "machine": hello["machine"], "pinned": False}
if mode == "deaf":
    answer["ahead_bytes"] = 64 << 20  # bodies come at once, and this end reads none of them
out.write(json.dumps(answer).encode() + b"\n")
out.flush()
def read_to_the_end():  # as `serve` does, it ends when the client goes
    for _ in inp:
        pass
    os._exit(0)
def watch_the_parent():  # sshd's session, which ends when the client goes
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.1)
    os._exit(0)
threading.Thread(target=read_to_the_end if mode != "deaf" else watch_the_parent,
                 daemon=True).start()
if mode == "trickle":  # an answer that never ends, a byte at a time
    for byte in b'{"type": "need", "source": "notes", "sha256": [' + b'"0",' * 10_000:
        out.write(bytes([byte]))
        out.flush()
        time.sleep(0.2)
time.sleep(600)
'''

# Deadlines made small for a test: a wait with nothing moving, a session's waits in all (long
# enough for ssh to connect and the stand-in to start on a busy machine).
SMALL = {"reply_seconds": 4, "session_seconds": 5, "session_rate": 1000}


def stand_in_release(tmp_path: Path, mode: str, pids: Path) -> Path:
    """A copy of this release whose launcher runs the stand-in server for `serve`.

    A local transport starts `serve` through the launcher beside the package: here that
    launcher runs `sync` as the real one does, and `serve` as the stand-in.
    """
    root = tmp_path / "release"
    shutil.copytree(Path(LAUNCHER).parent / "sharedmem", root / "sharedmem",
                    ignore=shutil.ignore_patterns("__pycache__"))
    server = tmp_path / "stand_in.py"
    server.write_text(STAND_IN)
    (root / "shared_memory.py").write_text(
        "import os, runpy, sys\n"
        "sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))\n"
        "if sys.argv[1:2] == ['serve']:\n"
        f"    sys.argv = [{str(server)!r}, {mode!r}, {str(pids)!r}]\n"
        f"    runpy.run_path({str(server)!r}, run_name='__main__')\n"
        "else:\n"
        "    from sharedmem.cli.main import main\n"
        "    sys.exit(main(sys.argv[1:]))\n")
    return root / "shared_memory.py"


def stalled_sync(tmp_path: Path, transport: dict,
                 launcher: Path) -> tuple[subprocess.CompletedProcess, float, Path]:
    """A first sync of six large notes (5.4 MB: more than ssh's window and the pipes hold)
    against `transport`, with small deadlines: its run, how long it took, its configuration."""
    notes = tmp_path / "notes"
    notes.mkdir()
    for i in range(6):
        (notes / f"n{i}.md").write_text(f"# note {i}\n" + "words and more words\n" * 45_000)
    path = write_config(tmp_path / "c" / "client.json", "laptop", transport,
                        [{"name": "notes", "kind": "markdown", "path": str(notes)}],
                        tmp_path / "cache")
    raw = json.loads(path.read_text())
    path.write_text(json.dumps({**raw, "timeouts": SMALL}))
    started = time.monotonic()
    run = subprocess.run([sys.executable, str(launcher), "sync", "--config", str(path)],
                         capture_output=True, text=True, timeout=90,
                         env={**os.environ, "HOME": str(tmp_path)})
    return run, time.monotonic() - started, path


SAID = {"silent": "sent nothing for 4 s while this client waited for its answer to its manifest "
                  "(need or result), past `timeouts.reply_seconds` (4 s)",
        "trickle": "answers too slowly: this client waited on it ",
        "deaf": "took nothing of what this client sent for 4 s (it was sending its bodies "
                "message), past `timeouts.reply_seconds` (4 s)"}


def assert_stopped(run: subprocess.CompletedProcess, seconds: float, where: str, mode: str,
                   pids: Path, config: Path) -> None:
    """The sync ended on its own, saying which side stopped answering, and left no server end."""
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert seconds < 40  # the deadlines are 4 and 5 s; before them, it waited for ever
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr, run.stderr
    assert f"sync failed: the server ({where}) {SAID[mode]}" in run.stderr, run.stderr
    if mode == "trickle":  # 5 s, and a second for each 1000 bytes: the hello, the manifest...
        assert " s in all (the last time for its answer to its manifest (need or result)) while " \
            in run.stderr and "past `timeouts.session_seconds` (5 s)" in run.stderr
    assert str(config) in run.stderr and "docs/CONFIGURATION.md" in run.stderr
    deadline = time.monotonic() + 20
    for pid in map(int, pids.read_text().split()):
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            if Path(f"/proc/{pid}/stat").is_file() and \
                    Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
                break  # killed, not yet reaped by its parent
            time.sleep(0.1)
        else:
            raise AssertionError(f"the server end {pid} still runs")


@pytest.mark.parametrize("mode", ["silent", "trickle", "deaf"])
def test_a_local_server_that_stalls_is_stopped_at_a_deadline(tmp_path: Path, mode: str) -> None:
    pids = tmp_path / "pids"
    launcher = stand_in_release(tmp_path, mode, pids)
    store = tmp_path / "store.sqlite3"
    run, seconds, config = stalled_sync(tmp_path, {"kind": "local", "store": str(store)},
                                        launcher)
    assert_stopped(run, seconds, f"the local store {store}", mode, pids, config)


@pytest.mark.parametrize("mode", ["silent", "trickle", "deaf"])
def test_a_server_behind_ssh_that_stalls_is_stopped_at_a_deadline(tmp_path: Path, sshd: Any,
                                                                   mode: str) -> None:
    pids = tmp_path / "pids"
    server = tmp_path / "stand_in.py"
    server.write_text(STAND_IN)
    transport = sshd.transport(pinned=False,
                               remote_command=[sys.executable, str(server), mode, str(pids)])
    run, seconds, config = stalled_sync(tmp_path, transport, Path(LAUNCHER))
    assert_stopped(run, seconds, f"ssh {sshd.user}@127.0.0.1", mode, pids, config)
