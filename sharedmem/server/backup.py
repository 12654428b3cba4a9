"""Backups of the server's store: create, verify, restore, and the pre-migration hook.

An archive is one self-contained SQLite file (rollback-journal mode, never a -wal/-shm beside it);
`catalog.py` keeps the backups folder's `manifest.json`: it names and lists each archive and
prunes old ones.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import stat
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

from sharedmem.clock import utc_now
from sharedmem.core import BackupError
from sharedmem.rules import name_problem
from sharedmem.server import catalog
from sharedmem.server.disk_full import DiskFull, disk_full, full_error
from sharedmem.server.store import BUSY_TIMEOUT_MS, Store, restart_generations

IN_USE_TIMEOUT = 0.2
_MARKS = ("schema_version", "generation", "note_seq")


def create(store: Path, *, dest: Path | None = None, protect: bool = False,
           label: str = "") -> catalog.BackupInfo:
    """Copy the live store with SQLite's online backup (safe during syncs), check it, list it."""
    store = Path(store)
    problem = name_problem(label, "backup label") if label else None
    if problem:
        raise BackupError(problem)
    if not store.is_file():
        raise BackupError(f"store {store} does not exist: pass the right --store")
    folder = Path(dest) if dest is not None else catalog.backups_folder(store)
    created = utc_now()
    try:
        tmp = _temp_in(folder)
    except OSError as exc:
        raise _unwritable(store, folder, exc) from None
    try:
        details = _copy_checked(store, tmp)
        entry = {"created": created, "protected": protect, "label": label,
                 "source": str(store), **details}
        path = catalog.register(folder, tmp, entry)
    except OSError as exc:  # a full disk: what was written of the archive is deleted
        raise _unwritable(store, folder, exc) from None
    finally:
        _discard(tmp)
    return catalog.entry_info(path, entry, "ok")


def _unwritable(store: Path, folder: Path, exc: OSError | sqlite3.Error) -> BackupError | DiskFull:
    """Why a backup of `store` could not be written into `folder`: a full disk, or the folder."""
    if disk_full(exc, folder):
        return full_error(folder, exc, f"the backup of store {store} cannot be written to {folder}")
    said = exc.strerror if isinstance(exc, OSError) else str(exc)
    return BackupError(f"the backup of store {store} cannot be written to {folder} ({said}): check "
                       "that the folder is writable, or pass another --dest")


def verify(archive: Path) -> list[str]:
    """Every problem with an archive: checksum and size against the manifest, integrity, chain."""
    archive = Path(archive)
    if not archive.is_file():
        return [f"backup {archive} does not exist: pick one from `backup list`"]
    try:
        entry = catalog.read_manifest(archive.parent).get(archive.name)
    except BackupError as exc:
        return [str(exc)] + _check_copy(archive, None)
    return _listing_problems(archive, entry) + _check_copy(archive, entry)


class Restored(NamedTuple):
    """What a restore did: where the replaced store was kept, and its new generations' floor.

    `kept` is None when there was no store to replace; `generation` is what every namespace of
    the restored store is at, a generation no client had seen.
    """

    kept: Path | None
    generation: int


def restore(archive: Path, store: Path, *, force: bool = False,
            folder: Path | None = None) -> Restored:
    """Replace `store` with a verified archive, whose generations start past every client's.

    Refused when another process has the store open (never overridden: a live writer's -wal
    would corrupt the restored file), and, unless `force`, when the store is unreadable or
    newer than the archive (schema version, ingest generation or newest note). The replaced
    store is kept, protected, in `folder` (default `backups/` beside the store). Clients then
    converge on the restored store at their next sync: it renumbers its generations past every
    one the replaced store (or the clock) could have given them (`store.restart_generations`),
    so each pull sends every namespace and the notes whole.
    """
    archive, store = Path(archive), Path(store)
    if not archive.is_file():
        raise BackupError(f"backup {archive} does not exist: pick one from `backup list`")
    entry = catalog.read_manifest(archive.parent).get(archive.name)
    problems = [] if entry is None and force else _listing_problems(archive, entry)
    problems += _check_copy(archive, entry)
    if problems:
        raise BackupError(f"backup {archive} failed verification, so store {store} was left "
                          f"alone: {'; '.join(problems)}; pick another backup from `backup list`")
    with contextlib.closing(_open_ro(archive)) as conn:
        archived = _details(conn)
    mode = stat.S_IMODE(store.stat().st_mode) if store.exists() else None
    kept, replaced = _retire(store, archived, force, folder) if store.exists() else (None, None)
    store.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_in(store.parent)
    try:
        shutil.copyfile(archive, tmp)
        catalog.fsync(tmp)
        if catalog.sha256_file(tmp) != (entry["sha256"] if entry else catalog.sha256_file(archive)):
            raise BackupError(f"the copy of {archive} at {tmp} differs from it: check the disk "
                              f"under {store.parent} and run restore again")
        floor = _restart(tmp, [archived, replaced])
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, store)
        catalog.fsync(store.parent)
    finally:
        _discard(tmp)
    return Restored(kept, floor)


