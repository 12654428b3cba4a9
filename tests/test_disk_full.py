"""Tests for sharedmem.server.disk_full: a write that finds no room is answered `disk-full`.

The disk fills for real in two ways. A tmpfs of a few MiB mounted for the test (ENOSPC on the
store, its -wal and -shm, and the backups folder) drives a real `serve`, and the real `sync`
client, at each step that writes: opening the store, a namespace's commit, bodies stored as
they come, a note, the backup before a migration, the clean-up and checkpoint at the end.
Mounting needs root on Linux; elsewhere those cases are skipped, saying so. SQLite's own limit
on a store's size (`PRAGMA max_page_count`, SQLITE_FULL on a real file) drives `Store` at the
same steps everywhere; the store is unchanged after each.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import LAUNCHER, enc, exported, files, old_store, run_cli, write_config

from sharedmem.client.outbox import Outbox
from sharedmem.hashing import digest_of, sha256_text
from sharedmem.server.disk_full import DiskFull
from sharedmem.server.ingest import ingest
from sharedmem.server.schema import SCHEMA_VERSION
from sharedmem.server.store import Store

HELLO = {"type": "hello", "versions": [1, 2], "machine": "laptop"}
DISK_NOTE = "2026-11-30T09-00-00-disk.md"
DISK_BYTES = 16 << 20  # twice what a session stores here: the log, then its copy


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of DISK_BYTES mounted for this test: a disk that really fills up."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if sys.platform != "linux" or os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root on Linux (mount -t tmpfs); the store-level "
                    "cases (SQLite's page limit) cover the same steps here")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs",
                           str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}): the store-level cases "
                    "(SQLite's page limit) cover the same steps")
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill(disk: Path, leave: int = 0) -> Path:
    """Take all but about `leave` bytes of the disk with one file; returns that file."""
    filler = disk / "filler"
    room = shutil.disk_usage(disk).free - leave
    with open(filler, "ab", buffering=0) as handle:
        try:
            while room > 0:
                room -= handle.write(b"\0" * min(room, 1 << 20))
            while leave == 0:  # to the last byte
                handle.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def texts(count: int, size: int, tag: str = "f") -> list[tuple[str, str]]:
    return [(f"{tag}{i:04d}.md", f"# {tag} {i}\n" + f"line {i} of {tag}\n" * (size // 16))
            for i in range(count)]


def manifest(pairs: list[tuple[str, str]]) -> list[dict]:
    entries = [[p, sha256_text(t), len(t.encode()), 0] for p, t in pairs]
    return [{"type": "manifest", "source": "notes", "kind": "markdown",
             "digest": digest_of((e[0], e[1]) for e in entries), "files": entries},
            {"type": "bodies", "source": "notes", "bodies": [[sha256_text(t), t] for _, t in pairs]},
            {"type": "commit", "source": "notes"}]


class Serve:
    """A real `serve` on a store, spoken to a message at a time."""

    def __init__(self, store: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, str(LAUNCHER), "serve", "--store", str(store)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)

    def send(self, *messages: dict) -> None:
        assert self.proc.stdin is not None
        try:
            for message in messages:
                self.proc.stdin.write(enc(message))
            self.proc.stdin.flush()
        except BrokenPipeError:  # it ended: its answer says why
            pass

    def read(self) -> dict:
        assert self.proc.stdout is not None
        return json.loads(self.proc.stdout.readline())

    def end(self) -> tuple[int, list[dict], str]:
        """Close its input; its exit status, what else it wrote, and its stderr."""
        assert self.proc.stdin and self.proc.stdout and self.proc.stderr
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        out, err = self.proc.stdout.read(), self.proc.stderr.read()  # it writes little there
        code = self.proc.wait(timeout=60)
        return code, [json.loads(line) for line in out.splitlines()], err.decode()


def content(store: Path) -> dict:
    """What the store holds, for before and after: published files, namespaces, notes, bodies."""
    with Store.open(store) as st:
        assert st.verify() == []
        return {"files": exported(st), "namespaces": st.namespaces().to_rows(),
                "notes": st.note_generation(), "bodies": st.counts()["blobs"],
                "schema": st.schema_version()}


def publish(store: Path, pairs: list[tuple[str, str]]) -> dict:
    """One session that publishes `pairs` as the namespace `notes`; its result."""
    serve = Serve(store)
    first, *rest = manifest(pairs)
    serve.send(HELLO, first)
    assert serve.read()["type"] == "hello"
    reply = serve.read()
    if reply["type"] == "need":
        serve.send(*rest)
        reply = serve.read()
    serve.send({"type": "bye"})
    code, _, err = serve.end()
    assert code == 0 and reply["type"] == "result", (reply, err)
    return reply


# Each case: what to write before the disk fills (leaving `leave` bytes), then the step that
# finds it full. Every step answers `disk-full`, naming the store (or backups) folder to free.

def open_the_store(serve: Serve, disk: Path) -> dict:
    fill(disk, 0)  # no room for its -shm index
    serve.send(HELLO)
    return serve.read()


def commit_a_namespace(serve: Serve, disk: Path) -> dict:
    serve.send(HELLO)
    assert serve.read()["type"] == "hello"
    fill(disk, 64 << 10)  # 40 files of 4 KiB are stored by the namespace's commit (ingest)
    first, *rest = manifest(texts(40, 4096))
    serve.send(first)
    assert serve.read()["type"] == "need"
    serve.send(*rest)
    return serve.read()


def store_bodies_as_they_come(serve: Serve, disk: Path) -> dict:
    serve.send(HELLO)
    assert serve.read()["type"] == "hello"
    fill(disk, 1 << 20)  # 5 MiB ahead: stored once 1 MiB has come (put_blobs)
    for i in range(5):
        serve.send({"type": "bodies", "bodies": [[sha256_text(t), t]
                                                  for _, t in texts(64, 16 << 10, f"b{i}-")]})
    serve.send({"type": "status"})
    return serve.read()


def append_a_note(serve: Serve, disk: Path) -> dict:
    serve.send(HELLO)
    assert serve.read()["type"] == "hello"
    fill(disk, 0)
    serve.send({"type": "note", "note_id": "note-0001", "filename": DISK_NOTE, "text": "full disk"})
    return serve.read()


STEPS: dict[str, tuple[Callable[[Serve, Path], dict], str]] = {
    "opening the store, its -wal and -shm": (open_the_store, "cannot be opened"),
    "a namespace's commit (ingest)": (commit_a_namespace, "nothing of this step was written"),
    "bodies stored as they come (put_blobs)": (store_bodies_as_they_come, "nothing of this step"),
    "a note": (append_a_note, "nothing of this step was written"),
}


@pytest.mark.parametrize("step", sorted(STEPS))
def test_serve_answers_disk_full_at_each_write_and_the_store_is_unchanged(
        disk: Path, step: str) -> None:
    store = disk / "store.sqlite3"
    publish(store, texts(3, 200, "kept"))
    before = content(store)
    action, says = STEPS[step]
    serve = Serve(store)
    reply = action(serve, disk)
    code, _, err = serve.end()
    assert reply["type"] == "error" and reply["code"] == "disk-full", reply
    assert f"free space on the server's disk holding {store}" in reply["message"]
    assert says in reply["message"]
    assert code == 1 and "Traceback" not in err and "disk" in err
    (disk / "filler").unlink()
    assert content(store) == before


def test_the_end_of_a_session_on_a_full_disk_leaves_its_bodies_to_the_next(disk: Path) -> None:
    # Bodies stored ahead and claimed; then the disk fills: releasing the claims at the end, and
    # copying the log into the store at close, find no room. Both are said on stderr; the
    # session's answers stand, the log keeps every commit, and the next session cleans up.
    store = disk / "store.sqlite3"
    publish(store, texts(3, 200, "kept"))
    before = content(store)
    serve = Serve(store)
    serve.send(HELLO)
    assert serve.read()["type"] == "hello"
    for i in range(5):
        serve.send({"type": "bodies", "bodies": [[sha256_text(t), t]
                                                  for _, t in texts(64, 16 << 10, f"a{i}-")]})
    serve.send({"type": "status"})
    assert serve.read()["type"] == "status"  # the bodies are stored by now
    fill(disk, 0)
    serve.send({"type": "bye"})
    code, replies, err = serve.end()
    assert code == 0 and replies == [] and "Traceback" not in err
    assert "could not release this session's bodies" in err and "is full" in err
    assert f"log {store}-wal was not copied into it" in err
    (disk / "filler").unlink()
    serve = Serve(store)  # the next session releases what the dead one claimed
    serve.send(HELLO, {"type": "bye"})
    assert serve.end()[0] == 0
    assert content(store) == before


def test_the_backup_before_a_migration_that_finds_no_room_migrates_nothing(disk: Path) -> None:
    store = old_store(disk / "store.sqlite3", 2)
    old = sqlite3.connect(store)
    rows = old.execute("SELECT * FROM files ORDER BY 1, 2").fetchall()
    old.close()
    fill(disk, 56 << 10)  # room for the -shm index, none for an 88 KiB copy
    serve = Serve(store)
    serve.send(HELLO)
    reply = serve.read()
    code, _, err = serve.end()
    assert reply["code"] == "disk-full", reply
    assert "was not migrated (schema 2): a verified backup comes first" in reply["message"]
    assert f"free space on the server's disk holding {disk / 'backups'}" in reply["message"]
    assert code == 1 and "Traceback" not in err
    (disk / "filler").unlink()
    assert list((disk / "backups").iterdir()) == []  # no archive, no part of one
    conn = sqlite3.connect(store)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 2
    assert conn.execute("SELECT * FROM files ORDER BY 1, 2").fetchall() == rows
    conn.close()
    assert content(store)["schema"] == SCHEMA_VERSION  # with room, the next open migrates


def test_a_sync_into_a_full_disk_says_so_and_keeps_the_cache_and_outbox(
        disk: Path, tmp_path: Path) -> None:
    source = tmp_path / "notes"
    source.mkdir()
    for name, text in texts(3, 200, "kept"):
        (source / name).write_text(text)
    store = disk / "store.sqlite3"
    config = write_config(tmp_path / "client" / "client.json", "laptop",
                          {"kind": "local", "store": str(store)},
                          [{"kind": "markdown", "name": "notes", "path": str(source)}],
                          tmp_path / "cache")
    env = {**os.environ, "HOME": str(tmp_path)}
    assert run_cli("sync", "--config", str(config), env=env).returncode == 0
    Outbox(tmp_path / "client" / "state" / "outbox").put(DISK_NOTE, "written while the disk was full")
    cache = {p.relative_to(tmp_path / "cache"): p.read_bytes()
             for p in (tmp_path / "cache").rglob("*") if p.is_file()}
    before = content(store)
    for name, text in texts(40, 4096, "new"):
        (source / name).write_text(text)
    fill(disk, 64 << 10)
    done = run_cli("sync", "--config", str(config), env=env)
    assert done.returncode == 2, done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("sync failed")]
    assert line.startswith(f"sync failed: the server's disk is full (the local store {store})")
    assert f"free space on the server's disk holding {store}, then try again" in line
    assert "Traceback" not in done.stderr
    assert {p.relative_to(tmp_path / "cache"): p.read_bytes()
            for p in (tmp_path / "cache").rglob("*") if p.is_file()} == cache
    assert len(Outbox(tmp_path / "client" / "state" / "outbox").pending()) == 1
    (disk / "filler").unlink()
    assert content(store) == before
    assert run_cli("sync", "--config", str(config), env=env).returncode == 0  # with room again
    assert Outbox(tmp_path / "client" / "state" / "outbox").pending() == []
    assert (tmp_path / "cache" / "machines/laptop/notes/new0039.md").is_file()


# --- everywhere: SQLite's page limit on the store's own connection ------------------------------

def limited(st: Store) -> None:
    """Let the store's file grow by no page: each write needing one fails as on a full disk."""
    pages = st.conn.execute("PRAGMA page_count").fetchone()[0]
    st.conn.execute(f"PRAGMA max_page_count={pages}")


