"""Bodies sent ahead of their manifest: to a real `serve`, to a server that limits them, and tails."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from conftest import LAUNCHER, LOG_BASE, LOG_TAIL, local_config, run_cli, write_config

from sharedmem.client import config as config_mod
from sharedmem.client import send_ahead as ahead_mod
from sharedmem.client.send_ahead import TAIL_BATCH, Ahead
from sharedmem.client.transport import Connection
from sharedmem.hashing import digest_of, sha256_text

TEXTS = [f"# note {i}\n\n" + "words " * (40 + i) for i in range(30)]


def wait_for_hello(conn: Connection) -> None:
    """What a long walk does without meaning to: outlast the server's start."""
    deadline = time.monotonic() + 30
    while conn.early is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert conn.early is not None, "the server's hello did not come within 30 s"


def hello_offering(conn: Connection, texts: list[str]) -> Ahead:
    """Open the session as a sync does, offering `texts` ahead once the hello has come."""
    ahead = Ahead(conn)

    def walk() -> None:
        wait_for_hello(conn)
        for text in texts:
            ahead.offer(sha256_text(text), text.encode())
        ahead.finish()
        ahead.wait()

    with conn.handshake():
        walk()
    return ahead


def manifest(texts: list[str]) -> dict:
    entries = [[f"{i}.md", sha256_text(t), len(t.encode()), 0] for i, t in enumerate(texts)]
    return {"type": "manifest", "source": "notes", "kind": "markdown",
            "digest": digest_of((e[0], e[1]) for e in entries), "files": entries}


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("batch", [1 << 20, 500])  # one batch at the end; a batch every file
def test_bodies_sent_ahead_reach_a_real_server_which_then_needs_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch: int, version: int) -> None:
    monkeypatch.setattr(ahead_mod, "BATCH_BYTES", batch)
    with Connection(local_config(tmp_path, tmp_path / "store.sqlite3"),
                    max_version=version) as conn:
        ahead = Ahead(conn)

        def walk() -> None:
            ahead.offer(sha256_text(TEXTS[0]), TEXTS[0].encode())  # before the hello
            wait_for_hello(conn)
            for text in TEXTS:
                ahead.offer(sha256_text(text), text.encode())
            ahead.finish()
            ahead.wait()

        with conn.handshake():
            walk()
        assert ahead.sent_bytes == sum(len(t.encode()) for t in TEXTS)
        assert conn.version == version
        conn.channel.send(manifest(TEXTS))
        if version == 2:
            assert conn.channel.expect("need")["sha256"] == []
            conn.channel.send({"type": "commit"})
        # Version 3: texts alone ahead, and a manifest that needs nothing commits at once.
        assert conn.channel.expect("result")["accepted"] == len(TEXTS)


def test_a_version_1_server_is_sent_nothing_ahead(tmp_path: Path) -> None:
    with Connection(local_config(tmp_path, tmp_path / "store.sqlite3"), max_version=1) as conn:
        ahead = hello_offering(conn, TEXTS)
        sent = conn.channel.sent
        assert ahead.sent_bytes == 0 and not ahead.open
        conn.channel.send({"type": "status"})
        assert conn.channel.expect("status")["type"] == "status"
        assert conn.channel.sent > sent


RECORDER = r'''
import json, sys, time
limit, log = sys.argv[1], open(sys.argv[2], "w")
delay = float(sys.argv[3]) if len(sys.argv) > 3 else 0
hello = {"type": "hello", "version": 2, "versions": [2], "server": "recorder"}
if limit != "None":
    hello["ahead_bytes"] = int(limit)
for line in sys.stdin:
    m = json.loads(line)
    log.write(json.dumps([m["type"], [p[0] for p in m.get("bodies", [])]]) + "\n"); log.flush()
    if m["type"] == "hello":
        time.sleep(delay)
        sys.stdout.write(json.dumps(hello) + "\n"); sys.stdout.flush()
'''


