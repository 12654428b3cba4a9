"""The backups folder's catalog: `manifest.json`, its lock, listing, naming and retention.

Each archive in the folder is named `store-YYYYMMDDTHHMMSSZ[-N][-label].sqlite3` and listed in
`manifest.json` beside it with its SHA-256, size, counts, schema version, creation time and
protected flag. Making, verifying and restoring the archives themselves is `backup.py`'s job.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sharedmem.clock import parse_utc
from sharedmem.core import BackupError, LockError
from sharedmem.files import atomic_write

FOLDER = "backups"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
STATES = ("ok", "mismatch", "missing", "unlisted")
LOCK_WAIT = 10.0
LOCK_STALE = 120.0
_LOCK = ".manifest.lock"
_NAME_RE = re.compile(r"store-(\d{8}T\d{6}Z)(?:-[a-z0-9][a-z0-9._-]*)?\.sqlite3")


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


def list_backups(folder: Path) -> list[BackupInfo]:
    """Every archive in `folder`, oldest first, with its checksum state (see STATES)."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    out = []
    for name, entry in manifest.items():
        path = folder / name
        if not path.is_file():
            state = "missing"
        elif path.stat().st_size != entry.get("size") or sha256_file(path) != entry.get("sha256"):
            state = "mismatch"
        else:
            state = "ok"
        out.append(entry_info(path, entry, state))
    for path in sorted(folder.glob("store-*.sqlite3")) if folder.is_dir() else []:
        if path.name in manifest or not path.is_file():
            continue
        match = _NAME_RE.fullmatch(path.name)
        when = (datetime.strptime(match.group(1), "%Y%m%dT%H%M%SZ") if match
                else datetime.fromtimestamp(path.stat().st_mtime, UTC))
        out.append(BackupInfo(path, when.strftime("%Y-%m-%dT%H:%M:%SZ"), path.stat().st_size,
                              sha256_file(path), "unlisted"))
    return sorted(out, key=lambda info: (info.created, info.path.name))


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
        manifest = read_manifest(folder)
        doomed = _doomed(folder, manifest, keep_last, daily, weekly, now)
        if not dry_run and doomed:
            for name in doomed:
                (folder / name).unlink(missing_ok=True)
                del manifest[name]
            _write_manifest(folder, manifest)
    return [folder / name for name in doomed]


def register(folder: Path, tmp: Path, entry: dict[str, object]) -> Path:
    """Rename a checked temp archive to a unique name and list it in the manifest."""
    with _manifest_lock(folder):
        manifest = read_manifest(folder)
        stem = "store-" + str(entry["created"]).replace("-", "").replace(":", "")
        suffix = f"-{entry['label']}" if entry.get("label") else ""
        number = 1
        while True:
            name = f"{stem}{'' if number == 1 else f'-{number}'}{suffix}.sqlite3"
            if name not in manifest and not (folder / name).exists():
                break
            number += 1
        os.replace(tmp, folder / name)
        try:
            fsync(folder)
            manifest[name] = entry
            _write_manifest(folder, manifest)
        except BaseException:  # a full disk: no archive left that the manifest does not list
            (folder / name).unlink(missing_ok=True)
            raise
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


def read_manifest(folder: Path) -> dict[str, dict]:
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


def entry_info(path: Path, entry: dict, state: str) -> BackupInfo:
    """A listed archive as a BackupInfo; a field an entry lacks reads as empty, not an error."""
    return BackupInfo(path, str(entry.get("created")), int(entry.get("size") or 0),
                      str(entry.get("sha256") or ""), state, entry.get("protected") is True,
                      str(entry.get("label") or ""), entry.get("schema_version"),
                      dict(entry.get("counts") or {}))


def sha256_file(path: Path) -> str:
    """An archive's checksum, hashed in chunks so a large store is never read into memory."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def fsync(path: Path) -> None:
    """Flush a file, or a folder's entries after a rename (Windows cannot open a folder)."""
    if path.is_dir() and os.name == "nt":
        return
    fd = os.open(path, os.O_RDONLY if path.is_dir() else os.O_RDWR)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
