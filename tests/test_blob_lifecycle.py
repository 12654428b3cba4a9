"""Bodies and tombstones over their life, with real `serve` processes on one real store.

Sessions that overlap, sessions killed after storing bodies ahead, and a run of edits, renames
and deletes: what a live session relies on stays, and what nothing keeps is collected.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import LAUNCHER, exported, old_store

from sharedmem.hashing import digest_of, sha256_text
from sharedmem.server import blob_lifecycle as life
from sharedmem.server.store import Store

AHEAD = 6  # bodies of 1 MB: past the 1 MiB a session stores ahead of their manifest


def big(tag: str, count: int = AHEAD) -> list[str]:
    """Texts that `serve` stores as they arrive (no credential in them, each under 1 MiB)."""
    return [(f"# {tag} {i}\n" + f"{tag} line {i} of plain prose\n" * 40_000)[:1_000_000]
            for i in range(count)]


def enc(message: object) -> bytes:
    return json.dumps(message).encode() + b"\n"


def listing(source: str, files: dict[str, str]) -> dict[str, Any]:
    entries = [[p, sha256_text(t), len(t.encode()), 0] for p, t in sorted(files.items())]
    return {"type": "manifest", "source": source, "kind": "markdown",
            "digest": digest_of((e[0], e[1]) for e in entries), "files": entries}


def bodies(texts: list[str]) -> dict[str, Any]:
    return {"type": "bodies", "bodies": [[sha256_text(t), t] for t in texts]}


class Serve:
    """A real `serve` process spoken to over pipes, one message at a time."""

    def __init__(self, store: Path, machine: str = "laptop") -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(LAUNCHER), "serve", "--store", str(store)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert self.ask({"type": "hello", "versions": [2], "machine": machine})["type"] == "hello"

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(enc(message))
        self.proc.stdin.flush()

    def receive(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            assert sel.select(timeout=60), "serve did not answer within 60 s"
        return json.loads(self.proc.stdout.readline())

    def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        self.send(message)
        return self.receive()

    def ahead(self, texts: list[str]) -> None:
        """Send bodies ahead; the status answered after them says the session took them."""
        self.send(bodies(texts))
        assert self.ask({"type": "status"})["type"] == "status"

    def publish(self, source: str, files: dict[str, str]) -> dict:
        """A whole manifest, then the bodies `need` names; returns the result."""
        need = self.ask(listing(source, files))
        assert need["type"] == "need", need
        wanted = [t for t in files.values() if sha256_text(t) in need["sha256"]]
        if wanted:
            self.send({**bodies(wanted), "source": source})
        return self.ask({"type": "commit", "source": source})

    def bye(self) -> None:
        self.send({"type": "bye"})
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(timeout=60) == 0, self.proc.stderr.read() if self.proc.stderr else ""
        self.close()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=60)  # reaped: its pid is gone, as sshd's child would be
        self.close()

    def close(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None and not stream.closed:
                stream.close()


def session(store: Path, *messages: dict[str, Any], machine: str = "laptop") -> list[dict]:
    """One whole session of a real `serve`: every message it wrote after its hello."""
    lines = [enc({"type": "hello", "versions": [2], "machine": machine}),
             *map(enc, messages), enc({"type": "bye"})]
    proc = subprocess.run([sys.executable, str(LAUNCHER), "serve", "--store", str(store)],
                          input=b"".join(lines), capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    return [json.loads(line) for line in proc.stdout.splitlines()][1:]


def count(store: Path, sql: str) -> int:
    with sqlite3.connect(store) as conn:
        value = conn.execute(sql).fetchone()[0]
    conn.close()
    return value


UNUSED_BODIES = "SELECT count(*) FROM blobs WHERE sha256 NOT IN (SELECT sha256 FROM files)"


# --- two sessions on one store (issue 18) ------------------------------------------------------

@pytest.mark.parametrize("relies", ["sent ahead too", "named in its manifest"])
def test_a_session_ending_leaves_the_bodies_another_live_session_relies_on(
        tmp_path: Path, relies: str) -> None:
    """B stores bodies ahead and ends without using them; A, which relies on them, commits."""
    store = tmp_path / "store.sqlite3"
    texts = big("shared")
    files = {f"{i}.md": t for i, t in enumerate(texts)}
    b = Serve(store, "desktop")
    b.ahead(texts)  # B stores them ahead, first
    a = Serve(store)
    if relies == "sent ahead too":
        a.ahead(texts)  # there already: A keeps only their addresses
        b.bye()  # B's clean-up: no file uses them yet
        result = a.publish("notes", files)
    else:
        need = a.ask(listing("notes", files))
        assert need["sha256"] == []  # the store holds them: A is not asked for them
        b.bye()
        result = a.ask({"type": "commit", "source": "notes"})
    a.bye()
    assert result["type"] == "result" and result["refused"] == [], result
    assert result["accepted"] == AHEAD
    with Store.open(store) as s:
        assert exported(s) == {f"machines/laptop/notes/{p}": t for p, t in files.items()}
        assert s.verify() == [] and s.counts()["blobs"] == AHEAD
    assert count(store, "SELECT count(*) FROM claims") == 0  # both released at their end
    assert count(store, "SELECT count(*) FROM stored_ahead") == 0


# --- a session killed after storing bodies ahead (issue 14) --------------------------------------

def repair(store: Path) -> None:
    proc = subprocess.run([sys.executable, str(LAUNCHER), "doctor", "--store", str(store),
                           "--repair", "--json"], capture_output=True, text=True, timeout=60)
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["repair"]["status"] == "ok", checks["repair"]
    assert checks["repair"]["details"]["bodies"] == AHEAD - 1
    assert checks["bodies"]["details"]["orphans"] == 0


@pytest.mark.parametrize("collector", ["the next session", "doctor --repair"])
def test_bodies_of_a_killed_session_are_collected_and_nothing_in_use_is(
        tmp_path: Path, collector: str) -> None:
    store = tmp_path / "store.sqlite3"
    kept = {"a.md": "in use before", "b.md": "in use too"}
    texts = [*big("orphan", AHEAD - 1), "in use before"]  # one of them a file already uses
    session(store, listing("notes", kept), bodies(list(kept.values())),
            {"type": "commit", "source": "notes"})
    live = Serve(store, "desktop")  # a live session's own claim must survive the collection
    live.ahead(big("live"))
    doomed = Serve(store)
    doomed.ahead(texts)
    doomed.kill()
    assert count(store, UNUSED_BODIES) == 2 * AHEAD - 1  # the orphans, and the live ones
    if collector == "the next session":
        session(store)
    else:
        repair(store)
    assert count(store, UNUSED_BODIES) == AHEAD  # only what the live session claims
    result = live.publish("notes", {f"{i}.md": t for i, t in enumerate(big("live"))})
    assert result["refused"] == [] and result["accepted"] == AHEAD
    live.bye()
    with Store.open(store) as s:
        assert exported(s, "machines/laptop/") == {f"machines/laptop/notes/{p}": t
                                                   for p, t in kept.items()}
        assert s.verify() == [] and s.counts()["blobs"] == 2 + AHEAD
    assert count(store, "SELECT count(*) FROM sessions") == 0


# --- growth: edits, renames and deletes (issue 18) ------------------------------------------------

def test_a_run_of_edits_renames_and_deletes_leaves_only_what_files_use(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite3"
    tree = {f"n{i}.md": f"note {i} v0" for i in range(8)}
    session(store, listing("notes", tree), bodies(list(tree.values())),
            {"type": "commit", "source": "notes"})
    first = session(store, {"type": "pull", "known": {}})[0]
    start = {r["key"]: r["generation"] for r in first["namespaces"]}["machines/laptop/notes"]
    reader = Serve(store, "desktop")  # told the store holds a body, before its last file goes
    assert reader.ask(listing("copy", {"c.md": "note 0 v0"}))["sha256"] == []
    for round_no in range(1, 6):
        names = sorted(tree)
        tree[names[0]] += f" edited {round_no}"  # first n0.md: the body the reader relies on
        tree[f"moved{round_no}.md"] = tree.pop(names[1])  # a rename
        del tree[names[2]]  # a delete
        tree[f"added{round_no}.md"] = f"added in round {round_no}"
        replies = session(store, listing("notes", tree), bodies(list(tree.values())),
                          {"type": "commit", "source": "notes"})
        assert replies[-1]["refused"] == []
    assert reader.ask({"type": "commit", "source": "copy"})["refused"] == []  # still there
    reader.bye()
    assert count(store, UNUSED_BODIES) > 0 and count(store, "SELECT count(*) FROM tombstones") > 0
    with sqlite3.connect(store) as conn:  # as if the grace and the retentions had run out
        conn.execute("UPDATE unused SET since = since - ?", (life.GRACE_SECONDS + 1,))
        conn.execute("UPDATE versions SET replaced_at = replaced_at - ?",  # file history's
                     (life.DEFAULT_HISTORY_DAYS * life.DAY + life.COMPACT_EVERY_SECONDS + 1,))
        conn.execute("UPDATE tombstone_times SET at = at - ?",
                     (life.TOMBSTONE_SECONDS + life.COMPACT_EVERY_SECONDS + 1,))
    conn.close()
    # A no-change sync: its session's end collects.
    assert session(store, listing("notes", tree))[0]["unchanged"]
    assert count(store, UNUSED_BODIES) == 0
    assert count(store, "SELECT count(*) FROM tombstones") == 0
    assert count(store, "SELECT count(*) FROM unused") == 0
    with Store.open(store) as s:
        assert exported(s, "machines/laptop/notes/") == {f"machines/laptop/notes/{p}": t
                                                         for p, t in tree.items()}
        assert s.counts()["blobs"] == len(set(tree.values()) | {"note 0 v0"})
        assert s.verify() == []
    later = session(store, {"type": "pull", "known": {"machines/laptop/notes": start}})[0]
    assert "machines/laptop/notes" in later["full"]  # a cache from before the compaction
    compacted = {r["key"]: r["generation"] for r in later["namespaces"]}["machines/laptop/notes"]
    gone = sorted(tree)[0]
    del tree[gone]
    session(store, listing("notes", tree), {"type": "commit", "source": "notes"})
    after = session(store, {"type": "pull", "known": {"machines/laptop/notes": compacted}})[0]
    assert "machines/laptop/notes" not in after["full"]  # a cache since: only the change
    assert after["removed"] == [f"machines/laptop/notes/{gone}"]


# --- the pieces --------------------------------------------------------------------------------

def test_a_session_is_ended_when_its_process_is_gone_or_it_was_not_seen_for_a_day(
        tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    now = 10**9
    rows = {"this process": (os.getpid(), life.host(), now),
            "process gone": (gone.pid, life.host(), now),
            "on another host": (gone.pid, "elsewhere", now),
            "stale": (os.getpid(), life.host(), now - life.SESSION_STALE_SECONDS - 1)}
    with Store.open(tmp_path / "store.sqlite3") as s:
        ids = {}
        with s.transaction() as conn:
            for name, (pid, where, seen) in rows.items():
                ids[name] = conn.execute("INSERT INTO sessions(pid, host, started_at, seen_at) "
                                         "VALUES (?,?,?,?)", (pid, where, seen, seen)).lastrowid
        ended = life.ended_sessions(s.conn, now, own=None)
        assert sorted(ended) == sorted([ids["process gone"], ids["stale"]])
        assert ids["this process"] in life.ended_sessions(s.conn, now, own=ids["this process"])


def test_a_session_with_nothing_due_writes_nothing_at_its_end(tmp_path: Path) -> None:
    with Store.open(tmp_path / "store.sqlite3") as s:
        before = s.conn.total_changes
        assert s.finish() is None
        assert s.conn.total_changes == before and not s.conn.in_transaction


def test_a_claim_outlives_another_process_taking_its_session_for_dead(tmp_path: Path) -> None:
    """A session unseen for a day is collected; its next claim registers it again."""
    text = "claimed, then taken for dead"
    with Store.open(tmp_path / "store.sqlite3") as s:
        s.put_blobs([(sha256_text(text), len(text), text.encode())])
        first = s.session
        s.collect(now=int(s.conn.execute("SELECT seen_at FROM sessions").fetchone()[0])
                  + life.SESSION_STALE_SECONDS + 1)
        assert s.counts()["blobs"] == 0
        s.put_blobs([(sha256_text(text), len(text), text.encode())])
        assert s.session is not None and s.session != first
        assert s.conn.execute("SELECT session_id FROM stored_ahead").fetchall() == [(s.session,)]
        assert s.finish() is not None and s.counts()["blobs"] == 0


def rows(tag: str, count: int = 3) -> list[tuple[str, int, bytes]]:
    texts = [f"{tag} {i}" for i in range(count)]
    return [(sha256_text(t), len(t), t.encode()) for t in texts]


def test_bodies_stored_ahead_are_claimed_as_runs_that_a_strays_collection_honours(
        tmp_path: Path) -> None:
    """Two sessions' commits interleave; each commit's new bodies are one run of its session."""
    path = tmp_path / "store.sqlite3"
    with Store.open(path) as a, Store.open(path) as b:
        a.put_blobs(rows("a1"))
        b.put_blobs(rows("b1"))
        a.put_blobs([*rows("a2"), *rows("b1")])  # b1 was there: claimed for a, a row each
        runs = a.conn.execute("SELECT first_rowid, last_rowid, session_id FROM stored_ahead "
                              "ORDER BY first_rowid").fetchall()
        assert runs == [(1, 3, a.session), (4, 6, b.session), (7, 9, a.session)]
        assert a.conn.execute("SELECT count(*) FROM claims WHERE session_id=?",
                              (a.session,)).fetchone()[0] == 3
        assert a.collect(strays=True).bodies == 0  # every body is someone's
        assert b.finish() is not None  # b's own run goes; b1 stays, a claims it
        assert b.counts()["blobs"] == 9
        assert a.finish() is not None  # nothing used them: all go
        assert a.counts()["blobs"] == 0
        assert a.conn.execute("SELECT count(*) FROM stored_ahead").fetchone()[0] == 0


def test_bodies_numbered_past_the_largest_rowid_are_claimed_one_by_one(tmp_path: Path) -> None:
    """SQLite numbers new rows at random once the largest rowid is taken: no run holds them."""
    with Store.open(tmp_path / "store.sqlite3") as s:
        with s.transaction() as conn:
            conn.execute("INSERT INTO blobs(rowid, sha256, size, body) VALUES (?,?,1,'x')",
                         (2**63 - 1, sha256_text("x")))
        s.put_blobs(rows("late"))
        assert s.conn.execute("SELECT count(*) FROM stored_ahead").fetchone()[0] == 0
        assert s.conn.execute("SELECT count(*) FROM claims").fetchone()[0] == 3
        assert s.collect(strays=True).bodies == 1  # only the one nothing claims


def test_the_v2_fixture_opens_as_is_and_collects_what_its_time_made_due(tmp_path: Path) -> None:
    path = old_store(tmp_path / "store.sqlite3", 2)
    migrated: list[int] = []  # to schema 3 (file history), which changes none of this
    with Store.open(path, before_migrate=lambda p, v: migrated.append(v)) as s:
        assert migrated == [2] and s.history_summary()["versions"] == 0
        files = exported(s, "machines/")
        assert len(files) == 6 and s.verify() == []
        done = s.collect(now=1_780_000_000 + 3600)  # an hour on: the unused bodies go
        assert (done.sessions, done.bodies, done.tombstones) == (0, 2, 0)
        assert s.counts()["blobs"] == 7  # the claimed one stays: its session is elsewhere
        done = s.collect(now=1_780_000_000 + 8 * 24 * 3600)  # unseen for a day; a week on
        assert (done.sessions, done.bodies, done.tombstones) == (1, 1, 1)
        assert s.counts()["blobs"] == 6 and exported(s, "machines/") == files
        assert s.conn.execute("SELECT value FROM meta WHERE key='tombstones_compacted'"
                              ).fetchone() == ("6",)