@pytest.mark.parametrize("limit,sent", [(None, 0), (0, 0), (250, 2), (10_000, 5)])
def test_the_client_keeps_to_what_the_server_offers(tmp_path: Path, sshd, limit: int | None,
                                                    sent: int) -> None:
    script, log = tmp_path / "recorder.py", tmp_path / "log.jsonl"
    script.write_text(RECORDER)
    path = write_config(tmp_path / "client.json", "laptop", sshd.transport(
        pinned=False, remote_command=[sys.executable, str(script), str(limit), str(log)]), [],
        tmp_path / "cache")
    texts = ["x" * 100 + str(i) for i in range(5)]  # 101 bytes each
    with Connection(config_mod.load(path, {"HOME": str(tmp_path)})) as conn:
        ahead = hello_offering(conn, texts)
        conn.channel.send({"type": "status"})  # the recorder logs it: all before is on file
        deadline = time.monotonic() + 30
        while '"status"' not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.01)
    received = [json.loads(line) for line in log.read_text().splitlines()]
    bodies = [sha for kind, shas in received if kind == "bodies" for sha in shas]
    assert bodies == [sha256_text(t) for t in texts[:sent]]
    assert ahead.sent_bytes == 101 * sent
    kinds = [kind for kind, _ in received]
    assert kinds[:kinds.index("status") + 1] == ["hello"] + ["bodies"] * bool(sent) + ["status"]


@pytest.mark.parametrize("limit,sent", [(None, 0), (250, 0), (10_000, 5)])
def test_bodies_offered_before_the_hello_go_when_it_comes(tmp_path: Path, sshd,
                                                          limit: int | None, sent: int) -> None:
    # A walk that ends before ssh connects encodes what it offered; the hello then says whether
    # it all fits (there is no partial send of those), and it goes before anything else.
    script, log = tmp_path / "recorder.py", tmp_path / "log.jsonl"
    script.write_text(RECORDER)
    path = write_config(tmp_path / "client.json", "laptop", sshd.transport(
        pinned=False, remote_command=[sys.executable, str(script), str(limit), str(log), "1"]),
        [], tmp_path / "cache")
    texts = ["x" * 100 + str(i) for i in range(5)]  # 101 bytes each
    with Connection(config_mod.load(path, {"HOME": str(tmp_path)})) as conn:
        ahead = Ahead(conn)

        def walk() -> None:
            for text in texts:
                ahead.offer(sha256_text(text), text.encode())
            ahead.finish()
            ahead.wait()
            assert conn.early is None and ahead.waiting is not None  # the hello takes 1 s

        with conn.handshake():
            walk()
        ahead.send_waiting()
        assert ahead.waiting is None and ahead.sent_bytes == 101 * sent
        conn.channel.send({"type": "status"})
        deadline = time.monotonic() + 30
        while '"status"' not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.01)
    received = [json.loads(line) for line in log.read_text().splitlines()]
    kinds = [kind for kind, _ in received]
    assert kinds[:kinds.index("status") + 1] == ["hello"] + ["bodies"] * bool(sent) + ["status"]
    assert [sha for _, shas in received for sha in shas] == [sha256_text(t) for t in texts[:sent]]


def placed(message: dict, places: dict[str, int]) -> dict:
    """The manifest with each body sent ahead named by its place, as a version 3 sync sends it."""
    return {**message, "files": [[p, places.get(sha, sha), size, mtime]
                                 for p, sha, size, mtime in message["files"]]}


def test_version_3_numbers_the_bodies_sent_ahead_in_the_order_they_go(tmp_path: Path) -> None:
    with Connection(local_config(tmp_path, tmp_path / "store.sqlite3"), max_version=3) as conn:
        ahead = hello_offering(conn, TEXTS + TEXTS[:3])  # one offered again goes once
        assert ahead.places == {sha256_text(t): i for i, t in enumerate(TEXTS)}
        conn.channel.send(placed(manifest(TEXTS), ahead.places))
        assert conn.channel.expect("result")["accepted"] == len(TEXTS)


LATE_SERVE = ("import os, sys, time\ntime.sleep(1)\n"
              "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n")


def test_bodies_that_waited_for_the_hello_are_numbered_when_they_go(tmp_path: Path,
                                                                      sshd) -> None:
    script, store = tmp_path / "late.py", tmp_path / "store.sqlite3"
    script.write_text(LATE_SERVE)
    path = write_config(tmp_path / "client.json", "laptop", sshd.transport(
        pinned=False, remote_command=[sys.executable, str(script), str(LAUNCHER), "serve",
                                      "--store", str(store)]), [], tmp_path / "cache")
    with Connection(config_mod.load(path, {"HOME": str(tmp_path)})) as conn:
        ahead = Ahead(conn)
        with conn.handshake():
            for text in TEXTS:
                ahead.offer(sha256_text(text), text.encode())
            ahead.finish()
            ahead.wait()
            assert conn.early is None and ahead.places == {}  # the server starts in 1 s
        ahead.send_waiting()
        assert conn.version == 3
        assert ahead.places == {sha256_text(t): i for i, t in enumerate(TEXTS)}
        conn.channel.send(placed(manifest(TEXTS), ahead.places))
        assert conn.channel.expect("result")["accepted"] == len(TEXTS)


