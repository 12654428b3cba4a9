"""Backups of the server's store: create, list, verify, prune, restore, and the pre-migration hook.

An archive is one self-contained SQLite file (rollback-journal mode, never a -wal/-shm beside it)
named `store-YYYYMMDDTHHMMSSZ[-N][-label].sqlite3`, listed in `manifest.json` in the same folder
with its SHA-256, size, counts, schema version, creation time and protected flag.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import sqlite3
import stat
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sharedmem.core import BackupError, LockError, atomic_write, name_problem, parse_utc, utc_now
from sharedmem.store import BUSY_TIMEOUT_MS, Store

FOLDER = "backups"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
STATES = ("ok", "mismatch", "missing", "unlisted")
IN_USE_TIMEOUT = 0.2
LOCK_WAIT = 10.0
LOCK_STALE = 120.0
_LOCK = ".manifest.lock"
_NAME_RE = re.compile(r"store-(\d{8}T\d{6}Z)(?:-[a-z0-9][a-z0-9._-]*)?\.sqlite3")
_MARKS = ("schema_version", "generation", "note_seq")


@dataclass
class BackupInfo:
    """One archive as the manifest and the file on disk describe it."""

    path: Path
    created: str
    size: int
    sha256: str
    state: str = "ok"
    protected: bool = False
    label: str = ""
    schema_version: int | None = None
    counts: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        """A JSON-ready form for `backup list --json`."""
        return {"path": str(self.path), "name": self.path.name, "created": self.created,
                "size": self.size, "sha256": self.sha256, "state": self.state,
                "protected": self.protected, "label": self.label,
                "schema_version": self.schema_version, "counts": dict(self.counts)}


def backups_folder(store: Path) -> Path:
    """The default archive folder: `backups/` beside the store."""
    return Path(store).parent / FOLDER


def create(store: Path, *, dest: Path | None = None, protect: bool = False,
           label: str = "") -> BackupInfo:
    """Copy the live store with SQLite's online backup (safe during syncs), check it, list it."""
    store = Path(store)
    problem = name_problem(label, "backup label") if label else None
    if problem:
        raise BackupError(problem)
    if not store.is_file():
        raise BackupError(f"store {store} does not exist: pass the right --store")
    folder = Path(dest) if dest is not None else backups_folder(store)
    created = utc_now()
    tmp = _temp_in(folder)
    try:
        details = _copy_checked(store, tmp)
        entry = {"created": created, "protected": protect, "label": label,
                 "source": str(store), **details}
        path = _register(folder, tmp, entry)
    finally:
        _discard(tmp)
    return _info(path, entry, "ok")


def list_backups(folder: Path) -> list[BackupInfo]:
    """Every archive in `folder`, oldest first, with its checksum state (see STATES)."""
    folder = Path(folder)
    manifest = _read_manifest(folder)
    out = []
    for name, entry in manifest.items():
        path = folder / name
        if not path.is_file():
            state = "missing"
        elif path.stat().st_size != entry.get("size") or _sha256_file(path) != entry.get("sha256"):
            state = "mismatch"
        else:
            state = "ok"
        out.append(_info(path, entry, state))
    for path in sorted(folder.glob("store-*.sqlite3")) if folder.is_dir() else []:
        if path.name in manifest or not path.is_file():
            continue
        match = _NAME_RE.fullmatch(path.name)
        when = (datetime.strptime(match.group(1), "%Y%m%dT%H%M%SZ") if match
                else datetime.fromtimestamp(path.stat().st_mtime, UTC))
        out.append(BackupInfo(path, when.strftime("%Y-%m-%dT%H:%M:%SZ"), path.stat().st_size,
                              _sha256_file(path), "unlisted"))
    return sorted(out, key=lambda info: (info.created, info.path.name))


def verify(archive: Path) -> list[str]:
    """Every problem with an archive: checksum and size against the manifest, integrity, chain."""
    archive = Path(archive)
    if not archive.is_file():
        return [f"backup {archive} does not exist: pick one from `backup list`"]
    try:
        entry = _read_manifest(archive.parent).get(archive.name)
    except BackupError as exc:
        return [str(exc)] + _check_copy(archive, None)
    return _listing_problems(archive, entry) + _check_copy(archive, entry)


