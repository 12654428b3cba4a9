"""File history on real stores: previous versions recorded, listed, shown, pruned and forgotten.

The store level (sharedmem/server/store.py, schema 3, blob_lifecycle.py), the `history` and
`show` messages of a real session (sharedmem/server/session.py), and the commands
(sharedmem/cli/history_commands.py) through real subprocesses, on the server with `--store` and
from a client with `--config` over a local transport (sharedmem/client/history.py); a backup's
round trip; the v3 fixture.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import LAUNCHER, SYSTEM, exported, files, old_store, run_cli, write_config

from sharedmem.core import NameRuleError, PathRuleError, StoreError
from sharedmem.hashing import sha256_text
from sharedmem.protocol import Channel
from sharedmem.server import backup
from sharedmem.server import blob_lifecycle as life
from sharedmem.server.ingest import IncomingFile, ingest
from sharedmem.server.schema import SCHEMA_VERSION
from sharedmem.server.session import Session
from sharedmem.server.store import NotFound, Store

SUMMARY = "machines/laptop/codex/memory_summary.md"
MEMORY = "machines/laptop/codex/MEMORY.md"
RETENTION = life.DEFAULT_HISTORY_DAYS * life.DAY


def publish(st: Store, tree: dict[str, str], machine: str = "laptop", source: str = "codex",
            kind: str = "codex") -> int:
    """One whole snapshot of a namespace; returns its generation."""
    return ingest(st, machine, source, kind, files(tree)).generation


def rows(st: Store) -> list[tuple]:
    return st.conn.execute("SELECT path, generation, replaced_generation FROM versions "
                           "ORDER BY path, generation").fetchall()


def listed(st: Store, path: str) -> list[tuple]:
    """(version, current) of each version `history` lists."""
    return [(v["version"], v["current"]) for v in st.history(path)["versions"]]


def age_versions(st: Store, seconds: int) -> None:
    """As if the versions (and every body's unused mark) were replaced `seconds` earlier."""
    with st.transaction() as conn:
        conn.execute("UPDATE versions SET replaced_at = replaced_at - ?", (seconds,))
        conn.execute("UPDATE unused SET since = since - ?", (seconds,))


def bodies(st: Store) -> set[str]:
    return {r[0] for r in st.conn.execute("SELECT body FROM blobs")}


# --- recording -----------------------------------------------------------------------------------

def test_a_change_a_delete_and_a_rename_each_keep_what_was_replaced_and_no_change_keeps_nothing(
        st: Store) -> None:
    first = publish(st, {"MEMORY.md": "m1", "memory_summary.md": "s1",
                         "rollout_summaries/a.md": "same text"})
    publish(st, {"MEMORY.md": "m1", "memory_summary.md": "s1", "rollout_summaries/a.md": "same text"})
    ingest(st, "laptop", "codex", "codex",  # only the mtimes differ: nothing is replaced
           [IncomingFile(f.path, f.sha256, f.size, 12345, f.text) for f in files(
               {"MEMORY.md": "m1", "memory_summary.md": "s1", "rollout_summaries/a.md": "same text"})])
    assert rows(st) == [] and st.counts()["versions"] == 0
    blobs = st.counts()["blobs"]
    second = publish(st, {"MEMORY.md": "m1", "memory_summary.md": "s2",  # an edit
                          "rollout_summaries/b.md": "same text"})  # a rename, content unchanged
    third = publish(st, {"memory_summary.md": "s2", "rollout_summaries/b.md": "same text"})
    assert rows(st) == [("MEMORY.md", first, third), ("memory_summary.md", first, second),
                        ("rollout_summaries/a.md", first, second)]
    assert st.counts()["blobs"] == blobs + 1  # only s2 is new: the renamed body is shared
    assert listed(st, SUMMARY) == [(first, False), (second, True)]
    assert listed(st, MEMORY) == [(first, False)]  # deleted: no current file
    history = st.history(SUMMARY)
    assert history["retention_days"] == life.DEFAULT_HISTORY_DAYS and history["path"] == SUMMARY
    old, new = history["versions"]
    assert old["sha256"] == sha256_text("s1") and old["size"] == 2
    assert old["replaced_generation"] == second and old["replaced_at"].endswith("Z")
    assert new["replaced_at"] is None and new["replaced_generation"] is None


def test_a_delta_keeps_what_it_replaced_and_removed(st: Store) -> None:
    first = publish(st, {"a.md": "A", "b.md": "B", "c.md": "C"}, source="notes", kind="markdown")
    base = st.namespace_digest("laptop", "notes")
    second = ingest(st, "laptop", "notes", "markdown", files({"a.md": "A2"}), removed=["b.md"],
                    base_digest=base).generation
    assert rows(st) == [("a.md", first, second), ("b.md", first, second)]
    assert st.version("machines/laptop/notes/b.md", first)["text"] == "B"
    assert exported(st) == {"machines/laptop/notes/a.md": "A2", "machines/laptop/notes/c.md": "C"}


# --- reading ----------------------------------------------------------------------------------------

def test_show_gives_each_version_and_the_current_one_with_its_text(st: Store) -> None:
    first = publish(st, {"memory_summary.md": "ünïcode\r\nsummary v1\n"})
    second = publish(st, {"memory_summary.md": "summary v2\n"})
    found = st.version(SUMMARY, first)
    assert found["text"] == "ünïcode\r\nsummary v1\n" and not found["current"]
    assert found["sha256"] == sha256_text(found["text"]) and found["path"] == SUMMARY
    assert st.version(SUMMARY, second)["text"] == "summary v2\n"
    assert st.version(SUMMARY, second)["current"]


@pytest.mark.parametrize(("path", "version", "error", "says"), [
    (SUMMARY, 999, NotFound, "holds no version 999"),
    ("machines/laptop/codex/never.md", 1, NotFound, "holds no "),
    ("machines/desktop/codex/MEMORY.md", 1, NotFound, "holds nothing of machine 'desktop'"),
    ("extensions/ad_hoc/notes/2026-01-31T09-30-00-x.md", 1, NotFound, "append-only"),
    ("machines/laptop/codex", 1, PathRuleError, "not a published file"),
    ("notes/laptop/codex/MEMORY.md", 1, PathRuleError, "not a published file"),
    ("machines/laptop/codex/../../x.md", 1, PathRuleError, "'..'"),
    ("machines/laptop/codex/.hidden.md", 1, PathRuleError, "hidden"),
    ("machines/laptop/codex/x.txt", 1, PathRuleError, "does not end in .md"),
    ("machines/Laptop/codex/MEMORY.md", 1, NameRuleError, "machine 'Laptop' is invalid"),
    ("machines/laptop/../MEMORY.md", 1, NameRuleError, "source '..' is invalid"),
    ("machines/laptop/codex/" + "x" * 5000 + ".md", 1, PathRuleError, "longer than any"),
    ("/etc/passwd", 1, PathRuleError, "not a published file"),
])
def test_a_bad_path_or_version_is_refused_naming_it(st: Store, path: str, version: int,
                                                    error: type[Exception], says: str) -> None:
    publish(st, {"memory_summary.md": "s1"})
    publish(st, {"memory_summary.md": "s2"})
    before = st.conn.total_changes
    with pytest.raises(error, match=re.escape(says)):
        st.version(path, version)
    if path != SUMMARY:  # whose history is there
        with pytest.raises(error, match=re.escape(says)):
            st.history(path)
    assert st.conn.total_changes == before


# --- retention ----------------------------------------------------------------------------------------

def test_versions_are_pruned_after_the_retention_and_their_bodies_then_collected(st: Store) -> None:
    first = publish(st, {"memory_summary.md": "s1", "MEMORY.md": "shared body"})
    publish(st, {"memory_summary.md": "s2", "rollout_summaries/x.md": "shared body"})
    now = int(time.time())
    assert st.collect(now=now + life.GRACE_SECONDS + 1) is not None  # the grace is over
    assert {"s1", "shared body"} <= bodies(st)  # yet a version keeps s1
    assert st.version(SUMMARY, first)["text"] == "s1"
    assert st.finish() is None  # nothing due: a session's end is a read
    age_versions(st, RETENTION)  # at the retention, not a day past it: not due yet
    assert not life.due(st.conn, now) and st.finish() is None
    assert st.history_summary()["versions"] == 2
    age_versions(st, life.COMPACT_EVERY_SECONDS + 1)  # a day past: the next session's end
    assert life.due(st.conn, now)
    done = st.finish()
    assert done is not None and (done.versions, done.bodies) == (2, 1)
    assert "s1" not in bodies(st) and "shared body" in bodies(st)  # a file still uses it
    assert rows(st) == [] and st.verify() == []
    with pytest.raises(NotFound):
        st.history(MEMORY)
    assert listed(st, SUMMARY) == [(first + 1, True)]


def test_a_body_stays_while_any_version_uses_it(st: Store) -> None:
    publish(st, {"a.md": "kept"}, source="notes", kind="markdown")
    publish(st, {"a.md": "other"}, source="notes", kind="markdown")
    age_versions(st, RETENTION - life.DAY)  # a younger version of the same body, elsewhere:
    publish(st, {"b.md": "kept"}, source="more", kind="markdown")
    publish(st, {"b.md": "gone"}, source="more", kind="markdown")
    age_versions(st, life.DAY + life.COMPACT_EVERY_SECONDS + 1)
    done = st.collect()
    assert done is not None and done.versions == 1 and "kept" in bodies(st)
    age_versions(st, RETENTION)
    done = st.collect()
    assert done is not None and done.versions == 1 and "kept" not in bodies(st)


@pytest.mark.parametrize("days", [-1, life.DEFAULT_HISTORY_DAYS * 1000, True, "5", 1.5, None])
def test_a_bad_retention_is_refused_and_changes_nothing(st: Store, days: Any) -> None:
    with pytest.raises(StoreError, match="not a whole number of days from 0 to 3650"):
        st.set_history_days(days)
    assert st.history_days() == life.DEFAULT_HISTORY_DAYS


def test_retention_zero_deletes_the_versions_and_records_none_until_set_again(st: Store) -> None:
    publish(st, {"memory_summary.md": "s1"})
    second = publish(st, {"memory_summary.md": "s2"})
    assert st.set_history_days(7) == 0 and st.history_days() == 7
    assert st.set_history_days(0) == 1 and rows(st) == []
    publish(st, {"memory_summary.md": "s3"})
    assert rows(st) == [] and st.history(SUMMARY)["retention_days"] == 0
    assert st.set_history_days(30) == 0
    fourth = publish(st, {"memory_summary.md": "s4"})
    assert rows(st) == [("memory_summary.md", second + 1, fourth)]
    st.collect(now=int(time.time()) + life.GRACE_SECONDS + 1)
    assert bodies(st) == {"s3", "s4"}  # s1 and s2 went with their versions, after the grace


# --- forget -----------------------------------------------------------------------------------------------

def test_forget_removes_the_history_of_what_it_forgets_and_its_bodies(st: Store) -> None:
    for text in ("v1", "v2", "v3"):
        publish(st, {"memory_summary.md": f"laptop {text}"})
        publish(st, {"memory_summary.md": f"desktop {text}"}, machine="desktop")
        publish(st, {"n.md": f"notes {text}"}, source="notes", kind="markdown")
    assert st.counts()["versions"] == 6
    st.forget("laptop", "codex")
    assert [r[0] for r in st.conn.execute("SELECT n.machine || '/' || n.source FROM versions v "
                                          "JOIN namespaces n ON n.id = v.namespace_id "
                                          "ORDER BY 1")] == [
        "desktop/codex"] * 2 + ["laptop/notes"] * 2
    assert not any(b.startswith("laptop") for b in bodies(st))  # at once, as forget's are
    st.forget("laptop")
    assert st.counts()["versions"] == 2 and not any(b.startswith("notes") for b in bodies(st))
    with pytest.raises(NotFound, match="holds nothing of machine 'laptop'"):
        st.history(SUMMARY)
    assert st.history("machines/desktop/codex/memory_summary.md")["versions"][0]["size"] == 10
    assert st.verify() == []


# --- the schema --------------------------------------------------------------------------------------------

T = 1_780_086_400  # when the v3 fixture's consolidation replaced its files


def test_the_v3_fixture_migrates_and_its_history_expires_when_its_time_comes(
        tmp_path: Path) -> None:
    from sharedmem.cli.doctor import doctor_store
    path = old_store(tmp_path / "store.sqlite3", 3)
    assert "stored_ahead" not in life.unkept(3) and "stored_ahead" in life.UNKEPT
    checks = {c.name: c for c in doctor_store(path).checks}  # read before it is migrated
    assert checks["bodies"].details["orphans"] == 0, checks["bodies"].message
    migrated: list[int] = []  # to schema 4 (runs of bodies stored ahead), which adds a table
    with Store.open(path, before_migrate=lambda p, v: migrated.append(v)) as s:
        assert migrated == [3]
        assert s.verify() == [] and s.counts()["versions"] == 2
        summary = "machines/alpha/codex/memory_summary.md"
        assert [(v["version"], v["replaced_at"]) for v in s.history(summary)["versions"]] == [
            (1, "2026-05-29T20:26:40Z"), (7, None)]
        assert s.version(summary, 1)["text"] == "Alpha summary.\n"
        dropped = "machines/alpha/codex/rollout_summaries/2026-01-02-build.md"
        assert s.version(dropped, 1)["text"] == "Build notes: use uv.\n"
        done = s.collect(now=T + 3600)  # the v2 fixture's unused bodies and stale claim go
        assert (done.sessions, done.bodies, done.versions) == (1, 3, 0)
        assert s.version(dropped, 1)["text"] == "Build notes: use uv.\n"
        done = s.collect(now=T + RETENTION + life.DAY)
        assert (done.versions, done.bodies, done.tombstones) == (2, 2, 2)
        assert s.counts()["versions"] == 0 and s.verify() == []
        assert len(exported(s, "machines/")) == 5


def test_the_v4_fixture_opens_as_is_and_its_killed_session_releases_its_run(
        tmp_path: Path) -> None:
    path = old_store(tmp_path / "store.sqlite3", 4)
    with Store.open(path, before_migrate=lambda p, v: pytest.fail("no migration is due")) as s:
        assert s.verify() == [] and s.counts()["blobs"] == 11
        done = s.collect(now=T)  # two bodies unused past their grace go; the session stands
        assert (done.sessions, done.bodies) == (0, 2)
        done = s.collect(now=T + 3600)  # a day unseen: its claim and its run go, with bodies
        assert (done.sessions, done.bodies) == (1, 2)
        assert s.conn.execute("SELECT count(*) FROM stored_ahead").fetchone()[0] == 0
        assert s.verify() == [] and len(exported(s, "machines/")) == 5


def test_a_v2_store_is_migrated_with_history_on_and_doctor_reads_it_before(tmp_path: Path) -> None:
    from sharedmem.cli.doctor import doctor_store
    path = old_store(tmp_path / "store.sqlite3", 2)
    assert "versions" not in life.unkept(2) and "versions" in life.UNKEPT
    checks = {c.name: c for c in doctor_store(path).checks}
    assert checks["bodies"].details["orphans"] == 0, checks["bodies"].message  # it was read
    with Store.open(path) as s:
        assert s.schema_version() == SCHEMA_VERSION
        assert s.history_days() == life.DEFAULT_HISTORY_DAYS
        publish(s, {"MEMORY.md": "# Alpha memory, consolidated\n"}, machine="alpha")
        assert listed(s, "machines/alpha/codex/MEMORY.md") == [(1, False), (7, True)]
        assert listed(s, "machines/alpha/codex/memory_summary.md") == [(1, False)]


# --- backups -------------------------------------------------------------------------------------------

def test_a_backup_carries_the_history_through_verify_and_restore(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite3"
    with Store.open(store) as st:
        first = publish(st, {"memory_summary.md": "before consolidation"})
        publish(st, {"memory_summary.md": "after"})
        counts = st.counts()
    info = backup.create(store)
    assert info.counts == counts and counts["versions"] == 1
    assert backup.verify(info.path) == []
    with Store.open(store) as st:  # later, the history is gone from the live store
        st.set_history_days(0)
    backup.restore(info.path, store)
    with Store.open(store) as st:
        assert st.version(SUMMARY, first)["text"] == "before consolidation"
        assert st.history_days() == life.DEFAULT_HISTORY_DAYS  # the setting travels with it


# --- the session's messages ----------------------------------------------------------------------------

def converse(store: Path, *messages: dict[str, Any]) -> list[dict[str, Any]]:
    """One in-process session of the real server: every message it wrote after its hello."""
    lines = [{"type": "hello", "versions": [2], "machine": "laptop"}, *messages]
    out = io.BytesIO()
    Session(store, Channel(io.BytesIO(b"".join(json.dumps(m).encode() + b"\n" for m in lines)),
                           out, "client"), None).run()
    return [json.loads(line) for line in out.getvalue().splitlines()][1:]


HOSTILE = [
    ({"type": "history"}, "history.path is missing"),
    ({"type": "history", "path": ["machines"]}, "history.path is missing or of the wrong type"),
    ({"type": "history", "path": "machines/laptop/codex/../../../etc/x.md"}, "'..'"),
    ({"type": "history", "path": "machines/LAPTOP/codex/MEMORY.md"}, "machine 'LAPTOP'"),
    ({"type": "history", "path": "machines/laptop/codex/a\x00.md"}, "NUL"),
    ({"type": "history", "path": "/etc/passwd"}, "not a published file"),
    ({"type": "show", "path": SUMMARY}, "show.version is missing"),
    ({"type": "show", "path": SUMMARY, "version": True}, "show.version is missing"),
    ({"type": "show", "path": SUMMARY, "version": "1"}, "show.version is missing"),
    ({"type": "show", "path": SUMMARY, "version": -1}, "show.version must be a version"),
    ({"type": "show", "path": SUMMARY, "version": 2**70}, "show.version must be a version"),
    ({"type": "show", "path": "machines/laptop/codex/x.txt", "version": 1}, "does not end in"),
]


@pytest.mark.parametrize(("message", "says"), HOSTILE, ids=[s for _, s in HOSTILE])
def test_a_hostile_history_or_show_ends_the_session_with_bad_field(
        tmp_path: Path, message: dict[str, Any], says: str) -> None:
    store = tmp_path / "store.sqlite3"
    with Store.open(store) as st:
        publish(st, {"memory_summary.md": "s1"})
    replies = converse(store, message, {"type": "status"})
    assert len(replies) == 1 and replies[0]["type"] == "error", replies
    assert replies[0]["code"] == "bad-field" and says in replies[0]["message"]


def test_history_and_show_answer_and_not_found_lets_the_session_go_on(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite3"
    with Store.open(store) as st:
        first = publish(st, {"memory_summary.md": "s1"})
        publish(st, {"memory_summary.md": "s2"})
        expected = st.history(SUMMARY)
    replies = converse(store, {"type": "history", "path": SUMMARY},
                       {"type": "show", "path": SUMMARY, "version": first},
                       {"type": "show", "path": SUMMARY, "version": 99},
                       {"type": "history", "path": "machines/laptop/codex/none.md"},
                       {"type": "history", "path": "extensions/ad_hoc/notes/"
                                                   "2026-01-31T09-30-00-x.md"},
                       {"type": "status"})
    assert replies[0] == {"type": "history", **expected}
    assert replies[1]["type"] == "version" and replies[1]["text"] == "s1"
    assert [(r["type"], r.get("code")) for r in replies[2:]] == [
        ("error", "not-found"), ("error", "not-found"), ("error", "not-found"), ("status", None)]
    assert "append-only" in replies[4]["message"]
    out = io.BytesIO()  # protocol version 1 has no history
    lines = [{"type": "hello", "versions": [1], "machine": "laptop"},
             {"type": "history", "path": SUMMARY}]
    Session(store, Channel(io.BytesIO(b"".join(json.dumps(m).encode() + b"\n" for m in lines)),
                           out, "client"), None).run()
    assert json.loads(out.getvalue().splitlines()[-1])["code"] == "unknown-type"




# --- the commands, through real processes -------------------------------------------------------------

TEXT = "# Summary\r\n\nünïcode, a tab\there, no final newline"


def consolidated_store(path: Path) -> tuple[int, int]:
    with Store.open(path) as st:
        first = publish(st, {"memory_summary.md": TEXT, "MEMORY.md": "kept"})
        second = publish(st, {"memory_summary.md": "consolidated", "MEMORY.md": "kept"})
    return first, second


def raw_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The launcher, its stdout as bytes (what `> FILE` would hold)."""
    return subprocess.run([sys.executable, str(LAUNCHER), *args], capture_output=True, env=env,
                          timeout=60)


def test_history_and_show_on_the_server_with_store(tmp_path: Path, home: Path) -> None:
    store = tmp_path / "store.sqlite3"
    first, second = consolidated_store(store)
    proc = run_cli("history", "--store", str(store), SUMMARY, "--json")
    assert proc.returncode == 0, proc.stderr
    versions = json.loads(proc.stdout)["versions"]
    assert [(v["version"], v["current"]) for v in versions] == [(first, False), (second, True)]
    proc = run_cli("history", "--store", str(store), SUMMARY)
    assert proc.returncode == 0 and f"{SUMMARY}: 2 version(s)" in proc.stdout
    assert "current" in proc.stdout and f"show {SUMMARY}@{first} > FILE" in proc.stdout
    proc = raw_cli("show", "--store", str(store), f"{SUMMARY}@{first}")
    assert proc.returncode == 0 and proc.stdout == TEXT.encode("utf-8")  # byte for byte
    proc = run_cli("show", "--store", str(store), f"{SUMMARY}@{second}", "--json")
    assert json.loads(proc.stdout)["text"] == "consolidated"
    proc = run_cli("history", "--store", str(store))
    assert proc.returncode == 0 and "kept 30 days" in proc.stdout
    assert "1 previous version(s) of 1 file(s)" in proc.stdout


@pytest.mark.parametrize(("args", "says"), [
    (["show", f"{SUMMARY}@77"], "holds no version 77"),
    (["show", SUMMARY], "names no version: write PATH@VERSION"),
    (["show", f"{SUMMARY}@one"], "names no version"),
    (["show", f"{SUMMARY}@-1"], "names no version"),
    (["show", f"{SUMMARY}@{'9' * 30}"], "holds no version 999"),
    (["history", "machines/laptop/codex/../x.md"], "'..'"),
    (["history", "extensions/ad_hoc/notes/2026-01-31T09-30-00-x.md"], "append-only"),
    (["history", "--retention-days", "5", SUMMARY], "on its own"),
    (["history", "--retention-days", "-3"], "not a whole number of days"),
    (["history", "--retention-days", "3651"], "not a whole number of days"),
])
def test_a_bad_request_on_the_store_names_the_fix_and_changes_nothing(
        tmp_path: Path, home: Path, args: list[str], says: str) -> None:
    store = tmp_path / "store.sqlite3"
    consolidated_store(store)
    before = store.read_bytes()
    proc = run_cli(*args[:1], "--store", str(store), *args[1:])
    assert proc.returncode == 2 and proc.stdout == "" and says in proc.stderr, proc.stderr
    assert store.read_bytes() == before


def test_the_retention_is_set_on_the_store_and_shown(tmp_path: Path, home: Path) -> None:
    store = tmp_path / "store.sqlite3"
    consolidated_store(store)
    proc = run_cli("history", "--store", str(store), "--retention-days", "0", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout) == {
        "retention_days": 0, "was": 30, "pruned": 1}
    proc = run_cli("history", "--store", str(store), "--json")
    assert json.loads(proc.stdout)["retention_days"] == 0
    assert "no previous versions are kept" in run_cli("history", "--store", str(store)).stdout


def test_history_and_show_from_a_client_over_the_protocol(tmp_path: Path) -> None:
    store = tmp_path / "server" / "store.sqlite3"
    first, second = consolidated_store(store)
    home = tmp_path / "home"
    cache = home / "cache"
    config = write_config(home / ".local" / "share" / "codex-shared-memory" / "client.json",
                          "laptop", {"kind": "local", "store": str(store)}, [], cache)
    on_server = run_cli("history", "--store", str(store), SUMMARY, "--json")
    proc = run_cli("history", "--config", str(config), SUMMARY, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == json.loads(on_server.stdout)
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}  # the default client.json of that HOME
    proc = raw_cli("show", f"{SUMMARY}@{first}", env=env)
    assert proc.returncode == 0 and proc.stdout == TEXT.encode("utf-8"), proc.stderr
    proc = run_cli("show", "--config", str(config), f"{SUMMARY}@9", env=env)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "holds no version 9" in proc.stderr and "history" in proc.stderr
    proc = run_cli("history", "--config", str(config), "machines/laptop/codex/..", env=env)
    assert proc.returncode == 2 and "'..'" in proc.stderr
    proc = run_cli("history", "--config", str(config), env=env)
    assert proc.returncode == 2 and "needs the PATH" in proc.stderr
    proc = run_cli("history", "--config", str(config), "--retention-days", "3", env=env)
    assert proc.returncode == 2 and "set on the server" in proc.stderr
    assert not cache.exists() and not (config.parent / "state").exists()  # read-only
    with Store.open(store) as st:
        assert st.history_days() == 30 and st.counts()["versions"] == 1


def test_a_person_recovers_what_a_consolidation_dropped_after_real_syncs(tmp_path: Path) -> None:
    """The issue's story: an agent rewrites memory_summary.md; `history` and `show` get it back."""
    home = tmp_path / "home"
    memories = home / ".codex" / "memories"
    memories.mkdir(parents=True)
    (memories / "memory_summary.md").write_text("- deploys go through the staging box\n")
    store = tmp_path / "server" / "store.sqlite3"
    config = write_config(tmp_path / "client" / "client.json", "laptop",
                          {"kind": "local", "store": str(store)},
                          [{"name": "codex", "kind": "codex", "path": str(memories)}],
                          tmp_path / "client" / "cache")
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", **SYSTEM}
    assert run_cli("sync", "--config", str(config), env=env).returncode == 0
    (memories / "memory_summary.md").write_text("- (consolidated)\n")
    assert run_cli("sync", "--config", str(config), env=env).returncode == 0
    proc = run_cli("history", "--config", str(config), SUMMARY, "--json", env=env)
    [old, new] = json.loads(proc.stdout)["versions"]
    assert new["current"] and not old["current"]
    proc = raw_cli("show", "--config", str(config), f"{SUMMARY}@{old['version']}", env=env)
    assert proc.stdout == b"- deploys go through the staging box\n"


GOOD = {"version": 3, "sha256": "a" * 64, "size": 1, "replaced_generation": 4,
        "replaced_at": "2026-05-29T20:26:40Z", "current": False}


@pytest.mark.parametrize("change", [
    {}, {"replaced_at": None, "current": True},  # the two sound ones
    {"version": "3"}, {"version": True}, {"size": None}, {"sha256": "A" * 64},
    {"sha256": "a" * 63}, {"current": "no"}, {"replaced_at": "\x1b[2Jyesterday"},
    {"replaced_at": 1780086400}, {"replaced_at": "2026-05-29T20:26:40Z\n"},
], ids=repr)
def test_a_client_takes_only_versions_as_the_protocol_has_them(change: dict[str, Any]) -> None:
    from sharedmem.client.history import _sound
    assert _sound({**GOOD, **change}) is (change in ({}, {"replaced_at": None, "current": True}))
    assert not _sound([GOOD])