V3_RECORDER = r'''
import json, sys, time
log, delay = open(sys.argv[1], "w"), float(sys.argv[2])
hello = {"type": "hello", "version": 3, "versions": [3], "server": "recorder",
         "ahead_bytes": 100000}
source = sys.stdin.buffer
while line := source.readline():
    m = json.loads(line)
    if "sizes" in m:  # the texts follow the line
        data, texts = source.read(sum(m["sizes"])), []
        for size in m["sizes"]:
            texts.append(data[:size].decode("utf-8"))
            data = data[size:]
        log.write(json.dumps(["raw", texts]) + "\n")
    else:
        log.write(json.dumps([m["type"], m.get("bodies", [])]) + "\n")
    log.flush()
    if m["type"] == "hello":
        time.sleep(delay)
        sys.stdout.write(json.dumps(hello) + "\n"); sys.stdout.flush()
'''


@pytest.mark.parametrize("delay", [0, 1])
def test_bodies_go_raw_to_a_version_3_server(tmp_path: Path, sshd, delay: float) -> None:
    # With a delay the walk ends before the hello comes: what it encoded then is sent once the
    # hello says version 3. Texts a JSON line would escape go raw as they are.
    script, log = tmp_path / "recorder.py", tmp_path / "log.jsonl"
    script.write_text(V3_RECORDER)
    path = write_config(tmp_path / "client.json", "laptop", sshd.transport(
        pinned=False, remote_command=[sys.executable, str(script), str(log), str(delay)]), [],
        tmp_path / "cache")
    texts = ['"quoted" {json}\n\\ back', "d\u00e9j\u00e0 \u65e5\u672c", "", "plain"]
    with Connection(config_mod.load(path, {"HOME": str(tmp_path)})) as conn:
        ahead = Ahead(conn)
        with conn.handshake():
            if not delay:
                wait_for_hello(conn)
            for text in texts:
                ahead.offer(sha256_text(text), text.encode())
            ahead.finish()
            ahead.wait()
        ahead.send_waiting()
        assert ahead.sent_bytes == sum(len(t.encode()) for t in texts)
        conn.channel.send({"type": "status"})
        deadline = time.monotonic() + 30
        while '"status"' not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.01)
    received = [json.loads(line) for line in log.read_text().splitlines()]
    assert received[:3] == [["hello", []], ["raw", texts], ["status", []]]


DIES_AT_ONCE = ("import sys\nsys.stdin.buffer.readline()\nsys.stderr.write('serve: killed\\n')\n"
                "sys.exit(1)\n")


