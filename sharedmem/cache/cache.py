"""The client's plain-Markdown cache of the server's export, and the manifest that describes it."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections import namedtuple
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from sharedmem import linejson
from sharedmem.cache.layout import Folders, namespace_key, published_path_problems
from sharedmem.cache.staged_files import STAGING_DIR
from sharedmem.cache.writers import FileWriter
from sharedmem.clock import utc_now
from sharedmem.core import CacheError, ProtocolError
from sharedmem.files import atomic_write
from sharedmem.namespaces import Namespace
from sharedmem.rules import MACHINES_DIR, NOTES_DIR, name_problem

META_DIR = ".sharedmem"
MANIFEST_NAME = "manifest.json"
NAMESPACES_NAME = "namespaces.json"
LEFTOVERS = ("manifest.next.part", "replaced")  # older versions' files, which nothing reads
MANIFEST_VERSION = 1
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


class CachedFile(namedtuple("CachedFile", "sha256 size namespace")):
    """One cached file's provenance: its content address, size and namespace.

    A named tuple: comparing two manifests of 10,000 files is then one C loop.
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


def _stamp(path: Path) -> Stamp:
    """What tells a rewritten manifest file from the one already read: mtime, inode, size."""
    info = path.stat()
    return info.st_mtime_ns, info.st_ino, info.st_size


class _Loaded(NamedTuple):
    """The manifest as last read or written, and the stamps of its two files then."""

    stamps: tuple[Stamp, Stamp]
    manifest: Manifest


class _LoadedFiles(NamedTuple):
    """The file list as last read or written, and the stamp of manifest.json then."""

    stamp: Stamp
    files: dict[str, CachedFile]


class Cache:
    """A folder of plain Markdown mirroring the server, with its manifest in a hidden folder."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.meta = self.root / META_DIR
        self._loaded: _Loaded | None = None
        self._files_cache: _LoadedFiles | None = None
        self._lines: linejson.Old = {}  # manifest.json's entry lines, reused by the next write

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

    def load(self) -> Manifest:
        """The manifest; each of its two files is re-read only when it changed on disk."""
        try:
            stamps = (_stamp(self.manifest_path), _stamp(self.namespaces_path))
        except FileNotFoundError:
            return Manifest()
        if self._loaded and self._loaded.stamps == stamps:
            return self._loaded.manifest
        try:
            files = self._files_cache.files if self._files_cache and \
                self._files_cache.stamp == stamps[0] else None
            if files is None:
                raw, lines = linejson.decode(self.manifest_path.read_text(encoding="utf-8"),
                                             "files")
                files = {k: CachedFile(*v) for k, v in raw["files"].items()}
                self._lines = {k: (files[k], line) for k, (_, line) in lines.items()}
                self._files_cache = _LoadedFiles(stamps[0], files)
            raw = json.loads(self.namespaces_path.read_text(encoding="utf-8"))
            manifest = Manifest(
                namespaces={k: NamespaceInfo.from_row(v) for k, v in raw["namespaces"].items()},
                files=files, last_sync=raw.get("last_sync"), server=raw.get("server", {}))
        except (OSError, ValueError, KeyError, TypeError):
            manifest = Manifest()
        self._loaded = _Loaded(stamps, manifest)
        return manifest

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
        """Namespaces whose files no longer match the manifest by size, so they need a full pull."""
        manifest = self.load()
        bad: set[str] = set()
        root = str(self.root) + os.sep
        for path, meta in manifest.files.items():
            if meta.namespace in bad:
                continue
            try:
                if os.stat(root + path).st_size != meta.size:
                    bad.add(meta.namespace)
            except OSError:
                bad.add(meta.namespace)
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
        moved = writer.move_namespaces(((p, sha) for p, (sha, _) in items.items()), folders)
        written = len(moved)
        for path, (sha, text) in items.items():
            if path in moved:
                files[path] = CachedFile(sha, moved[path], namespace_key(path))
                continue
            target = folders.target(path, create=True)
            assert target is not None
            size = writer.write(path, sha, text, target)
            written += 1
            files[path] = CachedFile(sha, size, namespace_key(path))
        removed = 0
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
        self._write_manifest(new, files_changed=bool(written or removed)
                             or files != manifest.files)
        return {"written": written, "removed": removed, "files": len(files),
                "skipped": intake.skipped, "skipped_total": intake.skipped_total}

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

        Not fsynced: the cache is a copy of the server, and a manifest damaged by a power loss
        reads as empty, so the next sync pulls everything again.
        """
        if files_changed or not self.manifest_path.is_file():
            text, self._lines = self._encode(manifest.files)
            atomic_write(self.manifest_path, text.encode("utf-8"), durable=False)
            self._files_cache = None  # a rewrite within one mtime tick must not look unchanged
        raw = {
            "version": MANIFEST_VERSION,
            "last_sync": manifest.last_sync,
            "server": manifest.server,
            "namespaces": {k: v.to_row() for k, v in sorted(manifest.namespaces.items())},
        }
        # ASCII, escapes and all: the server's names and times may hold a lone surrogate.
        atomic_write(self.namespaces_path, json.dumps(raw).encode("utf-8"), durable=False)
        stamps = (_stamp(self.manifest_path), _stamp(self.namespaces_path))
        self._files_cache = _LoadedFiles(stamps[0], manifest.files)  # just written: no re-read
        self._loaded = _Loaded(stamps, manifest)


def _intact(target: str, size: int | None) -> bool:
    """Whether the cached file is there, and of `size` when given.

    A namespace pulled whole because a file's size was off is thus rewritten where it is off.
    """
    try:
        st = os.stat(target)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and (size is None or st.st_size == size)


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

        In a namespace pulled whole, the size is checked too: that is how a damaged file heals.
        """
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