def _restart(copy: Path, seen: list[dict[str, Any] | None]) -> int:
    """Renumber the restored copy's generations past every one a client may hold; the floor.

    Past the archive's and the replaced store's generations and notes generations, and past
    the clock in microseconds, which covers a replaced store that could not be read: its
    generations grew by one a commit since the last restore's floor, never by a million a
    second.
    """
    marks = [time.time_ns() // 1000]
    marks += [int(d.get(k) or 0) for d in seen if d for k in ("generation", "notes_generation")]
    floor = max(marks) + 1
    conn = sqlite3.connect(copy, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        restart_generations(conn, floor)
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        if disk_full(exc, copy):
            raise full_error(copy.parent, exc, f"the restore into {copy.parent}") from None
        raise BackupError(f"the restored copy {copy} could not be renumbered ({exc}): check the "
                          "disk and run restore again") from None
    finally:
        conn.close()
    catalog.fsync(copy)
    return floor


def migration_hook(path: Path, old_version: int) -> None:
    """Store.open's `before_migrate`: a verified, protected backup before the schema changes."""
    try:
        info = create(path, protect=True, label=f"pre-migrate-v{old_version}")
    except DiskFull as exc:
        raise DiskFull(f"store {path} was not migrated (schema {old_version}): a verified backup "
                       f"comes first, and {exc}") from None
    problems = verify(info.path)
    if problems:
        raise BackupError(f"the pre-migration backup {info.path} failed verification "
                          f"({'; '.join(problems)}), so store {path} was not migrated: check "
                          "the disk and open the store again")


def _copy_checked(store: Path, tmp: Path) -> dict[str, object]:
    """Online-backup `store` into `tmp`, make it self-contained, check it; returns its details."""
    try:
        src = sqlite3.connect(store, timeout=BUSY_TIMEOUT_MS / 1000)
    except sqlite3.Error as exc:
        raise BackupError(f"store {store} cannot be opened ({exc}): pass the right --store") from None
    dst = sqlite3.connect(tmp, isolation_level=None)
    try:
        src.backup(dst)
        dst.execute("PRAGMA journal_mode=DELETE").fetchone()
        problems = Store(tmp, dst).verify()
        details = _details(dst)
    except sqlite3.Error as exc:
        if disk_full(exc, tmp):
            raise full_error(tmp.parent, exc, f"the backup of store {store} cannot be written "
                             f"to {tmp.parent}") from None
        raise BackupError(f"store {store} could not be copied to {tmp.parent} ({exc}): check that "
                          "it is a shared-memory store and that the folder is writable") from None
    finally:
        src.close()
        dst.close()
    if problems:
        raise BackupError(f"the copy of store {store} failed its checks ({'; '.join(problems)}): "
                          "the live store may be damaged; run `doctor --store` and restore an "
                          "older backup")
    catalog.fsync(tmp)
    return {"size": tmp.stat().st_size, "sha256": catalog.sha256_file(tmp), **details}


def _details(conn: sqlite3.Connection) -> dict[str, Any]:
    """Schema version, counts and the newest-data marks of an open store.

    `generation` and `note_seq` say whether a store is newer than an archive;
    `notes_generation` and `restored_generation` (the floor of the restore that made it, or 0)
    let a restore renumber past what clients hold.
    """
    copy = Store(Path(), conn)
    meta = dict(conn.execute("SELECT key, value FROM meta WHERE key IN ('generation', "
                             "'restored_generation')").fetchall())
    notes = copy.namespaces().notes
    return {"schema_version": copy.schema_version(), "counts": copy.counts(),
            "generation": int(meta.get("generation") or 0),
            "note_seq": copy.note_generation(),
            "notes_generation": notes.generation if notes is not None else 0,
            "restored_generation": int(meta.get("restored_generation") or 0)}


def _check_copy(archive: Path, entry: dict | None) -> list[str]:
    """Integrity, foreign keys and the note chain of an archive, read without touching it."""
    try:
        with contextlib.closing(_open_ro(archive)) as conn:
            problems = [f"backup {archive}: {p}" for p in Store(archive, conn).verify()]
            details = _details(conn)
    except (sqlite3.Error, UnicodeDecodeError) as exc:  # SQLite quoting damaged bytes
        return [f"backup {archive} cannot be read as a store ({exc}): it is damaged; use "
                "another backup"]
    for key in ("counts", "schema_version"):
        if entry is not None and entry.get(key) != details[key]:
            problems.append(f"backup {archive} holds {key} {details[key]}, the manifest "
                            f"recorded {entry.get(key)}: the archive was changed")
    return problems


def _listing_problems(archive: Path, entry: dict | None) -> list[str]:
    """Size and SHA-256 of an archive against its manifest entry."""
    if entry is None:
        return [f"backup {archive} is not listed in {archive.parent / catalog.MANIFEST}: its checksum "
                "cannot be confirmed (restore --force accepts it if its contents check out)"]
    size, sha = archive.stat().st_size, catalog.sha256_file(archive)
    problems = []
    if size != entry.get("size"):
        problems.append(f"backup {archive} is {size} bytes, the manifest recorded "
                        f"{entry.get('size')}: the file was truncated or changed")
    if sha != entry.get("sha256"):
        problems.append(f"backup {archive} has SHA-256 {sha}, the manifest recorded "
                        f"{entry.get('sha256')}: the archive is damaged; use another backup")
    return problems


def _retire(store: Path, archived: dict[str, Any], force: bool,
            folder: Path | None) -> tuple[Path, dict[str, Any] | None]:
    """Check the store is idle and not newer (`_idle`), then keep a protected raw copy of it.

    Returns where it was kept and its details (None when it could not be read).
    """
    target = Path(folder) if folder is not None else catalog.backups_folder(store)
    # SQLite drops the side files of a file it cannot read, so copy them first.
    saved = {suffix: _temp_in(target) for suffix in ("-wal", "-journal")
             if store.with_name(store.name + suffix).exists()}
    tmp = _temp_in(target)
    conn = sqlite3.connect(store, timeout=IN_USE_TIMEOUT, isolation_level=None)
    try:
        for suffix, copy in saved.items():
            shutil.copyfile(store.with_name(store.name + suffix), copy)
        current = _idle(conn, store, archived, force)
        shutil.copyfile(store, tmp)
        catalog.fsync(tmp)
        entry = {"created": utc_now(), "protected": True, "label": "replaced",
                 "source": str(store), "size": tmp.stat().st_size,
                 "sha256": catalog.sha256_file(tmp), **(current or {})}
        kept = catalog.register(target, tmp, entry)
        conn.close()
        for suffix, copy in saved.items() if current is None else ():
            os.replace(copy, kept.with_name(kept.name + suffix))  # beside the damaged file
        for suffix in ("-wal", "-journal", "-shm"):  # checkpointed, or kept just above
            store.with_name(store.name + suffix).unlink(missing_ok=True)
    finally:
        conn.close()
        for path in [tmp, *saved.values()]:
            _discard(path)
    return kept, current


def _idle(conn: sqlite3.Connection, store: Path, archived: dict[str, Any],
          force: bool) -> dict[str, Any] | None:
    """The details of a store no other process has open, and not newer than the archive.

    None when it cannot be read (only with `force`). A generation that a restore set and no
    commit moved since is not newer: the content is the archive's.
    """
    current: dict[str, Any] | None = None
    try:
        # Leaving WAL needs every other connection closed, so this is the in-use probe;
        # it also checkpoints the WAL into the file that is kept below.
        conn.execute("PRAGMA journal_mode=DELETE").fetchone()
        conn.execute("BEGIN EXCLUSIVE")
        current = _details(conn)
    except sqlite3.Error as exc:
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF in (sqlite3.SQLITE_BUSY,
                                                            sqlite3.SQLITE_LOCKED):
            raise BackupError(f"store {store} is in use by another process (a running serve, "
                              "sync or doctor): stop it, then run restore again") from None
        if not force:
            raise BackupError(f"store {store} cannot be read ({exc}): pass --force to replace "
                              "it; the damaged file is kept as a protected backup") from None
    newer = [f"{k} {current[k]} > {archived[k]}" for k in _MARKS
             if current is not None and int(current[k]) > int(archived[k])
             and not (k == "generation" and current[k] == current["restored_generation"])]
    if newer and not force:
        raise BackupError(f"store {store} is newer than the backup ({', '.join(newer)}): "
                          "restoring would lose that; pass --force to restore anyway (the "
                          "current store is kept as a protected backup)")
    return current


def _open_ro(path: Path) -> sqlite3.Connection:
    """Read an archive without locks or side files (`immutable`: nothing else writes it)."""
    return sqlite3.connect(path.resolve().as_uri() + "?mode=ro&immutable=1", uri=True,
                           isolation_level=None)


def _temp_in(folder: Path) -> Path:
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=".tmp-", suffix=".part", dir=folder)
    os.close(fd)
    return Path(name)


def _discard(tmp: Path) -> None:
    for suffix in ("", "-journal", "-wal", "-shm"):
        tmp.with_name(tmp.name + suffix).unlink(missing_ok=True)
