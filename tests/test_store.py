"""Tests for sharedmem.server.store on real SQLite files: schema, transactions, notes, pulls, crashes."""

from __future__ import annotations

import json
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, body, exported, files, old_store

from sharedmem.core import NameRuleError, NoteError, StoreError
from sharedmem.hashing import sha256_text
from sharedmem.rules import NOTES_DIR
from sharedmem.server import store as store_module
from sharedmem.server.ingest import IncomingFile, ingest
from sharedmem.server.note_log import GENESIS, chain_hash
from sharedmem.server.schema import SCHEMA_VERSION
from sharedmem.server.store import Store

NOTE = "2026-01-31T09-30-00-release-checklist.md"


def child(code: str, *args: str, timeout: float = 60) -> subprocess.Popen:
    """A real Python process that can import the package from this checkout."""
    prelude = f"import sys\nsys.path.insert(0, {str(REPO)!r})\n"
    return subprocess.Popen([sys.executable, "-c", prelude + code, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# --- schema ------------------------------------------------------------------------------------

def test_schema_pragmas(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "store.sqlite3"
    with Store.open(path) as st:
        assert st.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert st.conn.execute("PRAGMA synchronous").fetchone()[0] == 2
        assert st.conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert st.conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 1000
        assert st.conn.execute("PRAGMA cache_size").fetchone()[0] == -store_module.CACHE_KIB
        assert st.schema_version() == SCHEMA_VERSION == len(store_module.MIGRATIONS)
        assert st.verify() == []
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # persisted in the file
    assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert raw.execute("PRAGMA page_size").fetchone()[0] == store_module.PAGE_SIZE
    raw.close()


def test_a_store_made_with_other_pages_keeps_them(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA page_size=4096")
    raw.execute("PRAGMA journal_mode=WAL")
    raw.close()
    with Store.open(path) as st:
        ingest(st, "laptop", "notes", "markdown", files({"a.md": "A" * 10_000}))
        assert st.conn.execute("PRAGMA page_size").fetchone()[0] == 4096
        assert st.verify() == [] and exported(st) == {"machines/laptop/notes/a.md": "A" * 10_000}


def test_open_refuses_missing_corrupt_and_newer(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        Store.open(tmp_path / "absent.sqlite3", create=False)
    assert not (tmp_path / "absent.sqlite3").exists()
    garbage = tmp_path / "garbage.sqlite3"
    garbage.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(StoreError, match="cannot be opened"):
        Store.open(garbage)
    newer = tmp_path / "newer.sqlite3"
    Store.open(newer).close()
    raw = sqlite3.connect(newer)
    raw.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    raw.close()
    with pytest.raises(StoreError, match="newer than this software.*upgrade"):
        Store.open(newer)


def test_migration_calls_backup_hook_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "store.sqlite3"
    calls: list[tuple[Path, int]] = []
    with Store.open(path, before_migrate=lambda p, v: calls.append((p, v))) as st:
        st.append_note("m1", NOTE, "kept across the migration")
    assert calls == []  # a fresh store has nothing to back up
    monkeypatch.setattr(store_module, "MIGRATIONS",
                        [*store_module.MIGRATIONS, "CREATE TABLE extra(x TEXT);"])

    def refuse(p: Path, v: int) -> None:
        raise StoreError("backup failed")

    with pytest.raises(StoreError, match="backup failed"):
        Store.open(path, before_migrate=refuse)
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION  # not migrated
    raw.close()
    with Store.open(path, before_migrate=lambda p, v: calls.append((p, v))) as st:
        assert st.schema_version() == SCHEMA_VERSION + 1
        st.conn.execute("SELECT x FROM extra")
        assert st.counts()["notes"] == 1
    assert calls == [(path, SCHEMA_VERSION)]


def test_transaction_rolls_back_on_error(st: Store) -> None:
    with pytest.raises(RuntimeError, match="boom"), st.transaction() as conn:
        conn.execute("INSERT INTO meta VALUES ('probe', 'x')")
        raise RuntimeError("boom")
    assert not st.conn.in_transaction
    assert st.conn.execute("SELECT count(*) FROM meta WHERE key='probe'").fetchone()[0] == 0
    with pytest.raises(sqlite3.IntegrityError), st.transaction() as conn:
        conn.execute("INSERT INTO meta VALUES ('probe', 'x')")
        conn.execute("INSERT INTO meta VALUES ('generation', 'dup')")
    assert st.conn.execute("SELECT count(*) FROM meta WHERE key='probe'").fetchone()[0] == 0
    with st.transaction() as conn:
        conn.execute("INSERT INTO meta VALUES ('probe', 'y')")
    assert st.conn.execute("SELECT value FROM meta WHERE key='probe'").fetchone()[0] == "y"


def test_transaction_keeps_the_real_error_when_sqlite_already_rolled_back(st: Store) -> None:
    st.conn.execute("CREATE TEMP TABLE boom(x)")
    st.conn.execute("CREATE TEMP TRIGGER boom_rb BEFORE INSERT ON boom "
                    "BEGIN SELECT RAISE(ROLLBACK, 'rolled back by sqlite'); END")
    with pytest.raises(sqlite3.IntegrityError, match="rolled back by sqlite"), \
            st.transaction() as conn:
        conn.execute("INSERT INTO meta VALUES ('probe', 'x')")
        conn.execute("INSERT INTO boom VALUES (1)")
    assert not st.conn.in_transaction
    with st.transaction() as conn:  # the store is usable afterwards
        conn.execute("INSERT INTO meta VALUES ('after', 'x')")
    assert st.conn.execute("SELECT count(*) FROM meta WHERE key='probe'").fetchone()[0] == 0


def test_transaction_reports_a_busy_store(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    with Store.open(path) as st:
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        st.conn.execute("PRAGMA busy_timeout=50")
        with pytest.raises(StoreError, match="busy"):
            st.append_note("m1", NOTE, "x")
        holder.execute("ROLLBACK")
        holder.close()


def test_content_addressed_bodies(st: Store) -> None:
    shared = "the same text on two machines"
    ingest(st, "m1", "notes", "markdown", files({"x.md": shared}))
    ingest(st, "m2", "codex", "codex", files({"MEMORY.md": shared}))
    sha = sha256_text(shared)
    assert st.conn.execute("SELECT count(*) FROM blobs WHERE sha256=?", (sha,)).fetchone()[0] == 1
    assert st.counts()["blobs"] == 1 and st.counts()["files"] == 2
    unknown = sha256_text("never sent")
    assert st.missing([sha, unknown, unknown]) == [unknown]
    assert st.missing([]) == []
    many = [sha256_text(str(i)) for i in range(1200)]  # more than one query chunk
    assert st.missing([*many, sha]) == sorted(many)
    report = ingest(st, "m3", "notes", "markdown",
                       [IncomingFile("y.md", sha, len(shared)), IncomingFile("z.md", unknown, 3)])
    assert [(r["path"], r["reason"]) for r in report.refused] == [("z.md", "missing-body")]
    assert exported(st)["machines/m3/notes/y.md"] == shared
    assert st.counts()["blobs"] == 1


# --- notes -------------------------------------------------------------------------------------

def test_notes_are_append_only(st: Store) -> None:
    st.append_note("m1", NOTE, "first")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        st.conn.execute("UPDATE notes SET body='changed'")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        st.conn.execute("DELETE FROM notes")
    # REPLACE deletes without firing delete triggers: it must be refused before it gets there.
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        st.conn.execute("INSERT OR REPLACE INTO notes SELECT seq, note_id, filename, machine, "
                        "created_at, 'rewritten', prev_sha256, sha256 FROM notes")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        st.conn.execute("INSERT OR REPLACE INTO notes(note_id, filename, machine, created_at, body, "
                        "prev_sha256, sha256) SELECT note_id, filename, machine, created_at, "
                        "'rewritten', prev_sha256, sha256 FROM notes")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        st.conn.execute("INSERT INTO notes SELECT * FROM notes WHERE true ON CONFLICT DO UPDATE SET body='x'")
    assert st.conn.execute("SELECT seq, body FROM notes").fetchall() == [(1, "first")]
    st.append_note("m1", NOTE, "second")  # appending still works
    assert st.verify() == []


def test_note_chain_and_tamper_detection(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    with Store.open(path) as st:
        for i in range(5):
            st.append_note(f"m{i % 2}", NOTE, f"entry {i}")
        rows = st.conn.execute("SELECT prev_sha256, sha256 FROM notes ORDER BY seq").fetchall()
        assert rows[0][0] == GENESIS
        assert all(rows[i][0] == rows[i - 1][1] for i in range(1, 5))
        assert st.verify() == []
    tampered = tmp_path / "tampered.sqlite3"
    shutil.copy(path, tampered)
    raw = sqlite3.connect(tampered)
    raw.execute("DROP TRIGGER notes_append_only_update")
    raw.execute("UPDATE notes SET body='rewritten' WHERE seq=3")
    raw.commit()
    raw.close()
    with Store.open(tampered) as st:
        problems = st.verify()
        assert len(problems) == 1 and "entry 3" in problems[0] and NOTE in problems[0]
    # A forger who also recomputes the row's own hash is caught at the next link.
    forged = tmp_path / "forged.sqlite3"
    shutil.copy(path, forged)
    raw = sqlite3.connect(forged)
    raw.execute("DROP TRIGGER notes_append_only_update")
    prev, note_id, fn, machine, created = raw.execute(
        "SELECT prev_sha256, note_id, filename, machine, created_at FROM notes WHERE seq=2").fetchone()
    raw.execute("UPDATE notes SET body='forged', sha256=? WHERE seq=2", (
        chain_hash(prev, note_id, fn, machine, created, "forged"),))
    raw.commit()
    raw.close()
    with Store.open(forged) as st:
        assert ["entry 3" in p for p in st.verify()] == [True]
    deleted = tmp_path / "deleted.sqlite3"
    shutil.copy(path, deleted)
    raw = sqlite3.connect(deleted)
    raw.execute("DROP TRIGGER notes_append_only_delete")
    raw.execute("DELETE FROM notes WHERE seq=4")
    raw.commit()
    raw.close()
    with Store.open(deleted) as st:
        assert ["entry 5" in p for p in st.verify()] == [True]


def test_note_id_idempotency_and_refusals(st: Store) -> None:
    path, stored = st.append_note("m1", NOTE, "once", note_id="note-0001")
    assert (path, stored) == (f"{NOTES_DIR}/{NOTE}", True)
    assert st.append_note("m1", NOTE, "once", note_id="note-0001") == (path, False)
    assert st.append_note("m2", NOTE, "other text", note_id="note-0001") == (path, False)
    assert st.counts()["notes"] == 1
    for bad in ("notes.md", "2026-02-30T00-00-00-x.md", "../" + NOTE, "2026-01-31T09-30-00-X.md"):
        with pytest.raises(NoteError):
            st.append_note("m1", bad, "text")
    with pytest.raises(NameRuleError):
        st.append_note("Bad Machine", NOTE, "text")
    for bad_id in ("short", "x" * 129):
        with pytest.raises(NoteError, match="note id"):
            st.append_note("m1", NOTE, "text", note_id=bad_id)
    # The server refuses with the words of the one note rule, as the tool does (rules.check_note).
    with pytest.raises(NoteError, match="non-empty"):
        st.append_note("m1", NOTE, "  \n ")
    with pytest.raises(NoteError, match="longer"):
        st.append_note("m1", NOTE, "x" * (64 * 1024 + 1))
    with pytest.raises(NoteError, match="UTF-8"):
        st.append_note("m1", NOTE, "bad \udc80 text")
    assert st.counts()["notes"] == 1


def test_note_file_renders_every_entry_in_order(st: Store) -> None:
    other = "2026-02-01T00-00-00-other.md"
    st.append_note("laptop", NOTE, "first entry\n\n")
    st.append_note("desktop", other, "elsewhere")
    st.append_note("desktop", NOTE, "second entry")
    st.append_note("laptop", NOTE, "third entry")
    text = exported(st)[f"{NOTES_DIR}/{NOTE}"]
    heads = re.findall(r"^## (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ) · ([a-z]+)$", text, re.M)
    assert [m for _, m in heads] == ["laptop", "desktop", "laptop"]
    assert [t for t, _ in heads] == sorted(t for t, _ in heads)
    assert text.index("first entry") < text.index("second entry") < text.index("third entry")
    assert "elsewhere" not in text
    assert re.fullmatch(r"## \S+ · laptop\n\n```\nfirst entry\n```\n\n## \S+ · desktop\n\n```\n"
                        r"second entry\n```\n\n## \S+ · laptop\n\n```\nthird entry\n```\n", text)
    assert exported(st)[f"{NOTES_DIR}/{other}"].endswith("· desktop\n\n```\nelsewhere\n```\n")
    assert st.note_generation() == 4


# --- export, manifest, pull, forget ------------------------------------------------------------

def test_export_and_manifest_paths(st: Store) -> None:
    ingest(st, "m1", "codex", "codex", files({"MEMORY.md": "a", "rollout_summaries/r.md": "b"}))
    ingest(st, "m2", "claude-code", "claude-code", files({"proj/x.md": "c"}))
    st.append_note("m1", NOTE, "n")
    out = list(st.export())
    assert [p for p, _, _ in out] == [
        "machines/m1/codex/MEMORY.md", "machines/m1/codex/rollout_summaries/r.md",
        "machines/m2/claude-code/proj/x.md", f"{NOTES_DIR}/{NOTE}"]
    assert all(sha == sha256_text(text) for _, sha, text in out)
    assert st.manifest() == {p: s for p, s, _ in out}
    keys = [ns.key for ns in st.namespaces().every()]
    assert keys == ["machines/m1/codex", "machines/m2/claude-code", NOTES_DIR]


def test_pull_leaves_out_the_bodies_the_client_has(st: Store) -> None:
    ingest(st, "m1", "notes", "markdown", files({"a.md": "A", "b.md": "B"}))
    ingest(st, "m2", "notes", "markdown", files({"x.md": "A", "y.md": "Y"}))
    _, _, upserts, _ = st.pull({}, have={sha256_text("A")})
    assert {p: t for p, _, t in upserts} == {
        "machines/m1/notes/a.md": None, "machines/m1/notes/b.md": "B",
        "machines/m2/notes/x.md": None, "machines/m2/notes/y.md": "Y"}


def test_pull_sends_only_changes_and_removals(st: Store) -> None:
    ingest(st, "m1", "notes", "markdown", files({"a.md": "A", "b.md": "B", "c.md": "C"}))
    ingest(st, "m2", "notes", "markdown", files({"x.md": "X"}))
    st.append_note("m1", NOTE, "one")
    namespaces, full, upserts, removals = st.pull({})
    assert full == {"machines/m1/notes", "machines/m2/notes", NOTES_DIR} and removals == []
    assert sorted(p for p, _, _ in upserts) == sorted(st.manifest())
    known = {ns.key: ns.generation for ns in namespaces.every()}
    _, full, upserts, removals = st.pull(known)
    assert (full, list(upserts), removals) == (set(), [], [])
    ingest(st, "m1", "notes", "markdown", files({"a.md": "A", "b.md": "B2", "d.md": "D"}))
    st.append_note("m2", NOTE, "two")
    namespaces, full, upserts, removals = st.pull(known)
    assert full == set()
    assert {p: t for p, _, t in upserts} == {
        "machines/m1/notes/b.md": "B2", "machines/m1/notes/d.md": "D",
        f"{NOTES_DIR}/{NOTE}": exported(st)[f"{NOTES_DIR}/{NOTE}"]}
    assert removals == ["machines/m1/notes/c.md"]
    # A path that comes back is no longer a removal.
    middle = {ns.key: ns.generation for ns in namespaces.every()}
    ingest(st, "m1", "notes", "markdown", files({"a.md": "A", "b.md": "B2", "c.md": "C3", "d.md": "D"}))
    _, _, upserts, removals = st.pull(known)
    assert removals == [] and "machines/m1/notes/c.md" in {p for p, _, _ in upserts}
    _, _, upserts, removals = st.pull(middle)
    assert [p for p, _, _ in upserts] == ["machines/m1/notes/c.md"] and removals == []


def test_forget_then_recreate_is_full(st: Store) -> None:
    ingest(st, "m1", "notes", "markdown", files({"a.md": "A", "b.md": "B"}))
    ingest(st, "m1", "codex", "codex", files({"MEMORY.md": "M"}))
    ingest(st, "m2", "notes", "markdown", files({"a.md": "other"}))
    st.append_note("m1", NOTE, "stays")
    known = {ns.key: ns.generation for ns in st.namespaces().every()}
    notes_before = exported(st, NOTES_DIR)
    assert st.forget("m1", reason="laptop retired") == 3
    assert sorted(st.manifest()) == [f"{NOTES_DIR}/{NOTE}", "machines/m2/notes/a.md"]
    assert exported(st, NOTES_DIR) == notes_before
    assert st.conn.execute("SELECT count(*) FROM blobs WHERE body IN ('A','B','M')").fetchone()[0] == 0
    assert st.conn.execute("SELECT count(*) FROM files f LEFT JOIN namespaces n ON "
                           "n.id=f.namespace_id WHERE n.id IS NULL").fetchone()[0] == 0
    row = st.conn.execute("SELECT machine, source, files, reason FROM forgotten").fetchall()
    assert row == [("m1", None, 3, "laptop retired")]
    with pytest.raises(StoreError, match="holds nothing"):
        st.forget("m1")
    ingest(st, "m1", "notes", "markdown", files({"a.md": "A"}))
    namespaces, full, upserts, removals = st.pull(known)
    assert full == {"machines/m1/notes"}
    assert [p for p, _, _ in upserts] == ["machines/m1/notes/a.md"]
    assert removals == []
    assert "machines/m1/codex" not in {ns.key for ns in namespaces.every()}
    assert st.verify() == []


def test_forget_one_source_and_restored_store(st: Store) -> None:
    ingest(st, "m1", "notes", "markdown", files({"a.md": "A"}))
    ingest(st, "m1", "codex", "codex", files({"MEMORY.md": "M"}))
    assert st.forget("m1", "notes") == 1
    assert sorted(st.manifest()) == ["machines/m1/codex/MEMORY.md"]
    assert st.conn.execute("SELECT machine, source FROM forgotten").fetchall() == [("m1", "notes")]
    future = {"machines/m1/codex": 999}  # a client ahead of a store restored from backup
    _, full, upserts, _ = st.pull(future)
    assert full == {"machines/m1/codex"}
    assert [p for p, _, _ in upserts] == ["machines/m1/codex/MEMORY.md"]


# --- crash safety ------------------------------------------------------------------------------

CRASH_CHILD = """
import json, os, signal
from sharedmem.server.ingest import IncomingFile, ingest
from sharedmem.server.store import Store
db, data, limit, step = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
new = [IncomingFile(p, text=t) for p, t in json.loads(open(data).read()).items()]
st = Store.open(db)
calls = 0
def tick():
    global calls
    calls += 1
    if calls >= limit:
        os.kill(os.getpid(), signal.SIGKILL)
    return 0
st.conn.set_progress_handler(tick, step)
ingest(st, "m1", "notes", "markdown", new)
for _ in range(100000):  # keep counting after the commit, so late limits die there
    st.conn.execute("SELECT sum(size + length(path)) FROM files").fetchone()
sys.exit(3)
"""
STEP = 50


def crash_data() -> tuple[dict[str, str], dict[str, str]]:
    old = {f"d{i % 4}/f{i:03d}.md": f"old body {i}\n" * 20 for i in range(150)}
    new = {f"d{i % 4}/f{i:03d}.md": f"new body {i}\n" * 20 for i in range(60, 240)}
    new.update({f"d{i % 4}/f{i:03d}.md": old[f"d{i % 4}/f{i:03d}.md"] for i in range(60, 90)})
    return old, new


def test_sigkill_mid_ingest_leaves_old_or_new(tmp_path: Path) -> None:
    old, new = crash_data()
    base = tmp_path / "base.sqlite3"
    with Store.open(base) as st:
        ingest(st, "m1", "notes", "markdown", files(old))
        ingest(st, "m2", "notes", "markdown", files({"keep.md": "untouched"}))
        st.append_note("m2", NOTE, "a note")
        old_manifest = st.manifest()
    calibrate = tmp_path / "calibrate.sqlite3"
    shutil.copy(base, calibrate)
    with Store.open(calibrate) as st:
        calls = [0]

        def tick() -> int:
            calls[0] += 1
            return 0

        st.conn.set_progress_handler(tick, STEP)
        ingest(st, "m1", "notes", "markdown", [IncomingFile(p, text=t) for p, t in new.items()])
        st.conn.set_progress_handler(None, STEP)
        new_manifest = st.manifest()
    total = calls[0]
    assert total >= 40, total  # enough progress callbacks to spread 20 kill points over
    assert old_manifest != new_manifest
    data = tmp_path / "new.json"
    data.write_text(json.dumps(new))
    # 16 points inside the transaction (before its COMMIT ran), 4 after it committed.
    limits = sorted({max(1, round(total * k / 17)) for k in range(1, 17)} |
                    {total + 1, total + 2, total + 5, total + 20})
    assert len(limits) == 20
    outcomes = []
    for n, limit in enumerate(limits):
        db = tmp_path / f"crash{n}.sqlite3"
        shutil.copy(base, db)
        proc = child(CRASH_CHILD, str(db), str(data), str(limit), str(STEP))
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL, (limit, proc.returncode, err)
        with Store.open(db) as st:
            assert st.conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            assert st.verify() == []
            manifest = st.manifest()
        assert manifest in (old_manifest, new_manifest), limit
        outcomes.append("old" if manifest == old_manifest else "new")
    assert outcomes == ["old"] * 16 + ["new"] * 4, list(zip(limits, outcomes, strict=True))


# --- concurrency -------------------------------------------------------------------------------

NOTES_CHILD = """
import os, time
from sharedmem.server.store import Store
db, go, me, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
while not os.path.exists(go):
    time.sleep(0.005)
st = Store.open(db)
for j in range(count):
    name = f"2026-01-0{1 + j % 3}T00-00-00-shared-{j % 3}.md"
    path, stored = st.append_note(f"m{me}", name, f"process {me} note {j}", note_id=f"p{me}-n{j:04d}")
    assert stored
st.append_note(f"m{me}", "2026-01-01T00-00-00-race.md", "everyone sends this", note_id="same-id-for-all")
st.close()
"""


def run_note_writers(tmp_path: Path, db: Path, processes: int, count: int) -> None:
    go = tmp_path / "go"
    procs = [child(NOTES_CHILD, str(db), str(go), str(i), str(count)) for i in range(processes)]
    time.sleep(0.3)
    go.touch()
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert "locked" not in err and "busy" not in err


def test_concurrent_note_writers(tmp_path: Path) -> None:
    db = tmp_path / "store.sqlite3"
    Store.open(db).close()
    run_note_writers(tmp_path, db, 8, 50)
    with Store.open(db) as st:
        ids = [r[0] for r in st.conn.execute("SELECT note_id FROM notes WHERE note_id LIKE 'p%'")]
        assert len(ids) == 400 and len(set(ids)) == 400
        assert st.conn.execute("SELECT count(*) FROM notes").fetchone()[0] == 401
        assert st.verify() == []
        for me in range(8):  # each writer's entries are in its own order
            seqs = [r[0] for r in st.conn.execute(
                "SELECT note_id FROM notes WHERE machine=? AND note_id LIKE 'p%' ORDER BY seq",
                (f"m{me}",))]
            assert seqs == [f"p{me}-n{j:04d}" for j in range(50)]
        shared = exported(st)[f"{NOTES_DIR}/2026-01-01T00-00-00-shared-0.md"]
        assert shared.count("## ") == 8 * 17


def test_concurrent_first_open_of_a_new_store(tmp_path: Path) -> None:
    db = tmp_path / "fresh" / "store.sqlite3"
    run_note_writers(tmp_path, db, 8, 3)
    with Store.open(db) as st:
        assert st.schema_version() == SCHEMA_VERSION
        assert st.counts()["notes"] == 8 * 3 + 1
        assert st.verify() == []


# --- bodies and tombstones over their life (blob_lifecycle.py) ---------------------------------

def unused_bodies(st: Store) -> set[str]:
    return {r[0] for r in st.conn.execute(
        "SELECT body FROM blobs WHERE sha256 NOT IN (SELECT sha256 FROM files)")}


def test_forget_keeps_what_a_live_session_claims_and_deletes_the_rest_at_once(
        tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    with Store.open(path) as live, Store.open(path) as operator:
        ingest(operator, "m1", "notes", "markdown", files({"a.md": "A", "b.md": "shared"}))
        live.put_blobs([body("sent ahead"), body("shared")])  # a live session relies on these
        assert operator.forget("m1") == 2
        assert unused_bodies(operator) == {"sent ahead", "shared"}  # "A" went at once
        report = ingest(live, "m2", "notes", "markdown", [
            IncomingFile(p, sha256_text(t), len(t), 0, None, {})
            for p, t in (("x.md", "sent ahead"), ("y.md", "shared"))])
        assert report.refused == [] and report.accepted == 2
        assert live.finish() is not None  # its claims released: nothing left to collect
        assert unused_bodies(operator) == set() and operator.verify() == []


def test_a_pull_sends_a_namespace_whole_to_a_cache_older_than_its_compacted_tombstones(
        st: Store) -> None:
    ingest(st, "m1", "notes", "markdown", files({"a.md": "A", "b.md": "B", "c.md": "C"}))
    before = st.namespaces().machines[0].generation
    ingest(st, "m1", "notes", "markdown", files({"a.md": "A", "b.md": "B"}))  # c.md removed
    removed = st.namespaces().machines[0].generation
    ingest(st, "m1", "notes", "markdown", files({"a.md": "A"}))  # b.md removed
    assert st.pull({"machines/m1/notes": before})[3] == ["machines/m1/notes/b.md",
                                                          "machines/m1/notes/c.md"]
    now = int(time.time())
    st.conn.execute("UPDATE tombstone_times SET at=? WHERE generation=?",
                    (now - 8 * 24 * 3600, removed))  # c.md's removal is past the retention
    done = st.collect(now=now)
    assert done is not None and done.tombstones == 1
    _, full, upserts, removals = st.pull({"machines/m1/notes": before})
    assert full == {"machines/m1/notes"} and removals == []  # c.md's tombstone is gone
    assert [p for p, _, _ in upserts] == ["machines/m1/notes/a.md"]
    _, full, _, removals = st.pull({"machines/m1/notes": removed})
    assert full == set() and removals == ["machines/m1/notes/b.md"]  # newer ones stay


def test_a_body_a_file_stopped_using_is_kept_for_the_grace_then_collected(st: Store) -> None:
    st.set_history_days(0)  # no file history: no previous version keeps it (test_history.py)
    ingest(st, "m1", "notes", "markdown", files({"a.md": "old", "b.md": "moved"}))
    ingest(st, "m1", "notes", "markdown", files({"a.md": "new", "c.md": "moved"}))  # edit, rename
    assert unused_bodies(st) == {"old"}
    assert st.finish() is None  # within the grace: nothing is due, nothing written
    done = st.collect(now=int(time.time()) + 3601)
    assert done is not None and (done.bodies, done.bytes) == (1, 3)
    assert unused_bodies(st) == set() and st.verify() == []
    assert sorted(exported(st).values()) == ["moved", "new"]


def test_migration_marks_the_orphans_a_v1_store_holds(tmp_path: Path) -> None:
    path = old_store(tmp_path / "store.sqlite3", 1)
    with Store.open(path) as st:
        assert st.schema_version() == SCHEMA_VERSION
        assert unused_bodies(st) == {"# Beta\n"}  # version 1 left it when a file changed
        assert st.finish() is not None  # due at once: the end of the next session collects it
        assert unused_bodies(st) == set() and st.verify() == []
        assert len(exported(st, "machines/")) == 7


def test_counts_list_previous_versions_from_schema_3_on(tmp_path: Path) -> None:
    """A backup manifest's counts: an archive of schema 2 is counted as it was listed."""
    old = old_store(tmp_path / "v2.sqlite3", 2)
    conn = sqlite3.connect(old)
    assert Store(old, conn).counts() == {"namespaces": 4, "files": 6, "blobs": 9, "notes": 3}
    conn.close()
    with Store.open(tmp_path / "store.sqlite3") as st:
        ingest(st, "m1", "notes", "markdown", files({"a.md": "one"}))
        ingest(st, "m1", "notes", "markdown", files({"a.md": "two"}))
        assert st.counts() == {"namespaces": 1, "files": 1, "blobs": 2, "notes": 0, "versions": 1}


def test_a_commit_looks_its_bodies_up_again_once_its_session_was_taken_for_dead(
        tmp_path: Path) -> None:
    # A commit trusts the bodies its session stored while the session's claims stand; once
    # another process took it for dead (its claims, and a body, went) and it claimed anew under
    # a new row, the body gone is refused as missing-body, not written as a broken reference.
    path = tmp_path / "store.sqlite3"
    first, later = "stored first", "stored after the session was taken for dead"
    with Store.open(path) as live, Store.open(path) as other:
        live.put_blobs([body(first)])
        with other.transaction() as conn:
            conn.execute("DELETE FROM sessions")  # its claims go with it
            conn.execute("DELETE FROM blobs WHERE sha256=?", (sha256_text(first),))
        live.put_blobs([body(later)])
        report = ingest(live, "m1", "notes", "markdown", [
            IncomingFile(p, sha256_text(t), len(t), 0, None, {})
            for p, t in (("a.md", first), ("b.md", later))])
        assert [(r["path"], r["reason"]) for r in report.refused] == [("a.md", "missing-body")]
        assert exported(live) == {"machines/m1/notes/b.md": later} and live.verify() == []


def test_need_reads_a_namespace_sent_again_whole_not_each_of_its_bodies(st: Store) -> None:
    texts = {f"{i:03d}.md": f"text {i}" for i in range(40)}
    ingest(st, "m1", "notes", "markdown", files(texts))
    st.put_blobs([(sha256_text("loose"), 5, b"loose")])  # held, used by no file
    asked = [sha256_text(t) for t in texts.values()] + [sha256_text("loose"), "ab" * 32]
    statements: list[str] = []
    st.conn.set_trace_callback(statements.append)
    assert st.need(asked, ("m1", "notes")) == ["ab" * 32]
    st.conn.set_trace_callback(None)
    looked_up = [s for s in statements if "FROM blobs b WHERE sha256 IN" in s]
    assert len(looked_up) == 1 and looked_up[0].count("'") == 4  # the two its files do not use
    # Without the namespace, or for one that holds many more files than are asked about,
    # each is looked up: the same answer.
    assert st.need(asked) == ["ab" * 32]
    statements.clear()
    st.conn.set_trace_callback(statements.append)
    assert st.need(asked[-3:], ("m1", "notes")) == ["ab" * 32]
    st.conn.set_trace_callback(None)
    assert not any("FROM files WHERE namespace_id" in s for s in statements)


PLAIN = ["s.sqlite3", "a/s.sqlite3", "/srv/store/s.sqlite3", "../s.sqlite3", "a/../s",
         " a/ b ", "a\\b", "a/~/s", "/~/s", "...", "a/.s", "a/.."]
NOT_PLAIN = ["~s", "~/s", "./~s", "a//s", "//a/s", "///a/s", "a/./s", "./s", "a/", "/", ".", "",
             "a/."]


@pytest.mark.parametrize("text", PLAIN + NOT_PLAIN)
def test_a_plain_path_is_the_path_pathlib_makes_of_it(text: str) -> None:
    """`serve` opens a plain path by its text: it must name the file its Path would, alike."""
    from sharedmem.server.store import plain_path
    assert plain_path(text) == (text in PLAIN)
    if plain_path(text):  # and expanduser keeps it: it does not start with `~`
        assert str(Path(text)) == text and not text.startswith("~")


def test_a_store_opened_by_its_text_says_the_same_as_by_its_path(tmp_path: Path) -> None:
    """The errors of a store opened without pathlib name it as pathlib does."""
    bad = tmp_path / "not-sqlite.sqlite3"
    bad.write_bytes(b"this is not a database, it is far too long to be an empty one" * 100)
    said = []
    for path in (str(bad), bad):
        with pytest.raises(StoreError) as caught:
            Store.open(path)
        said.append(str(caught.value))
    assert said[0] == said[1] and str(bad) in said[0]
