"""Backups on real stores: create, verify, restore, the migration hook, the v1 fixture."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import backup_manifest, flip, make_store

from sharedmem.core import BackupError
from sharedmem.server import backup, catalog, schema, store
from sharedmem.server.ingest import IncomingFile, ingest
from sharedmem.server.store import Store

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "store-v1.sql"


def child(code: str, store_path: Path, *args: str) -> subprocess.Popen:
    """A separate process running `code` against the store (a stand-in for a running sync)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), str(store_path), *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


HOLD_OPEN = """
    import sys
    from sharedmem.server.store import Store
    s = Store.open(sys.argv[1])
    s.counts()
    if sys.argv[2] == "write":
        with s.transaction() as conn:
            conn.execute("INSERT INTO meta VALUES ('uncommitted', 'x')")
            print("ready", flush=True)
            sys.stdin.readline()
    else:
        print("ready", flush=True)
        sys.stdin.readline()
    s.close()
"""

WRITE_LOOP = """
    import sys, pathlib
    from sharedmem.server.ingest import IncomingFile, ingest
    from sharedmem.server.store import Store
    s = Store.open(sys.argv[1])
    stop = pathlib.Path(sys.argv[2])
    n = 0
    while not stop.exists():
        n += 1
        s.append_note("writer", "2026-02-01T00-00-00-loop.md", f"entry {n}")
        ingest(s, "writer", "codex", "codex", [IncomingFile("MEMORY.md", text=f"version {n}")])
        if n == 5:
            print("ready", flush=True)
    print(n, flush=True)
"""


