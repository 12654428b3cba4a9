"""The client's plain-Markdown cache of the server's export, and the manifest that describes it.

The manifest is derived data, checked when it is read: `namespaces.json` carries the sha256 of
`manifest.json` and one of its own namespaces, so a damaged file reads as damaged
(`Cache.damage`), not as an empty or a wrong cache. A sync then rebuilds the file list from the
files and pulls every namespace whole; until it has, the tools refuse to answer from it. Each
file's size and modification time are recorded too, so a sync hashes only the files that
changed behind its back (`Cache.tampered_namespaces`) and writes again those whose text is not
the one recorded.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import time
from collections import namedtuple
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from sharedmem import linejson
from sharedmem.cache.layout import Folders, namespace_key, published_path_problems
from sharedmem.cache.staged_files import STAGING_DIR, write_failure
from sharedmem.cache.writers import FileWriter
from sharedmem.clock import utc_now
from sharedmem.core import CacheError, ProtocolError, SharedMemoryError
from sharedmem.files import atomic_write
from sharedmem.namespaces import Namespace
from sharedmem.rules import MACHINES_DIR, NOTES_DIR, name_problem

META_DIR = ".sharedmem"
MANIFEST_NAME = "manifest.json"
NAMESPACES_NAME = "namespaces.json"
LEFTOVERS = ("manifest.next.part", "replaced")  # older versions' files, which nothing reads
MANIFEST_VERSION = 2  # 2: each file's mtime_ns; namespaces.json checked by sha256
NOTES_NAMESPACE = NOTES_DIR
SKIPPED_SHOWN = 100  # skipped items a report names one by one; the rest are counted


class NamespaceInfo(NamedTuple):
    """What the cache holds of one server namespace, and which server generation it is."""

    key: str
    machine: str | None
    source: str
    kind: str
    generation: int = 0
    synced_at: str | None = None

    def to_row(self) -> dict[str, Any]:
        """Its entry in namespaces.json."""
        return self._asdict()

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> NamespaceInfo:
        """Read an entry of namespaces.json; generation and sync time may be missing."""
        return cls(row["key"], row["machine"], row["source"], row["kind"],
                   row.get("generation", 0), row.get("synced_at"))

    @classmethod
    def listed(cls, ns: Namespace) -> NamespaceInfo:
        """What the cache keeps of a namespace the server lists."""
        return cls(ns.key, ns.machine, ns.source, ns.kind, ns.generation, ns.synced_at)


class CachedFile(namedtuple("CachedFile", "sha256 size namespace mtime_ns", defaults=(None,))):
    """One cached file's provenance: its content address, size, namespace and modification time.

    `mtime_ns` is the file's as the cache last wrote or verified it: a file whose size or time
    differs is hashed by the next sync (`Cache.tampered_namespaces`). None (a manifest of an
    older version) means "verify once". A named tuple: comparing two manifests of 10,000 files
    is then one C loop.
    """

    __slots__ = ()


@dataclass
class Manifest:
    """Everything the cache knows about itself; written last, after the files."""

    namespaces: dict[str, NamespaceInfo] = field(default_factory=dict)
    files: dict[str, CachedFile] = field(default_factory=dict)
    last_sync: str | None = None
    server: dict[str, Any] = field(default_factory=dict)


Stamp = tuple[int, int, int]
SETTLE_SECONDS = 0.25  # how long a reader waits for a sync writing the two files to finish
_HEX = re.compile("[0-9a-f]*")


def _stamp(path: Path) -> Stamp:
    """What tells a rewritten manifest file from the one already read: mtime, inode, size."""
    info = path.stat()
    return info.st_mtime_ns, info.st_ino, info.st_size


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Damaged(CacheError):
    """Why the manifest cannot be what this cache wrote; `Cache.damage` holds the message."""


class _Loaded(NamedTuple):
    """The manifest as last read or written, the stamps of its two files then, and any damage."""

    stamps: tuple[Stamp, Stamp] | tuple[bool, bool]  # or which exist, when one does not
    manifest: Manifest
    damage: str | None = None


class _LoadedFiles(NamedTuple):
    """The file list as last read or written, the stamp and sha256 of manifest.json then."""

    stamp: Stamp
    digest: str
    files: dict[str, CachedFile]


class Cache:
    """A folder of plain Markdown mirroring the server, with its manifest in a hidden folder."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.meta = self.root / META_DIR
        self._loaded: _Loaded | None = None
        self._files_cache: _LoadedFiles | None = None
        self._lines: linejson.Old = {}  # manifest.json's entry lines, reused by the next write
        self._rebuilt: Manifest | None = None  # see `rebuild`
        self.damage: str | None = None  # why the manifest last loaded is unusable, if it is
        self.damaged: set[str] = set()  # files not as the manifest says (tampered_namespaces)
        self._verified: dict[str, CachedFile] = {}  # files whose time alone moved, re-recorded
        self._vouched: tuple[Stamp, Stamp] | None = None  # the stamps `check` found intact

    @property
    def manifest_path(self) -> Path:
        """Where the manifest lives."""
        return self.meta / MANIFEST_NAME

    def exists(self) -> bool:
        """Whether a sync has ever completed into this cache."""
        return self.manifest_path.is_file() and self.namespaces_path.is_file()

    @property
    def namespaces_path(self) -> Path:
        """The small file rewritten by every sync: namespaces, last sync time, server."""
        return self.meta / NAMESPACES_NAME

    @property
    def rebuilt(self) -> bool:
        """Whether this run rebuilt the file list from the files (`rebuild`)."""
        return self._rebuilt is not None

    def load(self) -> Manifest:
        """The manifest; each of its two files is re-read only when it changed on disk.

        A manifest that is missing half, cannot be read, or is not what this cache wrote (the
        sha256s namespaces.json records, the kind of each value) loads empty, and `damage`
        says why. A sync writes the two files one after the other: a reader that finds them
        apart waits up to SETTLE_SECONDS for the second before it calls them damaged.
        """
        if self._rebuilt is not None:
            return self._rebuilt
        before = self._loaded
        loaded = self._load_once()
        if loaded.damage is not None and loaded is not before:  # found now, not remembered
            deadline = time.monotonic() + SETTLE_SECONDS
            while time.monotonic() < deadline:
                time.sleep(0.01)
                if self._key() != loaded.stamps:  # being written: read them again
                    self._loaded = None
                    loaded = self._load_once()
                    if loaded.damage is None:
                        break
        self.damage = loaded.damage
        return loaded.manifest

    def check(self) -> str | None:
        """What `damage` would say after `load`, without parsing a file list that is vouched for.

        For a search, which reads the file list from its index: when namespaces.json is intact
        and records the sha256 that manifest.json has, this reads and hashes, nothing more.
        """
        stamps = self._stamps()
        if stamps is not None and stamps == self._vouched:
            return None
        if self._rebuilt is None and stamps is not None \
                and not (self._loaded and self._loaded.stamps == stamps):
            try:
                raw = _namespaces_of(self.namespaces_path.read_bytes(), self.namespaces_path)
                recorded = raw.get("manifest_sha256")
                if recorded is not None and recorded == _sha256(self.manifest_path.read_bytes()) \
                        and self._stamps() == stamps:
                    self._vouched = stamps
                    return None
            except (Damaged, OSError):
                pass
        self.load()
        return self.damage

    def _stamps(self) -> tuple[Stamp, Stamp] | None:
        try:
            return _stamp(self.manifest_path), _stamp(self.namespaces_path)
        except OSError:
            return None

    def _key(self) -> tuple[Stamp, Stamp] | tuple[bool, bool]:
        """The two files' stamps; which of them exist when one cannot be stat'ed."""
        stamps = self._stamps()
        if stamps is not None:
            return stamps
        return os.path.lexists(self.manifest_path), os.path.lexists(self.namespaces_path)

    def _load_once(self) -> _Loaded:
        """The manifest as the two files hold it now, or the damage found; remembered."""
        key = self._key()
        if self._loaded and self._loaded.stamps == key:
            return self._loaded
        stamps = key if type(key[0]) is tuple else None
        present = key if stamps is None else (True, True)
        try:
            if stamps is None:
                if not any(present):
                    self._loaded = _Loaded(key, Manifest())  # a cache no sync has written
                    return self._loaded
                if not all(present):
                    missing = self.namespaces_path if present[0] else self.manifest_path
                    raise Damaged(f"{missing} is missing")
                raise Damaged(f"{self.meta} cannot be read")
            raw = _namespaces_of(self.namespaces_path.read_bytes(), self.namespaces_path)
            cached = self._files_cache
            if cached is None or cached.stamp != stamps[0]:
                data = self.manifest_path.read_bytes()
                cached = _LoadedFiles(stamps[0], _sha256(data), {})
            else:
                data = None
            recorded = raw.get("manifest_sha256")
            if recorded is not None and recorded != cached.digest:
                raise Damaged(f"{self.manifest_path} does not match the sha256 that "
                              f"{self.namespaces_path.name} records for it (damaged or edited)")
            if data is not None:
                files, lines = _files_of(data, self.manifest_path,
                                         None if recorded else raw["namespaces"])
                self._lines = {k: (files[k], line) for k, (_, line) in lines.items()}
                cached = self._files_cache = cached._replace(files=files)
            manifest = Manifest(
                namespaces={k: NamespaceInfo.from_row(v) for k, v in raw["namespaces"].items()},
                files=cached.files, last_sync=raw.get("last_sync"), server=raw.get("server", {}))
            self._loaded = _Loaded(stamps, manifest)
        except Damaged as exc:
            self._loaded = _Loaded(key, Manifest(), str(exc))
        except OSError as exc:
            self._loaded = _Loaded(key, Manifest(),
                                   f"{self.meta} cannot be read ({exc.strerror or exc})")
        return self._loaded

    def rebuild(self) -> Manifest:
        """A file list rebuilt from the files themselves (each hashed), for a sync to repair.

        A sync calls it when `damage` is set. No namespace is listed, so its pull asks for every
        namespace whole: a file already at the server's sha256 is kept as it is, others are
        written, and what the server does not have is removed. Links and paths the layout
        refuses are left out, as a pull would never write them.
        """
        files: dict[str, CachedFile] = {}
        root = str(self.root)
        for top in (MACHINES_DIR, NOTES_DIR):
            base = os.path.join(root, *top.split("/"))
            try:
                if not stat.S_ISDIR(os.lstat(base).st_mode):
                    continue
            except OSError:
                continue
            for folder, dirs, names in os.walk(base):
                dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]
                for name in names:
                    full = os.path.join(folder, name)
                    rel = os.path.relpath(full, root).replace(os.sep, "/")
                    try:
                        info = os.lstat(full)
                        if not stat.S_ISREG(info.st_mode) or published_path_problems(rel):
                            continue
                        with open(full, "rb") as handle:
                            sha = hashlib.file_digest(handle, "sha256").hexdigest()
                    except OSError:
                        continue
                    files[rel] = CachedFile(sha, info.st_size, namespace_key(rel),
                                            info.st_mtime_ns)
        self._lines = {}
        self._rebuilt = Manifest(files=dict(sorted(files.items())))
        return self._rebuilt

    def file_path(self, relpath: str) -> Path:
        """The on-disk path of a published path, refused if it breaks the rules or escapes."""
        problems = published_path_problems(relpath)
        if problems:
            raise ProtocolError("; ".join(problems))
        target = (self.root.resolve() / relpath).resolve()
        if self.root.resolve() not in target.parents:
            raise ProtocolError(f"path {relpath!r} escapes the cache {self.root}: refused")
        return target

    def tampered_namespaces(self) -> set[str]:
        """Namespaces with a file that is not what the manifest says: the pull asks for them whole.

        Each file is stat'ed, as before every pull. Only one whose size or modification time
        differs from the manifest's (or is unknown: an older manifest) is hashed; if its
        sha256 differs too (a killed sync's text, an edit by hand) or it is gone or not a
        regular file, `damaged` names it, so the pull writes it again even at the sha256 the
        manifest holds. One whose time alone moved is recorded anew by the next commit, so it
        is hashed once.
        """
        manifest = self.load()
        bad: set[str] = set()
        damaged: set[str] = set()
        verified: dict[str, CachedFile] = {}
        root = str(self.root) + os.sep
        lstat, regular = os.lstat, stat.S_ISREG
        for path, meta in manifest.files.items():
            try:
                info = lstat(root + path)
            except OSError:
                bad.add(meta.namespace)
                damaged.add(path)
                continue
            if info.st_mtime_ns == meta.mtime_ns and info.st_size == meta.size \
                    and regular(info.st_mode):
                continue
            if info.st_size == meta.size and regular(info.st_mode) \
                    and _file_sha256(root + path) == meta.sha256:
                verified[path] = meta._replace(mtime_ns=info.st_mtime_ns)
                continue
            bad.add(meta.namespace)
            damaged.add(path)
        self.damaged, self._verified = damaged, verified
        return bad

    def _encode(self, files: dict[str, CachedFile]) -> tuple[str, linejson.Old]:
        """manifest.json's text for `files`, reusing the lines of unchanged entries."""
        order = (self._lines.keys() if files.keys() == self._lines.keys()
                 else sorted(files))  # path order, as before, when paths came or went
        return linejson.encode({"version": MANIFEST_VERSION}, "files",
                               ((k, files[k]) for k in order), self._lines)

    def remove_leftovers(self) -> None:
        """Remove what older versions left beside the manifest, which no version reads now.

        They wrote the expected manifest ahead (`manifest.next.part`) and kept the files a
        sync replaced linked in `replaced/` until the next one. A link there is removed, not
        followed; a metadata folder that is a link is refused.
        """
        self.check_meta()
        for name in LEFTOVERS:
            path = self.meta / name
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError:  # a folder
                import shutil
                shutil.rmtree(path, ignore_errors=True)

    def check_meta(self) -> None:
        """Refuse a metadata folder (or its staging folder) that is a link or not a folder.

        A sync removes and writes files in them: through a link planted there it would do so
        in the link's target. The cache root itself may be a link the user made.
        """
        for path in (self.meta, self.meta / STAGING_DIR):
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                return
            except OSError as exc:
                raise CacheError(f"cannot check the cache's folder {path} ({exc.strerror}): fix "
                                 "its permissions, then sync again") from None
            if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
                raise CacheError(
                    f"{path} is a link or not a folder: the cache keeps its own records there, "
                    "and a sync would write and remove files in whatever it points to. Nothing "
                    f"was changed; remove it (rm {path}: the next sync makes it again), then "
                    "sync again")

    def intake(self, writer: FileWriter | None = None, *, full: bool = False,
               full_namespaces: Container[str] = frozenset(),
               file_bytes: int | None = None) -> Intake:
        """Begin taking a pull in, file by file; `commit` then writes it. See `apply`."""
        return Intake(self, writer or FileWriter(), full, full_namespaces, file_bytes)

    def apply(
        self,
        upserts: Iterable[tuple[str, str, str]],
        removals: list[str],
        namespaces: dict[str, NamespaceInfo],
        *,
        full: bool = False,
        full_namespaces: set[str] | frozenset[str] = frozenset(),
        server: dict[str, Any] | None = None,
        writer: FileWriter | None = None,
        file_bytes: int | None = None,
    ) -> dict[str, Any]:
        """Write a pull held whole into the cache: `intake`, each upsert added, then `commit`.

        `upserts` are (path, sha256, text); `namespaces` is the server's complete list, so a
        namespace the server no longer has is removed. With `full`, every file not upserted is
        removed too (a version 1 pull sends the whole export); `full_namespaces` does the same
        for those namespaces only. `writer` puts each file in place (writers.py): the plain one
        writes it; a sync's moves in what it staged ahead, and vouches for the paths and texts
        the sync published itself, which are then not checked again. `file_bytes` caps the
        UTF-8 size of each text the writer does not vouch for.
        """
        intake = self.intake(writer, full=full, full_namespaces=full_namespaces,
                             file_bytes=file_bytes)
        for path, sha, text in upserts:
            intake.add(path, sha, text)
        return self.commit(intake, removals, namespaces, server=server)

    def commit(self, intake: Intake, removals: Iterable[str],
               namespaces: Mapping[str, NamespaceInfo], *,
               server: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write what `intake` took: files first, then removals, then the manifest.

        Nothing in the cache changes before this. A namespace whose key the layout refuses and
        a removal of a path the rules refuse are skipped and named too; the rest is written.
        """
        self.check_meta()
        writer = intake.writer
        listed: dict[str, NamespaceInfo] = {}
        for key, info in namespaces.items():
            problem = None
            if key != NOTES_DIR:
                parts = key.split("/")
                if len(parts) != 3 or parts[0] != MACHINES_DIR:
                    problem = f"namespace {key!r} is not machines/<machine>/<source>"
                else:
                    problem = name_problem(parts[1], "machine") or name_problem(parts[2], "source")
            if problem:
                intake.skip(key, "bad-namespace", problem)
            else:
                listed[key] = info
        gone: set[str] = set()
        for path in removals:
            problems = published_path_problems(path)
            if problems:
                intake.skip(path, "bad-path", problems[0])
            else:
                gone.add(path)
        manifest = self.load()
        files = dict(manifest.files)
        files.update((p, meta) for p, meta in self._verified.items() if p in files)
        items = intake.files
        sent = items.keys() | intake.kept
        if intake.full:
            gone |= set(files) - sent
        elif intake.full_namespaces:
            gone |= {p for p, meta in files.items()
                     if meta.namespace in intake.full_namespaces and p not in sent}
        gone |= {p for p, meta in files.items() if meta.namespace not in listed}
        gone |= intake.dropped & files.keys()  # the server changed it to what this cache refuses
        folders = Folders(self.root)
        for path in items:
            folders.target(path, create=False, strict=True)  # refuse links before any write
        base = folders.root + os.sep
        where = str(self.root)  # what is being written, for the message should it fail
        written = removed = 0
        try:
            moved = writer.move_namespaces(((p, sha) for p, (sha, _) in items.items()), folders)
            for path in moved:
                where = base + path
                files[path] = _entry(items[path][0], path, os.stat(where))
            written = len(moved)
            for path, (sha, text) in items.items():
                if path in moved:
                    continue
                target = folders.target(path, create=True)
                assert target is not None
                where = target
                writer.write(path, sha, text, target)
                written += 1
                files[path] = _entry(sha, path, os.stat(target))
            for path in sorted(gone - sent):
                files.pop(path, None)
                target = folders.target(path, create=False)
                if target is None:
                    continue
                try:
                    os.unlink(target)
                    removed += 1
                except FileNotFoundError:
                    pass
                self._prune_dirs(Path(target).parent)
            new = Manifest(namespaces=listed, files=files, last_sync=utc_now(),
                           server=server or manifest.server)
            where = str(self.manifest_path)
            self._write_manifest(new, files_changed=bool(written or removed)
                                 or files != manifest.files)
        except OSError as exc:
            self._abandon(manifest, files, writer)
            raise CacheError(f"{write_failure(where, exc)}; {_KEPT}") from None
        except SharedMemoryError:
            self._abandon(manifest, files, writer)
            raise
        self.damaged, self._verified = set(), {}
        return {"written": written, "removed": removed, "files": len(files),
                "skipped": intake.skipped, "skipped_total": intake.skipped_total}

    def _abandon(self, manifest: Manifest, files: dict[str, CachedFile],
                 writer: FileWriter) -> None:
        """After a commit failed: leave the cache as its manifest says, freeing what it can.

        The staged files go first (they take room on the same disk), then every file this
        commit created where the manifest named none. A file it replaced keeps its new text
        and is recorded so; every namespace keeps its generation from before, so the next pull
        sends again all this one did not finish. When nothing stayed changed the manifest is
        not written at all: the cache is exactly as it was. If it cannot be written (the disk
        is still full), the old one stays and the next sync finds the replaced files by their
        times and writes them again.
        """
        writer.discard()
        before = manifest.files
        base = str(self.root.resolve()) + os.sep
        for path in [p for p in files if p not in before]:
            del files[path]
            target = base + path
            try:
                os.unlink(target)
            except OSError:
                continue
            self._prune_dirs(Path(target).parent)
        if files == before:
            return
        with contextlib.suppress(OSError):
            self._write_manifest(Manifest(manifest.namespaces, files, manifest.last_sync,
                                          manifest.server))

    def _prune_dirs(self, folder: Path) -> None:
        root = self.root.resolve()
        while folder != root and root in folder.parents:
            try:
                folder.rmdir()
            except OSError:
                return
            folder = folder.parent

    def _write_manifest(self, manifest: Manifest, *, files_changed: bool = True) -> None:
        """Files first, then the namespaces file, whose presence marks a complete cache.

        namespaces.json records the sha256 of manifest.json and ends with its own, so `load`
        tells a damaged one from this cache's writing. Not fsynced: the cache is a copy of the
        server, and a manifest a power loss damaged reads as damaged, so the next sync rebuilds
        it and pulls everything whole.
        """
        known = self._files_cache
        if files_changed or self._rebuilt is not None or known is None \
                or known.stamp != _stamp(self.manifest_path):
            text, self._lines = self._encode(manifest.files)
            data = text.encode("utf-8")
            self._files_cache = None  # a rewrite within one mtime tick must not look unchanged
            atomic_write(self.manifest_path, data, durable=False)
            digest = _sha256(data)
        else:
            digest = known.digest
        rows = {k: v.to_row() for k, v in sorted(manifest.namespaces.items())}
        raw = {"version": MANIFEST_VERSION, "last_sync": manifest.last_sync,
               "server": manifest.server, "namespaces": rows, "manifest_sha256": digest,
               "check": _check(rows, digest)}
        # ASCII, escapes and all: the server's names and times may hold a lone surrogate.
        atomic_write(self.namespaces_path, json.dumps(raw).encode("utf-8"), durable=False)
        stamps = (_stamp(self.manifest_path), _stamp(self.namespaces_path))
        self._files_cache = _LoadedFiles(stamps[0], digest, manifest.files)  # no re-read
        self._loaded = _Loaded(stamps, manifest)
        self._rebuilt, self.damage = None, None


def _intact(target: str, size: int | None) -> bool:
    """Whether the cached file is there, and of `size` when given.

    A namespace pulled whole because a file's size was off is thus rewritten where it is off.
    """
    try:
        st = os.stat(target)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and (size is None or st.st_size == size)


def _entry(sha: str, path: str, info: os.stat_result) -> CachedFile:
    """The manifest entry of a file just written: its size and time as the disk has them."""
    return CachedFile(sha, info.st_size, namespace_key(path), info.st_mtime_ns)


_KEPT = ("the cache was left as its manifest describes it (what this sync had not finished is "
         "pulled again by the next one)")


class Intake:
    """A pull taken in as it streams, so a pull holds its paths, not its texts.

    Each file is checked as it comes, and a text from the server goes to the writer at once
    (a sync's stages it on disk). What this client cannot write is skipped and named, and the
    rest goes on: a path or namespace its rules refuse, a text over `file_bytes`, not UTF-8,
    or not matching its sha256. The cache itself changes only in `Cache.commit`.
    """

    def __init__(self, cache: Cache, writer: FileWriter, full: bool,
                 full_namespaces: Container[str], file_bytes: int | None) -> None:
        self.root = str(cache.root) + os.sep
        self.writer = writer
        self.cached = cache.load().files
        self.damaged = cache.damaged  # not as the manifest says: written again (see _intact)
        self.full = full
        self.full_namespaces = full_namespaces
        self.file_bytes = file_bytes
        self.files: dict[str, tuple[str, str | None]] = {}  # path -> sha256, text (None: taken)
        self.kept: set[str] = set()  # held intact at the sha256 pulled: nothing to write
        self.dropped: set[str] = set()  # skipped, though the path is fine: its old copy goes
        self.skipped: list[dict[str, str]] = []  # the first SKIPPED_SHOWN
        self.skipped_total = 0

    def add_own(self, items: Iterable[tuple[str, str, str]]) -> None:
        """Take files as this client published them (path, sha256, text): its walk checked them.

        A first sync takes every file of its own this way, so this is one tight loop.
        """
        cached, files, kept = self.cached, self.files, self.kept
        for path, sha, text in items:
            old = cached.get(path)
            if old is not None and old.sha256 == sha and self._intact(path, old):
                files.pop(path, None)
                kept.add(path)
            else:
                kept.discard(path)
                files[path] = (sha, text)

    def add(self, path: str, sha: str, text: str, *, vouched: bool = False) -> None:
        """Take one pulled file; `vouched`: the text is this client's own for that sha256."""
        writer = self.writer
        if path not in writer.own_paths:
            problems = published_path_problems(path)
            if problems:
                self.skip(path, "bad-path", problems[0])
                return
        self.dropped.discard(path)
        old = self.cached.get(path)
        if old is not None and old.sha256 == sha and self._intact(path, old):
            self.files.pop(path, None)
            self.kept.add(path)
            return
        self.kept.discard(path)
        if vouched or sha in writer.own_texts:
            self.files[path] = (sha, text)
            return
        limit = self.file_bytes
        if limit is not None and len(text) > limit:  # more characters than bytes allowed
            self._drop(path, "too-large", len(text))
            return
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            self._drop(path, "invalid-utf8")
            return
        if limit is not None and len(data) > limit:
            self._drop(path, "too-large", len(data))
        elif hashlib.sha256(data).hexdigest() != sha:
            self._drop(path, "sha256-mismatch")
        else:
            writer.take(path, sha, data)
            self.files[path] = (sha, None)

    def _intact(self, path: str, old: CachedFile) -> bool:
        """Whether the cache holds `old` intact, so a pull of the same sha256 writes nothing.

        A file the sync found damaged (`Cache.tampered_namespaces`) is not; in a namespace pulled
        whole, the size is checked too.
        """
        if path in self.damaged:
            return False
        full = self.full or old.namespace in self.full_namespaces
        return _intact(self.root + path, old.size if full else None)

    def _drop(self, path: str, reason: str, size: int = 0) -> None:
        """Skip a file at a valid path; the cache's older copy of it is removed at commit."""
        self.files.pop(path, None)
        self.dropped.add(path)
        self.skip(path, reason, {
            "too-large": f"{path!r} is over this client's limit of {self.file_bytes} bytes a "
                         f"file (at least {size}); raise limits.file_bytes in client.json to "
                         "take it",
            "invalid-utf8": f"the text sent for {path!r} is not valid UTF-8",
            "sha256-mismatch": f"the text sent for {path!r} does not match its sha256"}[reason])

    def skip(self, path: str, reason: str, message: str) -> None:
        """Name one item this client did not take; past SKIPPED_SHOWN they are only counted."""
        self.skipped_total += 1
        if len(self.skipped) < SKIPPED_SHOWN:
            self.skipped.append({"path": _cut(path, 300), "reason": reason,
                                 "message": _cut(message, 500)})


def _cut(text: str, limit: int) -> str:
    """A peer's text kept short enough for a report: a path may be megabytes long."""
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def _file_sha256(path: str) -> str | None:
    """The sha256 of a cached file's bytes; None when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest()
    except OSError:
        return None


def _namespaces_of(data: bytes, path: Path) -> dict[str, Any]:
    """namespaces.json's object, checked: its sha256 (when written with one), each value's kind.

    The sha256 (`check`) covers what a pull and the tools rely on: the namespaces and the
    sha256 of manifest.json. The time of the last sync and the server's name only inform, so
    they are left out (and may be edited). An older version wrote no sha256s; its file is read
    with the kinds checked, and the next sync writes both.
    """
    try:
        raw = json.loads(data.decode("utf-8"))
    except ValueError as exc:
        raise Damaged(f"{path} is not JSON ({exc})") from None
    if type(raw) is not dict:
        raise Damaged(f"{path} is not a JSON object")
    rows, digest = raw.get("namespaces"), raw.get("manifest_sha256")
    if type(rows) is not dict or not all(type(v) is dict and _row_ok(k, v)
                                         for k, v in rows.items()) \
            or not (raw.get("last_sync") is None or type(raw["last_sync"]) is str) \
            or type(raw.get("server", {})) is not dict \
            or not (digest is None or type(digest) is str and len(digest) == 64):
        raise Damaged(f"{path} holds a value of the wrong kind")
    if ("check" in raw or digest is not None or raw.get("version", 1) != 1) \
            and raw.get("check") != _check(rows, digest):
        raise Damaged(f"{path} does not match the sha256 written in it")
    return raw


def _check(rows: dict[str, Any], digest: str | None) -> str:
    """The sha256 namespaces.json carries of its namespaces and of manifest.json's sha256."""
    return _sha256(json.dumps([rows, digest]).encode("utf-8"))


def _row_ok(key: str, row: dict[str, Any]) -> bool:
    """Whether one namespace entry of namespaces.json has each field of its kind."""
    generation = row.get("generation", 0)
    return (row.get("key") == key and type(row.get("source")) is str
            and type(row.get("kind")) is str and type(generation) is int and generation >= 0
            and (row.get("machine") is None or type(row["machine"]) is str)
            and (row.get("synced_at") is None or type(row["synced_at"]) is str))


def _files_of(data: bytes, path: Path, listed: Container[str] | None
              ) -> tuple[dict[str, CachedFile], linejson.Old]:
    """manifest.json's file list and its lines; with `listed`, every entry is checked too.

    A manifest that namespaces.json vouches for by sha256 is this cache's own writing, so its
    10,000 entries are not checked one by one; an older one is, once (the path rule, the
    namespace listed, each value's kind).
    """
    try:
        raw, lines = linejson.decode(data.decode("utf-8"), "files")
        files = {k: CachedFile(*v) for k, v in raw["files"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise Damaged(f"{path} is not a file list ({exc})") from None
    if listed is not None:
        for relpath, meta in files.items():
            sha, size, namespace, mtime = meta
            if not (type(sha) is str and len(sha) == 64 and type(size) is int and size >= 0
                    and type(namespace) is str and (mtime is None or type(mtime) is int)):
                raise Damaged(f"{path}: the entry of {relpath!r} is not [sha256, size, "
                              "namespace, mtime]")
            if namespace not in listed or published_path_problems(relpath) \
                    or namespace_key(relpath) != namespace:
                raise Damaged(f"{path}: {relpath!r} is not a path of a listed namespace")
        if not _HEX.fullmatch("".join(meta.sha256 for meta in files.values())):
            raise Damaged(f"{path}: a sha256 is not lower-case hexadecimal")
    return files, lines
