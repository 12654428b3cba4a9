"""The exchange that ends every session: notes delivered, the pull checked and applied.

Through the real client code against a real `serve` and store, a real sshd on loopback, and
stand-in servers that answer wrongly on purpose: the last part is a table of a hostile or broken
server's replies, one row each.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import (
    LAUNCHER,
    cache_files,
    config_for,
    local_config,
    make_memories,
    run_with_timeout,
    sync_json,
    write_config,
)

from sharedmem.cli.main import main
from sharedmem.client.exchange import Exchange
from sharedmem.client.outbox import Outbox
from sharedmem.client.transport import Connection
from sharedmem.hashing import sha256_text
from sharedmem.server.store import Store

NOTE = "2026-11-30T09-00-00-decision.md"


def test_notes_are_delivered_and_a_refused_one_is_kept_aside(tmp_path: Path) -> None:
    config = local_config(tmp_path, tmp_path / "store.sqlite3")
    outbox = Outbox(config.state / "outbox")
    outbox.put(NOTE, "we chose SQLite")
    # An empty note queued by hand (put refuses it): the server refuses it too.
    queued = outbox.put("2026-11-30T09-00-01-empty.md", "to be emptied")
    [(path, _)] = [(p, n) for p, n in outbox.pending() if n.note_id == queued.note_id]
    path.write_text(path.read_text().replace('"to be emptied"', '""'))
    exchange = Exchange(config)
    with Connection(config) as conn:
        conn.hello()
        exchange.deliver_now(conn)
    assert exchange.notes["delivered"] == 1
    assert [r["filename"] for r in exchange.notes["refused"]] == ["2026-11-30T09-00-01-empty.md"]
    assert outbox.pending() == []
    kept = sorted(p.name for p in (config.state / "refused-notes").iterdir())
    assert len(kept) == 2 and kept[1] == kept[0].removesuffix(".json") + ".reason"
    reason = json.loads((config.state / "refused-notes" / kept[1]).read_text())
    assert reason["filename"] == "2026-11-30T09-00-01-empty.md"
    assert reason["note_id"] == queued.note_id and reason["message"] and reason["refused_at"]
    assert reason["message"] == exchange.notes["refused"][0]["message"]
    assert "we chose SQLite" in (config.cache / "extensions/ad_hoc/notes" / NOTE).read_text()


HOSTILE_SERVER = r'''
import json, sys
def send(m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
evil = sys.argv[1]
for line in sys.stdin:
    m = json.loads(line)
    t = m["type"]
    if t == "hello":
        send({"type": "hello", "version": 2, "versions": [2]})
    elif t == "manifest":
        send({"type": "result", "source": m["source"], "unchanged": True, "digest": m["digest"],
              "generation": 1, "refused": [], "redacted": {}})
    elif t == "pull" and evil == "no-text":
        send({"type": "namespaces", "namespaces": [], "full": [], "removed": []})
        send({"type": "files", "files": [["machines/evil/notes/x.md", "ab" * 32, None]]})
        send({"type": "end"})
    elif t == "pull":
        send({"type": "namespaces", "namespaces": [{"key": "machines/evil/notes", "machine": "evil",
              "source": "notes", "kind": "markdown", "generation": 1}], "full": [],
              "removed": [evil]})
        import hashlib
        body = "pwned"
        sha = hashlib.sha256(body.encode()).hexdigest()
        send({"type": "files", "files": [["machines/evil/notes/fine.md", sha, body], [evil, sha, body]]})
        send({"type": "end"})
    elif t == "bye":
        break
'''


@pytest.mark.parametrize("evil", [
    "../../outside.md", "/tmp/absolute-evil.md", "machines/evil/notes/../../../../outside.md",
    "machines/evil/notes/.hidden.md", "extensions/ad_hoc/notes/../../x.md", "machines/evil/x\\..\\y.md",
    "machines/con/notes/x.md", "machines/evil/x./y.md",
])
def test_hostile_server_paths_are_skipped_and_the_rest_written(tmp_path, sshd, evil):
    script = tmp_path / "hostile.py"
    script.write_text(HOSTILE_SERVER)
    home = tmp_path / "h"
    make_memories(home, files=1)
    cfg = config_for(tmp_path, home, "laptop", sshd.transport(
        pinned=False, remote_command=[sys.executable, str(script), evil]))
    victim = tmp_path / "laptop" / "keep.md"
    victim.write_text("mine")
    code, report = sync_json(cfg)
    assert code == 1, report
    assert report["status"] == "partial"
    skipped = report["pull"]["skipped"]
    assert [s["path"] for s in skipped] == [evil, evil]  # the removal and the file
    assert {s["reason"] for s in skipped} == {"bad-path"}
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")
                     if p.is_file() and ("outside" in p.name or "evil" in str(p) or "pwned" in
                                         (p.read_text(errors="ignore") if p.suffix == ".md" else "")))
    assert written == ["laptop/cache/machines/evil/notes/fine.md"]  # only the good file
    assert victim.read_text() == "mine"


def test_a_server_that_leaves_out_a_body_the_client_lacks_is_refused(tmp_path, sshd):
    script = tmp_path / "hostile.py"
    script.write_text(HOSTILE_SERVER)
    home = tmp_path / "h"
    make_memories(home, files=1)
    cfg = config_for(tmp_path, home, "laptop", sshd.transport(
        pinned=False, remote_command=[sys.executable, str(script), "no-text"]))
    code, report = sync_json(cfg)
    assert code == 2
    assert "sent a malformed files message" in report["error"]
    assert "no text for 'machines/evil/notes/x.md'" in report["error"]
    assert not (tmp_path / "laptop" / "cache" / "machines").exists()


def test_a_cache_file_changed_by_hand_is_restored_by_the_next_sync(tmp_path):
    home = tmp_path / "h"
    make_memories(home, files=3)
    cfg = config_for(tmp_path, home, "laptop",
                     {"kind": "local", "store": str(tmp_path / "store.sqlite3")})
    assert sync_json(cfg)[0] == 0
    cache = tmp_path / "laptop" / "cache"
    before = cache_files(cache)
    edited = cache / "machines/laptop/notes/d1/note-001.md"
    edited.write_text("edited by hand, and longer than it was\n", encoding="utf-8")
    (cache / "machines/laptop/codex/MEMORY.md").unlink()
    code, report = sync_json(cfg)
    assert code == 0 and report["pull"]["written"] == 2
    assert cache_files(cache) == before


def test_a_first_sync_keeps_its_own_files_and_takes_what_the_server_refused_from_it(tmp_path):
    home = tmp_path / "h"
    notes = make_memories(home, files=6)
    store = tmp_path / "store.sqlite3"
    cfg = config_for(tmp_path, home, "laptop", {"kind": "local", "store": str(store)})
    code, report = sync_json(cfg)
    assert code == 0
    cache = tmp_path / "laptop" / "cache"
    with Store.open(store) as s:
        assert cache_files(cache) == {p: t for p, _, t in s.export()}
    # A client whose limit is above the server's: the server refuses the big file, so the
    # namespace it holds is not the snapshot sent, and the cache must show the server's.
    home2 = tmp_path / "h2"
    make_memories(home2, files=2)
    (home2 / "notes" / "big.md").write_text("x" * (1024 * 1024 + 10), encoding="utf-8")
    cfg2 = config_for(tmp_path, home2, "desktop", {"kind": "local", "store": str(store)})
    raw = json.loads(cfg2.read_text())
    raw["limits"] = {"file_bytes": 2 * 1024 * 1024}
    cfg2.write_text(json.dumps(raw))
    code, report = sync_json(cfg2)
    assert code == 1 and report["sources"][1]["refused"][0]["reason"] == "too-large"
    cache2 = tmp_path / "desktop" / "cache"
    assert "machines/desktop/notes/big.md" not in cache_files(cache2)
    with Store.open(store) as s:
        assert cache_files(cache2) == {p: t for p, _, t in s.export()}
    assert notes.is_dir()


# --- a hostile or broken server: one row of a table per reply -------------------------------

# The server is a real subprocess speaking the real line protocol: a small script standing in for
# `ssh` on PATH, which answers each message the client sends with the lines its scenario scripts
# for that message type. A malformed reply ends the sync with one line naming the server and the
# message, exit 2, and the cache and the outbox byte for byte as they were; an item the client
# cannot write is skipped and named, exit 1, and everything else is written.

FAKE_SERVER = r'''
import glob, json, os, sys, time
scenario = json.loads(open(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                        "scenario.json")).read())
def send(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
seen = {}
for raw in sys.stdin:
    message = json.loads(raw)
    kind = message["type"]
    seen[kind] = seen.get(kind, 0) + 1  # "commit#2": the answer to the second commit only
    for line in scenario.get(f"{kind}#{seen[kind]}", scenario.get(kind, [])):
        if isinstance(line, dict):  # wait until the client made a file, or say it did not
            deadline = time.monotonic() + line["seconds"]
            while not glob.glob(line["wait"]) and time.monotonic() < deadline:
                time.sleep(0.01)
            if not glob.glob(line["wait"]):
                send(json.dumps({"type": "error", "code": "store",
                                 "message": "the client did not stage what it was sent"}))
            continue
        if line == "@exit":
            sys.exit(0)
        if line == "@crash":  # as a server that failed: its traceback on stderr, status 1
            sys.stderr.write("Traceback (most recent call last):\nRuntimeError: store broke\n")
            sys.exit(1)
        if line == "@sleep":
            time.sleep(60)
        send(line.replace("@NOTE_ID@", str(message.get("note_id"))))
    if message["type"] == "bye":
        break
'''

TEXT = "# from the desk machine\n"
NS_ROW = {"key": "machines/desk/notes", "machine": "desk", "source": "notes", "kind": "markdown",
          "generation": 2, "created_generation": 1, "synced_at": "2026-01-02T03:04:05Z",
          "files": 1, "bytes": len(TEXT), "digest": "x"}
NOTE_FILE = "2026-11-30T09-00-00-hostile.md"


def j(message: dict) -> str:
    """One protocol line (JSON escapes keep lone surrogates and controls intact on the wire)."""
    return json.dumps(message)


def ns(**changes: object) -> dict:
    return {**NS_ROW, **changes}


def head(rows: list | None = None, **extra: object) -> str:
    return j({"type": "namespaces", "namespaces": [NS_ROW] if rows is None else rows,
              "full": [], "removed": [], "skipped": [], **extra})


def files(*items: object) -> str:
    return j({"type": "files", "files": list(items)})


def item(path: str = "machines/desk/notes/a.md", text: str = TEXT) -> list:
    return [path, sha256_text(text), text]


END = j({"type": "end"})
HELLO = j({"type": "hello", "versions": [1, 2], "version": 2, "server": "fake/1",
           "machine": "laptop", "pinned": False})
RESULT = {"type": "result", "source": "notes", "unchanged": False, "generation": 3,
          "accepted": 1, "refused": [], "redacted": {}, "stored": {}, "digest": "d"}
NOTE_RESULT = {"type": "note_result", "note_id": "@NOTE_ID@", "status": "stored",
               "path": f"extensions/ad_hoc/notes/{NOTE_FILE}"}
GOOD = {"hello": [HELLO], "manifest": [j(RESULT)], "note": [j(NOTE_RESULT)],
        "pull": [head(), files(item()), END]}

# id -> (message type, what the server answers it, what the one line names). Each is a reply
# the client cannot use: the sync fails, exit 2, and nothing on this machine changes.
MALFORMED: dict[str, tuple[str, list, str]] = {
    "hello without version": ("hello", [j({"type": "hello", "server": "fake"})], "hello"),
    "hello version as text": ("hello", [j({"type": "hello", "version": "2"})], "hello"),
    "hello version true": ("hello", [j({"type": "hello", "version": True})], "hello"),
    "hello server not text": ("hello", [j({"type": "hello", "version": 2, "server": [1]})],
                              "hello"),
    "hello ahead_bytes text": ("hello", [j({"type": "hello", "version": 2,
                                            "ahead_bytes": "lots"})], "hello"),
    "result without generation": ("manifest", [j({k: v for k, v in RESULT.items()
                                                  if k != "generation"})], "result"),
    "result generation as text": ("manifest", [j({**RESULT, "generation": "3"})], "result"),
    "result unchanged missing": ("manifest", [j({k: v for k, v in RESULT.items()
                                                 if k != "unchanged"})], "result"),
    "result refused not a list": ("manifest", [j({**RESULT, "refused": "all"})], "result"),
    "result refused of numbers": ("manifest", [j({**RESULT, "refused": [1]})], "result"),
    "result refused without message": ("manifest", [j({**RESULT, "refused": [
        {"path": "a.md", "reason": "bad-path"}]})], "result"),
    "result redacted not counts": ("manifest", [j({**RESULT, "redacted": {"jwt": "many"}})],
                                   "result"),
    "result redacted a list": ("manifest", [j({**RESULT, "redacted": []})], "result"),
    "result digest a number": ("manifest", [j({**RESULT, "digest": 5})], "result"),
    "result of another source": ("manifest", [j({**RESULT, "source": "other"})], "result"),
    "need of numbers": ("manifest", [j({"type": "need", "source": "notes", "sha256": [1]})],
                        "need"),
    "need without sha256": ("manifest", [j({"type": "need", "source": "notes"})], "need"),
    "need a string": ("manifest", [j({"type": "need", "source": "notes", "sha256": "ab"})],
                      "need"),
    "need of more bodies than the manifest lists": (
        "manifest", [j({"type": "need", "source": "notes", "sha256": ["ab" * 32] * 2})], "need"),
    "note_result of another note": ("note", [j({**NOTE_RESULT, "note_id": "someone-else"})],
                                    "note_result"),
    "note_result status unknown": ("note", [j({**NOTE_RESULT, "status": "maybe"})],
                                   "note_result"),
    "note_result message a number": ("note", [j({**NOTE_RESULT, "status": "refused",
                                                 "message": 5})], "note_result"),
    "note_result without path": ("note", [j({k: v for k, v in NOTE_RESULT.items()
                                            if k != "path"})], "note_result"),
    "namespaces an object": ("pull", [head(rows={}), END], "namespaces"),  # type: ignore[arg-type]
    "namespaces missing": ("pull", [j({"type": "namespaces"}), END], "namespaces"),
    "row without key": ("pull", [head([{k: v for k, v in NS_ROW.items() if k != "key"}]), END],
                        "namespaces"),
    "row generation text": ("pull", [head([ns(generation="2")]), END], "namespaces"),
    "row generation float": ("pull", [head([ns(generation=2.5)]), END], "namespaces"),
    "row generation null": ("pull", [head([ns(generation=None)]), END], "namespaces"),
    "row a list": ("pull", [head([list(NS_ROW.values())]), END], "namespaces"),
    "row machine a number": ("pull", [head([ns(machine=7)]), END], "namespaces"),
    "row synced_at an object": ("pull", [head([ns(synced_at={})]), END], "namespaces"),
    "full a string": ("pull", [head(full="machines/desk/notes"), END], "namespaces"),
    "removed with a number": ("pull", [head(removed=["a.md", 1]), END], "namespaces"),
    "removed a string": ("pull", [head(removed="machines/desk/notes/a.md"), END], "namespaces"),
    "skipped with null": ("pull", [head(skipped=[None]), END], "namespaces"),
    "files a string": ("pull", [head(), j({"type": "files", "files": "a.md"}), END], "files"),
    "files missing": ("pull", [head(), j({"type": "files"}), END], "files"),
    "file of two": ("pull", [head(), files(item()[:2]), END], "files"),
    "file of four": ("pull", [head(), files([*item(), 0]), END], "files"),
    "file an object": ("pull", [head(), files({"path": "a.md"}), END], "files"),
    "file path a number": ("pull", [head(), files([5, "ab" * 32, TEXT]), END], "files"),
    "file sha null": ("pull", [head(), files(["machines/desk/notes/a.md", None, TEXT]), END],
                      "files"),
    "file text a number": ("pull", [head(), files(["machines/desk/notes/a.md", "ab" * 32, 5]),
                                    END], "files"),
    "file without text or body": ("pull", [head(), files(["machines/desk/notes/b.md", "ab" * 32,
                                                          None]), END], "files"),
    "good batch, then a bad one": ("pull", [head(), files(item("machines/desk/notes/b.md")),
                                            files(item("machines/desk/notes/c.md"), 7), END],
                                   "files"),
}

# id -> (message type, answer, what stderr's one line must hold): the server fails in ways
# the protocol already knows; still one line, exit 2, nothing changed.
BROKEN: dict[str, tuple[str, list, str]] = {
    "not JSON": ("pull", ["{nope"], "not one UTF-8 JSON object"),
    "JSON but not an object": ("pull", ["[]"], "not a JSON object with a string 'type'"),
    "type not a string": ("pull", [j({"type": 5})], "not a JSON object with a string 'type'"),
    "the wrong message": ("pull", [END], "expected namespaces"),
    "gone before the end": ("pull", [head(), files(item("machines/desk/notes/b.md")), "@exit"],
                            "ended the session while this side waited for files or end; the "
                            "server end at "),
    "crashed before the end": ("pull", [head(), "@crash"], "ended the session while this side "
                               "waited for files or end; the server end at "),
    "crashed, what it said": ("pull", [head(), "@crash"], "stopped: RuntimeError: store broke"),
    "an error of a megabyte": ("pull", [j({"type": "error", "code": "store",
                                           "message": "x" * 1_000_000})],
                               "x" * 2000 + "... (1000000 characters)"),
    "an error with escapes": ("pull", [j({"type": "error", "code": "store", "message":
                                          "\x1b[2J\x1b]0;owned\x07boom\r\nsync ok\x9b31m\ud800"})],
                              "\\x1b[2J\\x1b]0;owned\\x07boom\\r\\nsync ok\\u009b31m\\ud800"),
}

# id -> (the pull's lines, each item skipped and why): the client cannot write these (issue
# 14: the server took such names, and one stopped every client's pull). It names each, exits
# 1 and writes everything else.
SKIPPED: dict[str, tuple[list, list[tuple[str, str]]]] = {
    "reserved machine name": ([head([NS_ROW, ns(key="machines/con/notes", machine="con")]),
                               files(item(), item("machines/con/notes/x.md")), END],
                              [("machines/con/notes/x.md", "bad-path"),
                               ("machines/con/notes", "bad-namespace")]),
    "reserved source name": ([head([NS_ROW, ns(key="machines/desk/aux.x", source="aux.x")]), END],
                             [("machines/desk/aux.x", "bad-namespace")]),
    # Every path of the message keeps the path rule, so the layout is checked a namespace at
    # a time: each file of a namespace it refuses is still refused.
    "invalid machine in a plain message": (
        [head(), files(item(), item("machines/-bad/notes/x.md"), item("machines/-bad/notes/y.md")),
         END], [("machines/-bad/notes/x.md", "bad-path"), ("machines/-bad/notes/y.md", "bad-path")]),
    "trailing dot": ([head(), files(item(), item("machines/desk/notes/x./y.md")), END],
                     [("machines/desk/notes/x./y.md", "bad-path")]),
    "escapes in a path": ([head(), files(item(), item("machines/desk/notes/\x1b[2Jx.md")), END],
                          [("machines/desk/notes/\x1b[2Jx.md", "bad-path")]),
    "outside the cache": ([head(), files(item(), item("../../outside.md")), END],
                          [("../../outside.md", "bad-path")]),
    "over the file limit": ([head(), files(item(), item("machines/desk/notes/big.md",
                                                        "x" * 5000)), END],
                            [("machines/desk/notes/big.md", "too-large")]),
    "text not its sha256": ([head(), files(item(), ["machines/desk/notes/x.md", "ab" * 32,
                                                    "lie"]), END],
                            [("machines/desk/notes/x.md", "sha256-mismatch")]),
    "removal outside the cache": ([head(removed=["../../victim.md"]), files(item()), END],
                                  [("../../victim.md", "bad-path")]),
    # The cache holds a.md at that sha256 already: the lie is named, the true copy stays.
    "a lie about a file the cache holds": (
        [head(), files(["machines/desk/notes/a.md", sha256_text(TEXT), "lie"]), END],
        [("machines/desk/notes/a.md", "sha256-mismatch")]),
}


def snapshot(*roots: Path) -> dict[str, bytes | None]:
    """Every file's bytes (None for a folder) under each root, so a test sees any change."""
    out: dict[str, bytes | None] = {}
    for root in roots:
        for path in sorted(root.rglob("*")) if root.exists() else []:
            out[str(path)] = None if path.is_dir() else path.read_bytes()
    return out