def prune(folder: Path, *, keep_last: int = 1, daily: int = 7, weekly: int = 4,
          dry_run: bool = False, now: datetime | None = None) -> list[Path]:
    """Remove listed archives outside the policy; protected and unlisted ones are never removed.

    Kept: the `keep_last` newest; the newest of each of the last `daily` UTC days and of the
    last `weekly` ISO weeks (counted back from `now`); anything dated after `now`.
    """
    for option, value in (("keep-last", keep_last), ("daily", daily), ("weekly", weekly)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise BackupError(f"--{option} must be a whole number >= 0, not {value!r}")
    if keep_last < 1:
        raise BackupError("--keep-last must be at least 1: prune always keeps the newest backup")
    folder = Path(folder)
    if not folder.is_dir():
        return []
    now = now or datetime.now(UTC)
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    with _manifest_lock(folder):
        manifest = _read_manifest(folder)
        doomed = _doomed(folder, manifest, keep_last, daily, weekly, now)
        if not dry_run and doomed:
            for name in doomed:
                (folder / name).unlink(missing_ok=True)
                del manifest[name]
            _write_manifest(folder, manifest)
    return [folder / name for name in doomed]


def restore(archive: Path, store: Path, *, force: bool = False,
            folder: Path | None = None) -> Path | None:
    """Replace `store` with a verified archive; returns where the replaced store was kept.

    Refused when another process has the store open (never overridden: a live writer's -wal
    would corrupt the restored file), and, unless `force`, when the store is unreadable or
    newer than the archive (schema version, ingest generation or newest note). The replaced
    store is kept, protected, in `folder` (default `backups/` beside the store); None when
    there was no store to replace.
    """
    archive, store = Path(archive), Path(store)
    if not archive.is_file():
        raise BackupError(f"backup {archive} does not exist: pick one from `backup list`")
    entry = _read_manifest(archive.parent).get(archive.name)
    problems = [] if entry is None and force else _listing_problems(archive, entry)
    problems += _check_copy(archive, entry)
    if problems:
        raise BackupError(f"backup {archive} failed verification, so store {store} was left "
                          f"alone: {'; '.join(problems)}; pick another backup from `backup list`")
    with contextlib.closing(_open_ro(archive)) as conn:
        archived = _details(conn)
    mode = stat.S_IMODE(store.stat().st_mode) if store.exists() else None
    kept = _retire(store, archived, force, folder) if store.exists() else None
    store.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_in(store.parent)
    try:
        shutil.copyfile(archive, tmp)
        _fsync(tmp)
        if _sha256_file(tmp) != (entry["sha256"] if entry else _sha256_file(archive)):
            raise BackupError(f"the copy of {archive} at {tmp} differs from it: check the disk "
                              f"under {store.parent} and run restore again")
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, store)
        _fsync(store.parent)
    finally:
        _discard(tmp)
    return kept


def migration_hook(path: Path, old_version: int) -> None:
    """Store.open's `before_migrate`: a verified, protected backup before the schema changes."""
    info = create(path, protect=True, label=f"pre-migrate-v{old_version}")
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
        raise BackupError(f"store {store} could not be copied to {tmp.parent} ({exc}): check that "
                          "it is a shared-memory store and that the folder is writable") from None
    finally:
        src.close()
        dst.close()
    if problems:
        raise BackupError(f"the copy of store {store} failed its checks ({'; '.join(problems)}): "
                          "the live store may be damaged; run `doctor --store` and restore an "
                          "older backup")
    _fsync(tmp)
    return {"size": tmp.stat().st_size, "sha256": _sha256_file(tmp), **details}


def _details(conn: sqlite3.Connection) -> dict[str, Any]:
    """Schema version, counts and the newest-data marks of an open store."""
    copy = Store(Path(), conn)
    generation = conn.execute("SELECT value FROM meta WHERE key='generation'").fetchone()
    return {"schema_version": copy.schema_version(), "counts": copy.counts(),
            "generation": int(generation[0]) if generation else 0,
            "note_seq": copy.note_generation()}


def _check_copy(archive: Path, entry: dict | None) -> list[str]:
    """Integrity, foreign keys and the note chain of an archive, read without touching it."""
    try:
        with contextlib.closing(_open_ro(archive)) as conn:
            problems = [f"backup {archive}: {p}" for p in Store(archive, conn).verify()]
            details = _details(conn)
    except sqlite3.Error as exc:
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
        return [f"backup {archive} is not listed in {archive.parent / MANIFEST}: its checksum "
                "cannot be confirmed (restore --force accepts it if its contents check out)"]
    size, sha = archive.stat().st_size, _sha256_file(archive)
    problems = []
    if size != entry.get("size"):
        problems.append(f"backup {archive} is {size} bytes, the manifest recorded "
                        f"{entry.get('size')}: the file was truncated or changed")
    if sha != entry.get("sha256"):
        problems.append(f"backup {archive} has SHA-256 {sha}, the manifest recorded "
                        f"{entry.get('sha256')}: the archive is damaged; use another backup")
    return problems