def test_a_server_end_that_dies_as_bodies_go_ahead_fails_the_sync_with_one_line(
        tmp_path: Path) -> None:
    """The bodies go before the hello (expected of a server over ssh to another machine): the
    sender's write finds the server end gone, and only the sync says so, once, no traceback.

    The server end is a stand-in `ssh` on PATH that takes the hello and dies at once.
    """
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "ssh").write_text(f"#!{sys.executable}\n{DIES_AT_ONCE}")
    (folder / "ssh").chmod(0o755)
    notes = tmp_path / "notes"
    notes.mkdir()
    for i in range(40):
        (notes / f"n{i}.md").write_text(f"# note {i}\n" + "words and words\n" * 2000)
    transport = {"kind": "ssh", "host": "me@memory.example.net", "remote_command": ["serve"]}
    path = write_config(tmp_path / "c" / "client.json", "laptop", transport,
                        [{"name": "notes", "kind": "markdown", "path": str(notes)}],
                        tmp_path / "cache")
    env = {**os.environ, "HOME": str(tmp_path), "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}
    for _ in range(3):
        run = run_cli("sync", "--config", str(path), env=env)
        assert run.returncode == 2, run.stdout + run.stderr
        assert run.stderr == ("sync failed: the server end at ssh me@memory.example.net stopped: "
                              "serve: killed\n"), run.stderr


# --- tails: a file that only grew goes as its new tail (`Ahead.offer_tail`) ---------------------

TAILS_RECORDER = r'''
import json, sys, time
version, log, delay = int(sys.argv[1]), open(sys.argv[2], "w"), float(sys.argv[3])
hello = {"type": "hello", "version": version, "versions": [version], "server": "recorder",
         "ahead_bytes": 1 << 20}
for line in sys.stdin:
    m = json.loads(line)
    log.write(json.dumps([m["type"], m.get("bodies", m.get("tails", []))]) + "\n"); log.flush()
    if m["type"] == "hello":
        time.sleep(delay)
        sys.stdout.write(json.dumps(hello) + "\n"); sys.stdout.flush()
'''


@pytest.mark.parametrize("version", [3, 2])
@pytest.mark.parametrize("before_hello", [False, True])
def test_a_tail_goes_as_tails_to_version_3_and_whole_to_version_2(
        tmp_path: Path, sshd, version: int, before_hello: bool) -> None:
    script, log = tmp_path / "recorder.py", tmp_path / "log.jsonl"
    script.write_text(TAILS_RECORDER)
    path = write_config(tmp_path / "client.json", "laptop", sshd.transport(
        pinned=False, remote_command=[sys.executable, str(script), str(version), str(log),
                                      "1" if before_hello else "0"]), [], tmp_path / "cache")
    data = (LOG_BASE + LOG_TAIL).encode()
    with Connection(config_mod.load(path, {"HOME": str(tmp_path)})) as conn:
        ahead = Ahead(conn)

        def walk() -> None:
            if not before_hello:
                deadline = time.monotonic() + 30
                while conn.early is None and time.monotonic() < deadline:
                    time.sleep(0.01)
            ahead.offer_tail(sha256_text(LOG_BASE + LOG_TAIL), sha256_text(LOG_BASE), data, len(LOG_BASE))
            ahead.finish()
            ahead.wait()

        with conn.handshake():
            walk()
        ahead.send_waiting()
        assert ahead.sent_bytes == len(data)  # the whole size, as the server counts it
        conn.channel.send({"type": "status"})
        deadline = time.monotonic() + 30
        while '"status"' not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.01)
    received = [json.loads(line) for line in log.read_text().splitlines()]
    assert [kind for kind, _ in received][:3] == [
        "hello", "tails" if version == 3 else "bodies", "status"]
    assert received[1][1] == ([[sha256_text(LOG_BASE), LOG_TAIL]] if version == 3
                              else [[sha256_text(LOG_BASE + LOG_TAIL), LOG_BASE + LOG_TAIL]])


def test_tails_go_in_batches_while_the_walk_goes_on(tmp_path: Path, sshd) -> None:
    """Once the hello has come, every TAIL_BATCH tails go at once: the server joins them then."""
    script, log = tmp_path / "recorder.py", tmp_path / "log.jsonl"
    script.write_text(TAILS_RECORDER)
    path = write_config(tmp_path / "client.json", "laptop", sshd.transport(
        pinned=False, remote_command=[sys.executable, str(script), "3", str(log), "0"]),
        [], tmp_path / "cache")
    grown = [(LOG_BASE + f"- {i}: appended\n") for i in range(TAIL_BATCH + 3)]

    def logged() -> list:
        return [json.loads(line) for line in log.read_text().splitlines()]

    with Connection(config_mod.load(path, {"HOME": str(tmp_path)})) as conn:
        ahead = Ahead(conn)

        def walk() -> None:
            deadline = time.monotonic() + 30
            while conn.early is None and time.monotonic() < deadline:
                time.sleep(0.01)
            for text in grown:
                ahead.offer_tail(sha256_text(text), sha256_text(LOG_BASE), text.encode(), len(LOG_BASE))
            deadline = time.monotonic() + 30  # before `finish`: the walk is not over
            while len(logged()) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert [kind for kind, _ in logged()] == ["hello", "tails"]
            ahead.finish()
            ahead.wait()

        with conn.handshake():
            walk()
        conn.channel.send({"type": "status"})
        deadline = time.monotonic() + 30
        while '"status"' not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.01)
    received = logged()
    assert [kind for kind, _ in received][:4] == ["hello", "tails", "tails", "status"]
    assert [len(tails) for _, tails in received[1:3]] == [TAIL_BATCH, 3]
    assert [tail for _, batch in received[1:3] for _, tail in batch] == [
        text[len(LOG_BASE):] for text in grown]