class Client:
    """One machine whose `ssh` is the fake server, after one good sync and with a note queued."""

    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bin = tmp / "bin"
        self.bin.mkdir()
        script = self.bin / "ssh"
        script.write_text(f"#!{sys.executable}\n{FAKE_SERVER}")
        script.chmod(0o755)
        monkeypatch.setenv("PATH", f"{self.bin}{os.pathsep}{os.environ['PATH']}")
        source = tmp / "notes"
        source.mkdir()
        (source / "mine.md").write_text("# mine\n", encoding="utf-8")
        self.config = write_config(tmp / "laptop" / "client.json", "laptop", {
            "kind": "ssh", "host": "server.invalid", "remote_command": ["serve"]},
            [{"name": "notes", "kind": "markdown", "path": str(source)}], tmp / "laptop" / "cache")
        raw = json.loads(self.config.read_text())
        raw["limits"] = {"file_bytes": 4096}
        raw["compress"] = "off"  # the fake server reads plain lines of text
        self.config.write_text(json.dumps(raw))
        self.cache = tmp / "laptop" / "cache"
        self.outbox = tmp / "laptop" / "state" / "outbox"

    def serve(self, scenario: dict[str, list]) -> None:
        (self.bin / "scenario.json").write_text(json.dumps(scenario))

    def sync(self, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
        """The real command line, in this process (a traceback would fail the test).

        Bounded in time: a client that waited for a reply the server never sends would hang.
        """
        capsys.readouterr()
        code = run_with_timeout(lambda: main(["sync", "--config", str(self.config), *extra]), 60)
        out, err = capsys.readouterr()
        return code, out, err


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
           capsys: pytest.CaptureFixture[str]) -> Client:
    machine = Client(tmp_path, monkeypatch)
    machine.serve(GOOD)
    code, out, err = machine.sync(capsys)
    assert code == 0, (out, err)
    assert (machine.cache / "machines/desk/notes/a.md").read_text() == TEXT
    Outbox(machine.outbox).put(NOTE_FILE, "a note that must wait for a good sync")
    return machine