def stop(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate("\n", timeout=30)
    assert proc.returncode == 0
    return out


def test_create_makes_a_checked_self_contained_archive(tmp_path: Path) -> None:
    path = make_store(tmp_path / "store.sqlite3")
    info = backup.create(path)
    folder = tmp_path / "backups"
    assert info.path.parent == folder and info.state == "ok" and not info.protected
    assert info.path.name.startswith("store-") and info.path.name.endswith("Z.sqlite3")
    assert sorted(p.name for p in folder.iterdir()) == sorted([info.path.name, "manifest.json"])
    data = info.path.read_bytes()
    assert data[18:20] == b"\x01\x01"  # rollback-journal mode: no -wal/-shm when opened
    entry = backup_manifest(folder)[info.path.name]
    assert entry["sha256"] == hashlib.sha256(data).hexdigest() == info.sha256
    assert entry["size"] == len(data)
    with Store.open(path) as s:
        assert entry["counts"] == s.counts() == {"namespaces": 2, "files": 3, "blobs": 3, "notes": 2,
                                                 "versions": 0}
    assert entry["schema_version"] == schema.SCHEMA_VERSION
    assert backup.verify(info.path) == []
    assert sorted(p.name for p in folder.iterdir()) == sorted([info.path.name, "manifest.json"])


def test_create_names_are_unique_and_labels_checked(tmp_path: Path) -> None:
    path = make_store(tmp_path / "store.sqlite3")
    infos = [backup.create(path, label="nightly", dest=tmp_path / "elsewhere") for _ in range(3)]
    assert len({i.path for i in infos}) == 3
    assert all(i.path.name.endswith("-nightly.sqlite3") for i in infos)
    assert len(backup_manifest(tmp_path / "elsewhere")) == 3
    assert all(backup.verify(i.path) == [] for i in infos)
    with pytest.raises(BackupError, match="backup label"):
        backup.create(path, label="Bad Label")
    with pytest.raises(BackupError, match="absent.sqlite3"):
        backup.create(tmp_path / "absent.sqlite3")


def test_verify_reports_a_flipped_byte_anywhere(tmp_path: Path) -> None:
    info = backup.create(make_store(tmp_path / "store.sqlite3"))
    size = info.path.stat().st_size
    for offset in (0, 18, 100, 4096 + 10, size // 2, size - 1):
        flip(info.path, offset)
        problems = backup.verify(info.path)
        assert any("SHA-256" in p for p in problems), (offset, problems)
        assert all(str(info.path) in p for p in problems)
        flip(info.path, offset)
        assert backup.verify(info.path) == []
    assert not list(info.path.parent.glob("*-wal")) and not list(info.path.parent.glob("*-shm"))


def test_verify_rechecks_the_note_chain_even_when_the_checksum_was_updated(tmp_path: Path) -> None:
    info = backup.create(make_store(tmp_path / "store.sqlite3"))
    conn = sqlite3.connect(info.path)
    conn.execute("DROP TRIGGER notes_append_only_update")
    conn.execute("UPDATE notes SET body='rewritten' WHERE seq=1")
    conn.commit()
    conn.close()
    entries = backup_manifest(info.path.parent)
    entries[info.path.name]["sha256"] = hashlib.sha256(info.path.read_bytes()).hexdigest()
    entries[info.path.name]["size"] = info.path.stat().st_size
    (info.path.parent / "manifest.json").write_text(json.dumps({"format": 1, "backups": entries}))
    problems = backup.verify(info.path)
    assert any("note chain broken" in p for p in problems), problems


def test_verify_missing_and_unlisted(tmp_path: Path) -> None:
    info = backup.create(make_store(tmp_path / "store.sqlite3"))
    stray = info.path.with_name("store-20200101T000000Z.sqlite3")
    shutil.copyfile(info.path, stray)
    assert any("not listed" in p for p in backup.verify(stray))
    assert "does not exist" in backup.verify(tmp_path / "nope.sqlite3")[0]


def test_backup_while_a_sync_holds_a_write_transaction(tmp_path: Path) -> None:
    path = make_store(tmp_path / "store.sqlite3")
    proc = child(HOLD_OPEN, path, "write")
    try:
        started = time.monotonic()
        info = backup.create(path)
        assert time.monotonic() - started < 20  # a hang guard: it never waits for the writer
    finally:
        stop(proc)
    assert backup.verify(info.path) == []
    conn = sqlite3.connect(info.path)
    assert conn.execute("SELECT count(*) FROM meta WHERE key='uncommitted'").fetchone()[0] == 0
    conn.close()
    with Store.open(path) as s:  # the writer committed after the backup was taken
        assert s.conn.execute("SELECT count(*) FROM meta WHERE key='uncommitted'").fetchone()[0] == 1


def test_backup_during_continuous_writes_is_consistent(tmp_path: Path) -> None:
    path = make_store(tmp_path / "store.sqlite3")
    flag = tmp_path / "stop"
    proc = child(WRITE_LOOP, path, str(flag))
    try:
        infos = [backup.create(path) for _ in range(3)]
    finally:
        flag.touch()
        written = int(stop(proc).split()[-1])
    notes = [i.counts["notes"] for i in infos]
    assert notes == sorted(notes) and 2 + 5 <= notes[0] and notes[-1] <= 2 + written
    for info in infos:
        assert backup.verify(info.path) == []
    assert not list((tmp_path / "backups").glob("*-wal"))


def test_restore_refuses_a_store_in_use_even_with_force(tmp_path: Path) -> None:
    path = make_store(tmp_path / "store.sqlite3")
    info = backup.create(path)
    for mode in ("idle", "write"):
        proc = child(HOLD_OPEN, path, mode)
        try:
            for force in (False, True):
                with pytest.raises(BackupError, match="in use"):
                    backup.restore(info.path, path, force=force)
        finally:
            stop(proc)
    assert [i.label for i in catalog.list_backups(tmp_path / "backups")] == [""]


def test_restore_refuses_a_newer_store_unless_forced_and_keeps_it(tmp_path: Path) -> None:
    path = make_store(tmp_path / "store.sqlite3")
    info = backup.create(path)
    with Store.open(path) as s:
        s.append_note("alpha", "2026-02-02T00-00-00-later.md", "written after the backup")
        newer = s.counts()
    with pytest.raises(BackupError, match="newer than the backup"):
        backup.restore(info.path, path)
    with Store.open(path) as s:
        assert s.counts() == newer
    kept = backup.restore(info.path, path, force=True).kept
    assert kept is not None and kept.parent == tmp_path / "backups"
    assert not (tmp_path / "store.sqlite3-wal").exists()
    assert not (tmp_path / "store.sqlite3-shm").exists()
    with Store.open(path) as s:
        assert s.counts() == info.counts and s.verify() == []
    listed = {i.path: i for i in catalog.list_backups(tmp_path / "backups")}
    assert listed[kept].protected and listed[kept].state == "ok" and listed[kept].label == "replaced"
    assert listed[kept].counts == newer
    assert backup.verify(kept) == []
    assert backup.restore(kept, path).kept is not None  # the kept store restores back, not newer
    with Store.open(path) as s:
        assert s.counts() == newer


def test_restore_never_uses_a_damaged_archive(tmp_path: Path) -> None:
    path = make_store(tmp_path / "store.sqlite3")
    info = backup.create(path)
    flip(info.path, info.size - 1)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(BackupError, match="failed verification"):
        backup.restore(info.path, path, force=True)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def test_restore_into_a_missing_or_unreadable_store(tmp_path: Path) -> None:
    info = backup.create(make_store(tmp_path / "store.sqlite3"))
    fresh = tmp_path / "new" / "store.sqlite3"
    assert backup.restore(info.path, fresh).kept is None
    with Store.open(fresh, create=False) as s:
        assert s.counts() == info.counts
    broken = tmp_path / "broken" / "store.sqlite3"
    broken.parent.mkdir()
    broken.write_bytes(b"this is not sqlite" * 300)
    with pytest.raises(BackupError, match="cannot be read"):
        backup.restore(info.path, broken)
    (broken.parent / "store.sqlite3-wal").write_bytes(b"stale wal")
    (broken.parent / "store.sqlite3-shm").write_bytes(b"stale shm")
    kept = backup.restore(info.path, broken, force=True).kept
    assert kept is not None and kept.read_bytes() == b"this is not sqlite" * 300
    assert kept.with_name(kept.name + "-wal").read_bytes() == b"stale wal"  # kept beside, not lost
    assert sorted(p.name for p in broken.parent.iterdir()) == ["backups", "store.sqlite3"]
    with Store.open(broken, create=False) as s:
        assert s.verify() == []


def test_migration_hook_takes_a_protected_verified_backup(tmp_path: Path) -> None:
    path = make_store(tmp_path / "store.sqlite3")
    backup.migration_hook(path, 1)
    [info] = catalog.list_backups(tmp_path / "backups")
    assert info.protected and info.label == "pre-migrate-v1" and info.state == "ok"
    assert info.path.name.endswith("-pre-migrate-v1.sqlite3")
    assert backup.verify(info.path) == []
    folder = tmp_path / "backups"
    assert catalog.prune(folder, keep_last=1, daily=0, weekly=0) == []


def load_fixture(path: Path) -> tuple[list[tuple], list[tuple]]:
    conn = sqlite3.connect(path)
    conn.executescript(FIXTURE.read_text(encoding="utf-8"))
    conn.execute("PRAGMA user_version=1")
    conn.close()
    return contents(path)


def contents(path: Path) -> tuple[list[tuple], list[tuple]]:
    conn = sqlite3.connect(path)
    files = conn.execute("SELECT n.machine, n.source, f.path, b.body FROM files f JOIN namespaces n "
                         "ON n.id=f.namespace_id JOIN blobs b ON b.sha256=f.sha256 ORDER BY 1,2,3"
                         ).fetchall()
    notes = conn.execute("SELECT * FROM notes ORDER BY seq").fetchall()
    conn.close()
    return files, notes


def test_v1_fixture_opens_intact(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    files, notes = load_fixture(path)
    assert len(files) == 7 and len(notes) == 3
    assert ("beta", "team-notes", "ops/deploy/checklist.md", "1. backup\n2. migrate\n3. verify\n") in files
    with Store.open(path) as s:
        assert s.schema_version() == schema.SCHEMA_VERSION and s.verify() == []
    assert contents(path) == (files, notes)


def test_migration_from_the_v1_fixture_backs_up_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    path = tmp_path / "store.sqlite3"
    files, notes = load_fixture(path)
    calls: list[tuple[Path, int]] = []

    def hook(p: Path, old: int) -> None:
        calls.append((p, old))
        backup.migration_hook(p, old)

    monkeypatch.setattr(store, "MIGRATIONS", [*store.MIGRATIONS, "CREATE TABLE t_probe(x);"])
    with Store.open(path, before_migrate=hook) as s:
        assert s.schema_version() == schema.SCHEMA_VERSION + 1 and s.verify() == []
        assert s.conn.execute("SELECT count(*) FROM t_probe").fetchone() == (0,)
    assert calls == [(path, 1)]
    assert contents(path) == (files, notes)
    [info] = catalog.list_backups(tmp_path / "backups")
    assert info.protected and info.label == "pre-migrate-v1" and info.schema_version == 1
    assert backup.verify(info.path) == []
    assert contents(info.path) == (files, notes)


# --- what clients see after a restore ------------------------------------------------------------

def pulled(st: Store, known: dict[str, int], cache: dict[str, str]) -> dict[str, int]:
    """Take one pull into `cache` (path -> text) as a client does; the generations it now knows."""
    namespaces, full, upserts, removals = st.pull(known)
    for key in full:
        for path in [p for p in cache if p.startswith(key + "/")]:
            del cache[path]
    for path in removals:
        cache.pop(path, None)
    cache.update({path: text for path, _, text in upserts})
    return {ns.key: ns.generation for ns in namespaces.every()}


def test_after_a_restore_a_clients_next_pull_is_what_the_store_holds(tmp_path: Path) -> None:
    # The restore rewinds the generations: the first note after it takes the sequence number
    # of a note it lost, and a namespace's next commit a generation clients already hold.
    path = tmp_path / "store.sqlite3"
    cache: dict[str, str] = {}
    with Store.open(path) as st:
        ingest(st, "m1", "notes", "markdown", [IncomingFile("a.md", text="A")])
        st.append_note("m1", "2026-01-31T09-30-00-kept.md", "before the backup")
        known = pulled(st, {}, cache)
    info = backup.create(path)
    with Store.open(path) as st:
        ingest(st, "m1", "notes", "markdown", [IncomingFile("a.md", text="A2"),
                                               IncomingFile("b.md", text="B")])
        st.append_note("m1", "2026-01-31T09-30-00-lost.md", "after the backup")
        known = pulled(st, known, cache)
    with pytest.raises(BackupError, match="newer than the backup"):
        backup.restore(info.path, path)
    done = backup.restore(info.path, path, force=True)
    assert done.generation > max(known.values())
    again = backup.restore(info.path, path)  # its own renumbering is not newer than the archive
    assert again.generation > done.generation
    with Store.open(path) as st:
        st.append_note("m2", "2026-01-31T09-30-00-new.md", "after the restore")
        ingest(st, "m1", "notes", "markdown", [IncomingFile("a.md", text="A3")])
        known = pulled(st, known, cache)
        assert cache == {p: t for p, _, t in st.export()}
        assert any("after the restore" in t for t in cache.values())
        assert not any("after the backup" in t for t in cache.values())
        st.append_note("m2", "2026-01-31T09-30-00-new.md", "and once more")
        _, full, upserts, _ = st.pull(known)  # back to changes only
        assert full == set() and [p for p, _, _ in upserts] == [
            "extensions/ad_hoc/notes/2026-01-31T09-30-00-new.md"]


def test_a_restore_says_every_client_pulls_the_store_whole(tmp_path: Path) -> None:
    from conftest import run_cli, write_config
    store = tmp_path / "server" / "store.sqlite3"
    store.parent.mkdir()
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    configs = {}
    for machine in ("laptop", "desk"):
        configs[machine] = write_config(tmp_path / machine / "client.json", machine,
                                        {"kind": "local", "store": str(store)}, [],
                                        tmp_path / machine / "cache")

    def note(machine: str, name: str, text: str) -> None:
        done = run_cli("note", "--config", str(configs[machine]), name, text, env=env)
        assert done.returncode == 0, done.stderr

    def notes_of(machine: str) -> dict[str, str]:
        folder = tmp_path / machine / "cache" / "extensions" / "ad_hoc" / "notes"
        return {p.name: p.read_text() for p in sorted(folder.glob("*.md"))}

    note("laptop", "2026-01-31T09-30-00-kept.md", "before the backup")
    assert run_cli("backup", "create", "--store", str(store), env=env).returncode == 0
    note("laptop", "2026-01-31T09-30-00-lost.md", "after the backup")
    assert "2026-01-31T09-30-00-lost.md" in notes_of("laptop")
    archive = next((store.parent / "backups").glob("store-*.sqlite3"))
    done = run_cli("backup", "restore", "--store", str(store), "--force", str(archive), env=env)
    assert done.returncode == 0, done.stderr
    assert "each client's next sync pulls every file and note whole" in done.stdout
    note("desk", "2026-01-31T09-30-00-new.md", "after the restore")
    assert run_cli("sync", "--config", str(configs["laptop"]), env=env).returncode == 0
    with Store.open(store) as st:
        held = {p.rsplit("/", 1)[1]: t for p, _, t in st.export()}
    assert notes_of("laptop") == held
    assert sorted(held) == ["2026-01-31T09-30-00-kept.md", "2026-01-31T09-30-00-new.md"]