def _retire(store: Path, archived: dict[str, Any], force: bool, folder: Path | None) -> Path:
    """Check the store is idle and not newer, then keep a protected raw copy of it."""
    target = Path(folder) if folder is not None else backups_folder(store)
    # SQLite drops the side files of a file it cannot read, so copy them first.
    saved = {suffix: _temp_in(target) for suffix in ("-wal", "-journal")
             if store.with_name(store.name + suffix).exists()}
    tmp = _temp_in(target)
    conn = sqlite3.connect(store, timeout=IN_USE_TIMEOUT, isolation_level=None)
    try:
        for suffix, copy in saved.items():
            shutil.copyfile(store.with_name(store.name + suffix), copy)
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
                 if current is not None and int(current[k]) > int(archived[k])]
        if newer and not force:
            raise BackupError(f"store {store} is newer than the backup ({', '.join(newer)}): "
                              "restoring would lose that; pass --force to restore anyway (the "
                              "current store is kept as a protected backup)")
        shutil.copyfile(store, tmp)
        _fsync(tmp)
        entry = {"created": utc_now(), "protected": True, "label": "replaced",
                 "source": str(store), "size": tmp.stat().st_size,
                 "sha256": _sha256_file(tmp), **(current or {})}
        kept = _register(target, tmp, entry)
        conn.close()
        for suffix, copy in saved.items() if current is None else ():
            os.replace(copy, kept.with_name(kept.name + suffix))  # beside the damaged file
        for suffix in ("-wal", "-journal", "-shm"):  # checkpointed, or kept just above
            store.with_name(store.name + suffix).unlink(missing_ok=True)
    finally:
        conn.close()
        for path in [tmp, *saved.values()]:
            _discard(path)
    return kept


def _register(folder: Path, tmp: Path, entry: dict[str, object]) -> Path:
    """Rename a checked temp archive to a unique name and list it in the manifest."""
    with _manifest_lock(folder):
        manifest = _read_manifest(folder)
        stem = "store-" + str(entry["created"]).replace("-", "").replace(":", "")
        suffix = f"-{entry['label']}" if entry.get("label") else ""
        number = 1
        while True:
            name = f"{stem}{'' if number == 1 else f'-{number}'}{suffix}.sqlite3"
            if name not in manifest and not (folder / name).exists():
                break
            number += 1
        os.replace(tmp, folder / name)
        _fsync(folder)
        manifest[name] = entry
        _write_manifest(folder, manifest)
    return folder / name


def _doomed(folder: Path, manifest: dict[str, dict], keep_last: int, daily: int, weekly: int,
            now: datetime) -> list[str]:
    """Names of listed, present, unprotected archives outside the retention policy."""
    dated = sorted(((datetime.fromtimestamp(parse_utc(e["created"]), UTC), name)
                    for name, e in manifest.items() if (folder / name).is_file()), reverse=True)
    keep = {name for _, name in dated[:keep_last]}
    keep |= {name for name, e in manifest.items() if e.get("protected") is True}
    days = {(now - timedelta(days=i)).date() for i in range(daily)}
    weeks = {tuple((now - timedelta(weeks=i)).isocalendar())[:2] for i in range(weekly)}
    seen: set[object] = set()
    for when, name in dated:  # newest first: the first seen in a day or week is its newest
        day, week = when.date(), tuple(when.isocalendar())[:2]
        if when > now or (day in days and day not in seen) or (week in weeks and week not in seen):
            keep.add(name)
        seen |= {day, week}
    return sorted(name for _, name in dated if name not in keep)


def _read_manifest(folder: Path) -> dict[str, dict]:
    """Archive name -> entry; an absent manifest is empty, a broken one is an error."""
    path = folder / MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise BackupError(f"backup manifest {path} cannot be read ({exc}): move it aside; "
                          "`backup list` then shows the archives as unlisted") from None
    backups = data.get("backups") if isinstance(data, dict) else None
    if not isinstance(backups, dict):
        raise BackupError(f"backup manifest {path} has no 'backups' object: move it aside")
    for name, entry in backups.items():
        try:
            parse_utc(entry["created"])
            sound = bool(_NAME_RE.fullmatch(name))
        except (TypeError, KeyError, ValueError):
            sound = False
        if not sound:
            raise BackupError(f"backup manifest {path} has a bad entry {name!r}: it needs an "
                              "archive name store-<time>[-label].sqlite3 and a 'created' time; "
                              "fix or remove that entry")
    return backups


def _write_manifest(folder: Path, manifest: dict[str, dict]) -> None:
    data = {"format": MANIFEST_FORMAT, "backups": manifest}
    atomic_write(folder / MANIFEST, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


@contextlib.contextmanager
def _manifest_lock(folder: Path) -> Iterator[None]:
    """Serialize manifest updates between backup runs (cron, migration hook, restore)."""
    lock = folder / _LOCK
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        try:
            os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            break
        except FileExistsError:
            with contextlib.suppress(OSError):
                if time.time() - lock.stat().st_mtime > LOCK_STALE:
                    lock.unlink()
                    continue
            if time.monotonic() > deadline:
                raise LockError(f"backup folder {folder} is locked by another backup run ({lock}):"
                                " wait for it, or remove that file if none is running") from None
            time.sleep(0.05)
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)


def _info(path: Path, entry: dict, state: str) -> BackupInfo:
    return BackupInfo(path, str(entry.get("created")), int(entry.get("size") or 0),
                      str(entry.get("sha256") or ""), state, entry.get("protected") is True,
                      str(entry.get("label") or ""), entry.get("schema_version"),
                      dict(entry.get("counts") or {}))


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


def _sha256_file(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _fsync(path: Path) -> None:
    """Flush a file, or a folder's entries after a rename (Windows cannot open a folder)."""
    if path.is_dir() and os.name == "nt":
        return
    fd = os.open(path, os.O_RDONLY if path.is_dir() else os.O_RDWR)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