def assert_failed_cleanly(client: Client, capsys: pytest.CaptureFixture[str],
                          needle: str) -> str:
    """Exit 2 with one line naming the cause; the cache and the outbox exactly as they were."""
    before = snapshot(client.cache, client.outbox)
    code, _, err = client.sync(capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("sync failed: ") and "Traceback" not in err
    assert needle in err, err
    assert "\x1b" not in err and "\x9b" not in err and "\r" not in err
    assert snapshot(client.cache, client.outbox) == before
    return err


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_reply_fails_the_sync_and_changes_nothing(
        client: Client, capsys: pytest.CaptureFixture[str], case: str) -> None:
    kind, lines, message = MALFORMED[case]
    client.serve({**GOOD, kind: lines})
    err = assert_failed_cleanly(client, capsys,
                                f"the server (ssh server.invalid) sent a malformed {message} "
                                "message")
    assert "The cache was left as it was" in err


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_server_fails_the_sync_in_one_clean_line(
        client: Client, capsys: pytest.CaptureFixture[str], case: str) -> None:
    kind, lines, needle = BROKEN[case]
    client.serve({**GOOD, kind: lines})
    assert_failed_cleanly(client, capsys, needle)


@pytest.mark.parametrize("case", sorted(SKIPPED))
def test_what_the_client_cannot_write_is_skipped_and_the_rest_written(
        client: Client, capsys: pytest.CaptureFixture[str], case: str) -> None:
    lines, skipped = SKIPPED[case]
    good = item("machines/desk/notes/b.md", "# also from the desk\n")
    client.serve({**GOOD, "pull": [*lines[:-1], files(good), END]})
    outside = snapshot(client.cache.parent.parent / "notes")
    code, out, err = client.sync(capsys)
    assert code == 1, (out, err)
    assert err == ""
    assert "sync partial" in out and f"{len(skipped)} skipped" in out
    for path, _ in skipped:
        assert f"    not written {path.replace(chr(27), '[ESC]')}: ".replace(
            "[ESC]", "\\x1b") in out
    assert "\x1b" not in out
    assert (client.cache / "machines/desk/notes/a.md").read_text() == TEXT
    assert (client.cache / "machines/desk/notes/b.md").read_text() == good[2]
    assert sorted(p.relative_to(client.cache).as_posix() for p in client.cache.rglob("*")
                  if ".sharedmem" not in p.parts and p.is_file()) == [
        "machines/desk/notes/a.md", "machines/desk/notes/b.md"]
    assert not (client.cache / ".sharedmem" / "staging").exists()
    assert Outbox(client.outbox).pending() == []  # the note was delivered: the sync went on
    assert snapshot(client.cache.parent.parent / "notes") == outside
    code, out, _ = client.sync(capsys, "--json")
    report = json.loads(out)
    assert code == 1 and report["status"] == "partial" and report["exit_code"] == 1
    assert [(s["path"], s["reason"]) for s in report["pull"]["skipped"]] == skipped
    assert report["pull"]["skipped_total"] == len(skipped)


def test_pulled_texts_are_staged_as_each_message_arrives(
        client: Client, capsys: pytest.CaptureFixture[str]) -> None:
    # The server waits, after its first files message, until that text is on the client's disk:
    # the pull does not hold every text until its end.
    staged = str(client.cache / ".sharedmem" / "staging" / "*.pull")
    client.serve({**GOOD, "pull": [head(), files(item("machines/desk/notes/b.md")),
                                   {"wait": staged, "seconds": 20},
                                   files(item("machines/desk/notes/c.md")), END]})
    code, out, err = client.sync(capsys)
    assert code == 0, (out, err)
    assert {p.name for p in (client.cache / "machines/desk/notes").iterdir()} == {
        "a.md", "b.md", "c.md"}
    assert not (client.cache / ".sharedmem" / "staging").exists()


def test_a_sync_killed_mid_pull_leaves_the_cache_as_its_manifest_says(
        client: Client, capsys: pytest.CaptureFixture[str]) -> None:
    staging = client.cache / ".sharedmem" / "staging"
    client.serve({**GOOD, "pull": [head(), files(item("machines/desk/notes/b.md")), "@sleep"]})
    before = snapshot(client.cache, client.outbox)
    proc = subprocess.Popen([sys.executable, str(LAUNCHER), "sync", "--config",
                             str(client.config)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not list(staging.glob("*.pull")) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert list(staging.glob("*.pull")), "the first files message was never staged"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the client and its fake server
        proc.wait()
    after = snapshot(client.cache, client.outbox)
    assert {k: v for k, v in after.items() if not k.startswith(str(staging))} == before
    client.serve(GOOD)  # the next sync clears what the killed one staged
    code, out, err = client.sync(capsys)
    assert code == 0, (out, err)
    assert not staging.exists() and not (client.cache / "machines/desk/notes/b.md").exists()


@pytest.mark.parametrize("link", [".sharedmem", ".sharedmem/staging"])
def test_a_linked_metadata_folder_stops_the_sync_before_it_touches_anything(
        client: Client, capsys: pytest.CaptureFixture[str], tmp_path: Path, link: str) -> None:
    victim = tmp_path / "victim"
    for name in ("staging", "replaced"):
        (victim / name).mkdir(parents=True)
        (victim / name / "0.md").write_text("not the cache's")
    (victim / "manifest.next.part").write_text("nor this")
    if link == ".sharedmem":
        (client.cache / ".sharedmem").rename(tmp_path / "meta-moved")
    (client.cache / link).symlink_to(victim, target_is_directory=True)
    before = snapshot(victim, client.cache, client.outbox)
    err = assert_failed_cleanly(client, capsys, f"{client.cache / link} is a link or not a "
                                                "folder")
    assert f"rm {client.cache / link}" in err
    assert snapshot(victim, client.cache, client.outbox) == before


def test_status_shows_what_the_server_sent_escaped(
        client: Client, capsys: pytest.CaptureFixture[str]) -> None:
    odd = "\x1b]0;owned\x07\x9b2J\ud800"
    client.serve({**GOOD, "pull": [head([ns(synced_at=odd, kind=odd)]), END]})
    assert client.sync(capsys)[0] == 0
    client.serve({**GOOD, "pull": [j({"type": "error", "code": "store", "message": odd})]})
    assert client.sync(capsys)[0] == 2
    for extra, escaped, times in (([], "\\x1b]0;owned\\x07\\u009b2J\\ud800", 2),
                                  (["--json"], "\\u001b]0;owned\\u0007\\u009b2J\\ud800", 3)):
        capsys.readouterr()
        assert run_with_timeout(lambda extra=extra: main(
            ["status", "--config", str(client.config), *extra]), 60) == 0
        out, err = capsys.readouterr()
        assert not any(c in out + err for c in "\x1b\x07\x9b\ud800"), out
        assert out.count(escaped) == times  # the error, the sync time (and in JSON the kind)
    assert json.loads(out)["last_attempt"]["error"] == odd  # JSON keeps the text as it was


HELLO_3 = j({"type": "hello", "versions": [1, 2, 3], "version": 3, "server": "fake/3",
             "machine": "laptop", "pinned": False})


@pytest.mark.parametrize("index", [[0] * 300_000, [0, 0]], ids=["300,000 times", "twice"])
def test_a_version_3_need_past_the_manifest_is_refused(
        client: Client, capsys: pytest.CaptureFixture[str], index: list[int]) -> None:
    # A need past the manifest would cost a copy of the text for each mention.
    client.serve({**GOOD, "hello": [HELLO_3],
                  "manifest": [j({"type": "need", "source": "notes", "index": index})]})
    assert_failed_cleanly(client, capsys, "the server (ssh server.invalid) sent a malformed need "
                          "message: for source 'notes' it asks for")


def test_a_version_2_need_that_repeats_a_body_is_sent_it_once(
        client: Client, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # A hostile server asking for the same body again and again got it each time (GBs).
    (tmp_path / "notes" / "mine.md").write_text("# mine, changed\n", encoding="utf-8")
    (tmp_path / "notes" / "other.md").write_text("# another\n", encoding="utf-8")
    log = client.bin / "received.log"
    sha = sha256_text("# mine, changed\n")
    client.serve({**GOOD, "manifest": [j({"type": "need", "source": "notes",
                                          "sha256": [sha, sha]})],
                  "bodies": [], "commit": [j(RESULT)]})
    (client.bin / "ssh").write_text((client.bin / "ssh").read_text().replace(
        "    message = json.loads(raw)\n",
        f"    message = json.loads(raw)\n    open({str(log)!r}, 'a').write(raw)\n"))
    code, out, err = client.sync(capsys)
    assert code == 0, (out, err)
    sent = [json.loads(line) for line in log.read_text().splitlines()]
    bodies = [b for m in sent if m["type"] == "bodies" for b in m["bodies"]]
    assert bodies == [[sha, "# mine, changed\n"]]


def test_a_version_2_commit_on_a_forgotten_base_is_sent_again_whole(
        client: Client, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # The namespace was forgotten between the manifest and the commit: the server answers the
    # commit `stale-base`, and the sync sends the whole manifest once, instead of failing.
    (tmp_path / "notes" / "mine.md").write_text("# mine, changed\n", encoding="utf-8")
    log = client.bin / "received.log"
    sha = sha256_text("# mine, changed\n")
    stale = j({"type": "error", "code": "stale-base", "message": "send the whole manifest"})
    client.serve({**GOOD, "manifest": [j({"type": "need", "source": "notes", "sha256": [sha]})],
                  "bodies": [], "commit#1": [stale], "commit": [j(RESULT)]})
    (client.bin / "ssh").write_text((client.bin / "ssh").read_text().replace(
        "    message = json.loads(raw)\n",
        f"    message = json.loads(raw)\n    open({str(log)!r}, 'a').write(raw)\n"))
    code, out, err = client.sync(capsys, "--json")
    assert code == 0, (out, err)
    sent = [json.loads(line) for line in log.read_text().splitlines()]
    manifests = [m for m in sent if m["type"] == "manifest"]
    assert len(manifests) == 2 and "base" not in manifests[1] and manifests[1]["files"]
    assert [m["type"] for m in sent].count("commit") == 2
    assert json.loads(out)["sources"][0]["status"] == "published"



def raw_files(*items: list, sizes: list | None = None) -> str:
    """A version 3 `files` line, its texts raw after it (the fake server adds the last `\n`)."""
    texts = "".join(text for _, _, text in items if text is not None)
    line = j({"type": "files", "files": [[path, sha] for path, sha, _ in items],
              "sizes": sizes if sizes is not None else [
                  None if text is None else len(text.encode()) for _, _, text in items]})
    return line + "\n" + texts[:-1] if texts else line


def test_a_version_3_pull_takes_each_text_raw_after_its_files_line(
        client: Client, capsys: pytest.CaptureFixture[str]) -> None:
    changed = "# from the desk machine, changed\n\n\"quoted\" {json} \\ déjà\n"
    client.serve({**GOOD, "hello": [HELLO_3], "pull": [
        head([ns(generation=3)]), raw_files(item(text=changed), item("machines/desk/notes/b.md")),
        END]})
    code, _, err = client.sync(capsys)
    assert code == 0, err
    assert (client.cache / "machines/desk/notes/a.md").read_text(encoding="utf-8") == changed
    assert (client.cache / "machines/desk/notes/b.md").read_text(encoding="utf-8") == TEXT


@pytest.mark.parametrize(("pull", "needle"), [
    ([head(), files(item()), END], "carries its texts raw after its line"),
    ([head(), raw_files(item(), sizes=[-1]), END], "files.sizes must be a list"),
    ([head(), raw_files(item(), sizes=[1, 2]), END], "each file must be [path, sha256]"),
    ([head(), raw_files(item(), sizes=[None]), END], "it sent no text for"),
], ids=["texts in the JSON", "a negative size", "a size too many", "a null size, no text"])
def test_a_version_3_files_message_not_as_version_3_sends_it_is_refused(
        client: Client, capsys: pytest.CaptureFixture[str], pull: list, needle: str) -> None:
    client.serve({**GOOD, "hello": [HELLO_3], "pull": pull})
    assert_failed_cleanly(client, capsys, needle)