BIG = "a long body\n" * 2000


def put_blobs(st: Store) -> None:
    st.put_blobs([(sha256_text(BIG), len(BIG), BIG.encode())])


def ingest_a_namespace(st: Store) -> None:
    ingest(st, "m1", "notes", "markdown", files({"big.md": BIG}))


def append_a_long_note(st: Store) -> None:
    st.append_note("m1", DISK_NOTE, BIG)


def finish_a_session(st: Store) -> None:
    st.finish()


STORE_STEPS = {"put_blobs": put_blobs, "ingest": ingest_a_namespace, "note": append_a_long_note,
               "finish": finish_a_session}


def held(st: Store) -> tuple[int, int]:
    """How many bodies sessions claim one by one, and how many runs of them they claim."""
    return st.conn.execute("SELECT (SELECT count(*) FROM claims), "
                           "(SELECT count(*) FROM stored_ahead)").fetchone()


@pytest.mark.parametrize("step", sorted(STORE_STEPS))
def test_each_store_write_that_finds_no_room_raises_disk_full_and_changes_nothing(
        tmp_path: Path, step: str) -> None:
    path = tmp_path / "store.sqlite3"
    with Store.open(path) as st:
        ingest(st, "m1", "kept", "markdown", files({"a.md": "A", "b.md": "B"}))
        st.put_blobs([(sha256_text(t), len(t), t.encode())
                      for t in (f"claimed {i} " + "x" * 300 for i in range(2000))])
        before = {"files": exported(st), "counts": st.counts(),
                  "claims": held(st)}
        limited(st)
        with pytest.raises(DiskFull) as exc:
            STORE_STEPS[step](st)
        assert f"store {path}: the disk holding {path} is full" in str(exc.value)
        assert f"free space on the server's disk holding {path}, then try again" in str(exc.value)
        assert not st.conn.in_transaction
        assert {"files": exported(st), "counts": st.counts(),
                "claims": held(st)} == before
        assert st.verify() == []
