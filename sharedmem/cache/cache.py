"""The client's plain-Markdown cache of the server's export, and the manifest that describes it."""

from __future__ import annotations

import json
import os
import stat
from collections import namedtuple
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from sharedmem import linejson
from sharedmem.cache.layout import Folders, namespace_key, published_path_problems
from sharedmem.cache.writers import FileWriter
from sharedmem.clock import utc_now
from sharedmem.core import ProtocolError
from sharedmem.files import atomic_write
from sharedmem.hashing import sha256_text
from sharedmem.namespaces import Namespace
from sharedmem.rules import MACHINES_DIR, NOTES_DIR, name_problem

META_DIR = ".sharedmem"
MANIFEST_NAME = "manifest.json"
NAMESPACES_NAME = "namespaces.json"
LEFTOVERS = ("manifest.next.part", "replaced")  # older versions' files, which nothing reads
MANIFEST_VERSION = 1
NOTES_NAMESPACE = NOTES_DIR


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
        followed.
        """
        for name in LEFTOVERS:
            path = self.meta / name
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError:  # a folder
                import shutil
                shutil.rmtree(path, ignore_errors=True)

    def apply(
        self,
        upserts: list[tuple[str, str, str]],
        removals: list[str],
        namespaces: dict[str, NamespaceInfo],
        *,
        full: bool = False,
        full_namespaces: set[str] | frozenset[str] = frozenset(),
        server: dict[str, Any] | None = None,
        writer: FileWriter | None = None,
    ) -> dict[str, int]:
        """Write a pull into the cache: every path checked first, then files, then the manifest.

        `upserts` are (path, sha256, text); `namespaces` is the server's complete list, so a
        namespace the server no longer has is removed. With `full`, every file not upserted is
        removed too (a version 1 pull sends the whole export); `full_namespaces` does the same
        for those namespaces only. `writer` puts each file in place (writers.py): the plain one
        writes it; a sync's moves in what it staged ahead, and vouches for the paths and texts
        the sync published itself, which are then not checked again.
        """
        writer = writer or FileWriter()
        own_paths, own_texts = writer.own_paths, writer.own_texts
        problems = []
        for path, sha, text in upserts:
            if path not in own_paths:
                problems.extend(published_path_problems(path))
            if sha not in own_texts and sha256_text(text) != sha:
                problems.append(f"path {path!r}: the text does not match its sha256 {sha}")
        for path in removals:
            problems.extend(published_path_problems(path))
        for key in namespaces:
            if key != NOTES_DIR and (len(key.split("/")) != 3 or key.split("/")[0] != MACHINES_DIR
                                     or any(name_problem(p) for p in key.split("/")[1:])):
                problems.append(f"namespace {key!r} is not machines/<machine>/<source>")
        if problems:
            raise ProtocolError(
                "the server sent paths this client refuses to write, so the cache was left as "
                "it was:\n  - " + "\n  - ".join(problems[:20])
            )
        manifest = self.load()
        files = dict(manifest.files)
        gone = set(removals)
        if full:
            gone |= set(files) - {p for p, _, _ in upserts}
        elif full_namespaces:
            sent = {p for p, _, _ in upserts}
            gone |= {p for p, meta in files.items()
                     if meta.namespace in full_namespaces and p not in sent}
        gone |= {p for p, meta in files.items() if meta.namespace not in namespaces}
        folders = Folders(self.root)
        for path, _, _ in upserts:
            folders.target(path, create=False, strict=True)  # refuse links before any write
        moved = writer.move_namespaces(upserts, folders)
        written = len(moved)
        for path, sha, text in upserts:
            if path in moved:
                files[path] = CachedFile(sha, moved[path], namespace_key(path))
                continue
            target = folders.target(path, create=True)
            assert target is not None
            old = files.get(path)
            if old is not None and old.sha256 == sha and _intact(
                    target, old.size if full or old.namespace in full_namespaces else None):
                files[path] = CachedFile(sha, old.size, namespace_key(path))
                continue
            size = writer.write(path, sha, text, target)
            written += 1
            files[path] = CachedFile(sha, size, namespace_key(path))
        removed = 0
        for path in sorted(gone - {p for p, _, _ in upserts}):
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
        new = Manifest(namespaces=dict(namespaces), files=files, last_sync=utc_now(),
                       server=server or manifest.server)
        self._write_manifest(new, files_changed=bool(written or removed)
                             or files != manifest.files)
        return {"written": written, "removed": removed, "files": len(files)}

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
        atomic_write(self.namespaces_path, json.dumps(raw, ensure_ascii=False).encode("utf-8"),
                     durable=False)
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
