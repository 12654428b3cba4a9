"""The client's plain-Markdown cache of the server's export, and the manifest that describes it.

The manifest lives in SQLite (manifest_store.py): one row a file, so a sync reads the rows it
needs and never holds the store's whole file list as Python objects. A manifest that cannot
be what this cache wrote (not a database, a table missing, a failed quick check) reads as
damaged (`Cache.damage`), not as an empty or a wrong cache. A sync then rebuilds the file list
from the files and pulls every namespace whole; until it has, the tools refuse to answer from
it. Each file's size and modification time are recorded too, so a sync hashes only the files
that changed behind its back (`Cache.tampered_namespaces`) and writes again those whose text is
not the one recorded. The two JSON files of older versions are converted once by a sync.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from collections import namedtuple
from collections.abc import Collection, Container, Iterable, Iterator, Mapping
from pathlib import Path

from sharedmem import linejson
from sharedmem.cache import file_check
from sharedmem.cache.layout import Folders, namespace_key, published_path_problems
from sharedmem.cache.manifest_store import (
    STATS_QUERY,
    STORE_NAME,
    Damaged,
    ManifestStore,
    PullRows,
    Row,
)
from sharedmem.cache.staged_files import STAGING_DIR, write_failure
from sharedmem.cache.writers import FileWriter, Moved
from sharedmem.clock import utc_now
from sharedmem.core import CacheError, ProtocolError, SharedMemoryError
from sharedmem.files import atomic_write
from sharedmem.hashing import sha256_bytes, sha256_file
from sharedmem.namespaces import Namespace
from sharedmem.rules import MACHINES_DIR, NOTES_DIR, name_problem

TYPE_CHECKING = False  # typing costs each sync's start milliseconds
if TYPE_CHECKING:
    from typing import Any

META_DIR = ".sharedmem"
INDEX_DIR = "index"  # below META_DIR: the search index's folder (search.py)
MANIFEST_NAME = STORE_NAME
SYNCED_NAME = "synced.json"  # the last sync's time alone, for the MCP server's start (status.py)
LEGACY_MANIFEST, LEGACY_NAMESPACES = "manifest.json", "namespaces.json"  # versions 1 and 2
LEFTOVERS = ("manifest.next.part", "replaced")  # older versions' files, which nothing reads
NOTES_NAMESPACE = NOTES_DIR
SKIPPED_SHOWN = 100  # skipped items a report names one by one; the rest are counted
_HEX = re.compile("[0-9a-f]*")

__all__ = ["Damaged"]  # raised from here too; defined beside the store


class NamespaceInfo(namedtuple("NamespaceInfo", "key machine source kind generation synced_at "
                               "digest", defaults=(0, None, None))):
    """What the cache holds of one server namespace, and which server generation it is.

    key, machine (None for the notes), source and kind (str), generation (int), synced_at (str
    or None), digest (the server's, of the snapshot at that generation; str or None).
    """

    __slots__ = ()

    def to_row(self) -> dict[str, Any]:
        """Its entry as JSON (`status`, an older version's namespaces.json)."""
        return self._asdict()

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> NamespaceInfo:
        """Read an entry of an older namespaces.json; generation and sync time may be missing."""
        return cls(row["key"], row["machine"], row["source"], row["kind"],
                   row.get("generation", 0), row.get("synced_at"), row.get("digest"))

    @classmethod
    def listed(cls, ns: Namespace) -> NamespaceInfo:
        """What the cache keeps of a namespace the server lists."""
        return cls(ns.key, ns.machine, ns.source, ns.kind, ns.generation, ns.synced_at,
                   ns.digest or None)


class CachedFile(namedtuple("CachedFile", "sha256 size namespace mtime_ns", defaults=(None,))):
    """One cached file's provenance: its content address, size, namespace and modification time.

    `mtime_ns` is the file's as the cache last wrote or verified it: a file whose size or time
    differs is hashed by the next sync (`Cache.tampered_namespaces`). None (a manifest of an
    older version) means "verify once".
    """

    __slots__ = ()


class FileTable(Mapping[str, CachedFile]):
    """The manifest's files as a read-only mapping over its store: nothing is held.

    A lookup is one query; iterating streams the rows in path order. It always shows the store
    as it is now, so a caller that needs the file list from before a commit asks before it.
    """

    def __init__(self, store: ManifestStore) -> None:
        self.store = store

    def __getitem__(self, path: str) -> CachedFile:
        row = self.store.get(path) if type(path) is str else None
        if row is None:
            raise KeyError(path)
        return CachedFile(*row[1:])

    def get(self, path: str, default: Any = None) -> Any:  # noqa: D102 - Mapping's, one query
        row = self.store.get(path) if type(path) is str else None
        return default if row is None else CachedFile(*row[1:])

    def __contains__(self, path: object) -> bool:
        return type(path) is str and self.store.get(path) is not None

    def __len__(self) -> int:
        return self.store.count()

    def __bool__(self) -> bool:
        return self.store.holds_any()

    def __iter__(self) -> Iterator[str]:
        return self.store.paths()

    def keys(self) -> Any:  # noqa: D102 - streamed, not a view that would query per key
        return self.store.paths()

    def items(self) -> Any:  # noqa: D102 - streamed in one query
        return ((r[0], CachedFile(*r[1:])) for r in self.store.rows())

    def values(self) -> Any:  # noqa: D102 - streamed in one query
        return (CachedFile(*r[1:]) for r in self.store.rows())

    def rows(self, namespace: str | None = None) -> Iterator[Row]:
        """The rows (path first), of one namespace if named; streamed."""
        return self.store.rows(namespace)

    def sha256s(self, paths: list[str]) -> dict[str, str]:
        """The sha256 of each of `paths` it lists, by path: a few queries for them all."""
        return self.store.sha256s(paths)

    def sizes(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        """(path, size) of each file below `prefix` (a folder and "/", or ""); streamed."""
        return self.store.sizes(prefix)


class Manifest:
    """Everything the cache knows about itself; written last, after the files.

    `files` is a `FileTable` over the store, or a plain dict (an empty cache; a test's). A
    plain class: the dataclasses module would cost every sync and MCP start 15 ms.
    """

    __slots__ = ("namespaces", "files", "last_sync", "server")

    def __init__(self, namespaces: dict[str, NamespaceInfo] | None = None,
                 files: Mapping[str, CachedFile] | None = None, last_sync: str | None = None,
                 server: dict[str, Any] | None = None) -> None:
        self.namespaces = {} if namespaces is None else namespaces
        self.files: Mapping[str, CachedFile] = {} if files is None else files
        self.last_sync = last_sync
        self.server = {} if server is None else server


class Cache:
    """A folder of plain Markdown mirroring the server, with its manifest in a hidden folder."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.meta = self.root / META_DIR
        self.store = ManifestStore(self.meta / MANIFEST_NAME)
        self._rebuilt: ManifestStore | None = None  # see `rebuild`
        self._loaded: tuple[str, Manifest] | None = None  # by the store's commit mark
        self.damage: str | None = None  # why the manifest last loaded is unusable, if it is
        self.damaged: set[str] = set()  # files not as the manifest says (tampered_namespaces)
        self._verified: dict[str, CachedFile] = {}  # files whose time alone moved, re-recorded
        self._check: file_check.Check | None = None  # a helper statting the files (start_check)
        # The last commit's files written (streamed from its pull's records) and removed, for
        # the search index.
        self.written: Collection[str] = ()
        self.removed: list[str] = []

    @property
    def manifest_path(self) -> Path:
        """Where the manifest lives."""
        return self.meta / MANIFEST_NAME

    def exists(self) -> bool:
        """Whether a sync has ever completed into this cache."""
        return self.manifest_path.is_file()

    @property
    def rebuilt(self) -> bool:
        """Whether this run rebuilt the file list from the files (`rebuild`)."""
        return self._rebuilt is not None

    def load(self, *, verify: bool = False) -> Manifest:
        """The manifest: its namespaces and small values read, its files a view of the store.

        A manifest that is missing, is not a database of this version, is shorter than its
        header says, or (`verify`: the tools, `status`) fails SQLite's quick check loads empty,
        and `damage` says why. A sync does not run the quick check (a quarter of a second at
        100,000 files): its check of every file reads every row, and a row that cannot be read
        is damage too (`Exchange.read_cache`). A cache of an older
        version that no sync has converted yet reads as damaged too, until one does.
        """
        if self._rebuilt is not None:
            self.damage = None
            return self._manifest(self._rebuilt)
        try:
            if not self.store.exists():
                self.store.close()
                legacy = [n for n in (LEGACY_MANIFEST, LEGACY_NAMESPACES)
                          if os.path.lexists(self.meta / n)]
                if legacy:
                    raise Damaged(f"{self.meta / legacy[0]} is an older version's record "
                                  "(the next sync converts it)")
                if os.path.lexists(self.meta / SYNCED_NAME):  # a sync wrote it, and the list
                    raise Damaged(f"{self.manifest_path} is missing")
                self.damage = None
                return Manifest()
            self.store.check_size()
            if verify:
                self.store.verify()
            manifest = self._manifest(self.store)
        except Damaged as exc:
            self.damage, self._loaded = str(exc), None
            return Manifest()
        self.damage = None
        return manifest

    def _manifest(self, store: ManifestStore) -> Manifest:
        """The manifest of a store, its small values re-read only after a commit."""
        meta = store.meta()
        mark = meta.get("commit", "")
        if self._loaded is not None and self._loaded[0] == mark and mark \
                and self._loaded[1].files.store is store:  # type: ignore[attr-defined]
            return self._loaded[1]
        try:
            server = json.loads(meta.get("server", "{}"))
            rows = json.loads(meta.get("namespaces", "[]"))
            if type(server) is not dict or type(rows) is not list:
                raise TypeError("not an object and a list")
            namespaces = {r[0]: NamespaceInfo(*r) for r in rows}
        except (ValueError, TypeError, IndexError) as exc:
            raise Damaged(f"{store.path}: its server or namespaces value is not as written "
                          f"({exc})") from None
        if not all(_row_ok(k, v.to_row()) for k, v in namespaces.items()):
            raise Damaged(f"{store.path}: a namespace holds a value of the wrong kind")
        manifest = Manifest(namespaces, FileTable(store), meta.get("last_sync"), server)
        self._loaded = (mark, manifest)
        return manifest

    def check(self, *, verify: bool = True) -> str | None:
        """What `damage` says after `load`.

        A search reads its files' texts from its own index, which records the manifest's
        `files` mark it covers; it needs the manifest's small values, not every page, so it
        asks without the quick check (a quarter of a second at 100,000 files, paid by the first
        search after each sync otherwise).
        """
        self.load(verify=verify)
        return self.damage

    def counts(self) -> dict[str, int]:
        """How many files each namespace holds, counted by SQLite ({} when none can be read)."""
        try:
            if self.damage is None and self.store.exists():
                return self.store.counts()
        except Damaged:
            pass
        return {}

    def files_mark(self) -> str | None:
        """A value that changes with every commit that changes a file row: what an index covers.

        None when the manifest cannot be read.
        """
        try:
            return self.store.meta().get("files") if self.store.exists() else None
        except Damaged:
            return None

    def rebuild(self) -> Manifest:
        """A file list rebuilt from the files themselves (each hashed), for a sync to repair.

        A sync calls it when `damage` is set. No namespace is listed, so its pull asks for every
        namespace whole: a file already at the server's sha256 is kept as it is, others are
        written, and what the server does not have is removed. Links and paths the layout
        refuses are left out, as a pull would never write them. The list is kept in a private
        temporary store until the commit moves it in, so a sync that fails changes nothing.
        """
        store = ManifestStore("")
        with store.transaction() as writing:
            writing.upsert(self._walk_files())
            writing.set_meta(None, {})
        self._rebuilt = store
        self._loaded = None
        return self.load()

    def _walk_files(self) -> Iterator[tuple[str, str, int, str, int]]:
        """Each cached file's row, hashed now; see `rebuild`."""
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
                            sha = sha256_file(handle)
                    except OSError:
                        continue
                    yield rel, sha, info.st_size, namespace_key(rel), info.st_mtime_ns

    def convert(self) -> None:
        """Convert an older version's manifest.json and namespaces.json into the store, once.

        Run by a sync, under its lock. A pair that does not read as intact (the checks that
        version made) is left for `load` to call damaged, so the sync rebuilds the list.
        """
        if self.store.exists():
            return
        legacy = self._legacy()
        if legacy is None:
            return
        raw, files = legacy
        temp = ManifestStore("")
        with temp.transaction() as writing:
            writing.upsert((p, *m) for p, m in files.items())
            writing.set_namespaces(tuple(NamespaceInfo.from_row(v))
                                   for _, v in sorted(raw["namespaces"].items()))
            writing.set_meta(raw.get("last_sync"), raw.get("server", {}))
        del files
        temp.save_as(self.manifest_path)
        temp.close()
        self._remove_legacy()
        self._write_synced()

    def legacy_files(self) -> dict[str, CachedFile]:
        """The files an older version's intact manifest.json lists ({} when there is none).

        For a reader that must not write (the installer, before its sync converts the pair).
        """
        legacy = None if self.store.exists() else self._legacy()
        return legacy[1] if legacy is not None else {}

    def _legacy(self) -> tuple[dict[str, Any], dict[str, CachedFile]] | None:
        """An older version's pair, read with the checks that version made; None if not intact."""
        meta = self.meta
        if not (meta / LEGACY_NAMESPACES).is_file() or not (meta / LEGACY_MANIFEST).is_file():
            return None
        try:
            raw = _namespaces_of((meta / LEGACY_NAMESPACES).read_bytes(),
                                 meta / LEGACY_NAMESPACES)
            data = (meta / LEGACY_MANIFEST).read_bytes()
            recorded = raw.get("manifest_sha256")
            if recorded is not None and recorded != sha256_bytes(data):
                return None
            files, _ = _files_of(data, meta / LEGACY_MANIFEST,
                                 None if recorded else raw["namespaces"])
        except (Damaged, OSError):
            return None
        return raw, files

    def _remove_legacy(self) -> None:
        for name in (LEGACY_MANIFEST, LEGACY_NAMESPACES):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.meta / name)

    def file_path(self, relpath: str) -> Path:
        """The on-disk path of a published path, refused if it breaks the rules or escapes."""
        problems = published_path_problems(relpath)
        if problems:
            raise ProtocolError("; ".join(problems))
        target = (self.root.resolve() / relpath).resolve()
        if self.root.resolve() not in target.parents:
            raise ProtocolError(f"path {relpath!r} escapes the cache {self.root}: refused")
        return target

    def start_check(self) -> None:
        """Have a helper stat the files now, for `tampered_namespaces` to take its answer.

        For a sync, before its walk (file_check.py); a cache of fewer than
        `file_check.MIN_FILES`, or a manifest that cannot be read, is left to the check itself.
        """
        self.discard_check()
        try:
            if not (self.damage is None and self.store.exists()
                    and self.store.holds(file_check.MIN_FILES)):
                return
        except Damaged:
            return
        self._check = file_check.start(str(self.root), str(self.manifest_path), STATS_QUERY)

    def discard_check(self) -> None:
        """Stop a helper whose answer will not be read (the sync ended before its check)."""
        check, self._check = self._check, None
        if check is not None:
            check.discard()

    def tampered_namespaces(self) -> set[str]:
        """Namespaces with a file that is not what the manifest says: the pull asks for them whole.

        Each file is stat'ed, as before every pull: by the helper `start_check` started, if it
        has finished, or here, streaming the rows (nothing is held per file). Only one whose size or
        modification time differs from the manifest's (or is unknown: an older manifest) is
        hashed; if its sha256 differs too (a killed sync's text, an edit by hand) or it is gone
        or not a regular file, `damaged` names it, so the pull writes it again even at the
        sha256 the manifest holds. One whose time alone moved is recorded anew by the next
        commit, so it is hashed once.
        """
        manifest = self.load()
        check, self._check = self._check, None
        flagged = check.answer() if check is not None else None
        bad: set[str] = set()
        damaged: set[str] = set()
        verified: dict[str, CachedFile] = {}
        root = str(self.root)
        files = manifest.files
        if flagged is None:
            # Only what the stat is compared with is read for every file; the rest, for those
            # that differ (sha256 and namespace strings are most of a row's cost).
            flagged = file_check.differing(root, files.store.stats() if isinstance(
                files, FileTable) else ((p, m.size, m.mtime_ns) for p, m in files.items()))
        base = root + os.sep
        for path in flagged:
            meta = files.get(path)
            if meta is None:  # gone from the manifest since this pass began: nothing to check
                continue
            try:
                info = os.lstat(base + path)
            except OSError:
                info = None
            if info is not None and info.st_size == meta.size and stat.S_ISREG(info.st_mode) \
                    and _file_sha256(base + path) == meta.sha256:
                verified[path] = CachedFile(meta.sha256, meta.size, meta.namespace,
                                            info.st_mtime_ns)
                continue
            bad.add(meta.namespace)
            damaged.add(path)
        self.damaged, self._verified = damaged, verified
        return bad

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
        """Write what `intake` took: files first, then removals, then the manifest's rows.

        Nothing in the cache changes before this. A namespace whose key the layout refuses and
        a removal of a path the rules refuse are skipped and named too; the rest is written.
        Only the rows that change are written, in one transaction. `written` and `removed`
        then name the files changed, for the search index.
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
        if self.damage is not None:  # written afresh, as a rebuilt one is
            self._rebuilt = ManifestStore("")
            manifest = self.load()
        store = self._rebuilt or self.store
        files = manifest.files
        pulled = intake.rows
        taken, held = PullRows.TAKEN, PullRows.HELD
        for namespace in (store.file_namespaces() if store.exists() else []):
            if intake.full or namespace not in listed or namespace in intake.full_namespaces:
                gone.update(_missing(store.paths(namespace),
                                     pulled.paths(held, namespace + "/")))
        gone.update(p for p in pulled.paths((PullRows.DROPPED,)) if p in files)
        folders = Folders(self.root)
        # Refuse links before any write. Below a namespace's folder that is not there yet no
        # file is, so each path of one is checked by checking the folder: a first sync's every
        # file, 10,000 checks of 2.5 us instead.
        absent = {key for key in listed if folders.target(f"{key}/-", create=False,
                                                          strict=True) is None}
        for path in pulled.paths(taken, outside=absent):
            folders.target(path, create=False, strict=True)
        base = folders.root + os.sep
        where = str(self.root)  # what is being written, for the message should it fail
        done = _Done(pulled)  # the files put in place
        removed: list[str] = []
        unlinked = 0
        try:
            writer.move_namespaces(pulled, folders, done.moved)
            own, whole = intake.own, done.moved.folders  # every taken file of `whole` is moved
            for path, sha, state in pulled.rows(taken, outside=whole):
                if done.moved.has(path, state):
                    continue
                target = folders.target(path, create=True)
                assert target is not None
                where = target
                writer.write(path, sha, own[sha] if state == PullRows.OWN else None, target)
                done.last = path
            for path in sorted(gone):
                if pulled.state(path) in held:
                    continue
                target = folders.target(path, create=False)
                removed.append(path)
                if target is None:
                    continue
                try:
                    os.unlink(target)
                    unlinked += 1
                except FileNotFoundError:
                    pass
                self._prune_dirs(Path(target).parent)
            where = str(self.manifest_path)
            rows = [(key, *info[1:]) for key, info in sorted(listed.items())]
            with store.transaction() as writing:
                writing.upsert((p, *m) for p, m in self._verified.items()
                               if p in files and pulled.state(p) not in taken)
                writing.upsert(_rows(pulled.rows(taken, outside=whole), base))
                writing.upsert(_moved_rows(done.moved.paths, base))
                writing.delete(removed)
                writing.set_namespaces(rows)
                writing.set_meta(utc_now(), server or manifest.server)
            if self._rebuilt is not None:
                self._rebuilt.save_as(self.manifest_path)
                self._rebuilt.close()
                self._rebuilt = None
                self._remove_legacy()
        except OSError as exc:
            self._abandon(done, writer)
            raise CacheError(f"{write_failure(where, exc)}; {_KEPT}") from None
        except SharedMemoryError:
            self._abandon(done, writer)
            raise
        except Exception as exc:  # sqlite3.Error, not imported here
            self._abandon(done, writer)
            if type(exc).__module__ != "sqlite3":
                raise
            raise CacheError(f"{_store_failure(where, exc)}; {_KEPT}") from None
        self._loaded = None
        self.damage = None
        self.damaged, self._verified = set(), {}
        self.written, self.removed = pulled.view(taken), removed
        self._write_synced()
        return {"written": len(self.written), "removed": unlinked, "files": self.store.count(),
                "skipped": intake.skipped, "skipped_total": intake.skipped_total}

    def _write_synced(self) -> None:
        """The last sync's time, read by the MCP server's start without opening SQLite."""
        with contextlib.suppress(OSError, Damaged):
            last = self.store.meta().get("last_sync")
            atomic_write(self.meta / SYNCED_NAME, json.dumps({"last_sync": last}).encode(),
                         durable=False)

    def _abandon(self, done: _Done, writer: FileWriter) -> None:
        """After a commit failed: leave the cache as its manifest says, freeing what it can.

        The staged files go first (they take room on the same disk), then every file this
        commit created where the manifest named none. A file it replaced keeps its new text
        and is recorded so; every namespace keeps its generation from before, so the next pull
        sends again all this one did not finish. When nothing stayed changed the manifest is
        not written at all: the cache is exactly as it was. If it cannot be written (the disk
        is still full), the old one stays and the next sync finds the replaced files by their
        times and writes them again. A rebuilt list is not written: the next sync rebuilds it.
        """
        writer.discard()
        files = self.load().files
        base = str(self.root.resolve()) + os.sep
        replaced: list[tuple[str, str]] = []  # those the manifest names: few, or a sync's own
        for path, sha in done:
            if path in files:
                replaced.append((path, sha))
                continue
            target = base + path
            try:
                os.unlink(target)
            except OSError:
                continue
            self._prune_dirs(Path(target).parent)
        if not replaced or self._rebuilt is not None:
            return
        rows = []
        for path, sha in replaced:
            with contextlib.suppress(OSError):
                info = os.stat(base + path)
                rows.append((path, sha, info.st_size, namespace_key(path), info.st_mtime_ns))
        with contextlib.suppress(Exception):
            manifest = self.load()
            with self.store.transaction() as writing:
                writing.upsert(rows)
                writing.set_meta(manifest.last_sync, manifest.server)
        self._loaded = None

    def _prune_dirs(self, folder: Path) -> None:
        root = self.root.resolve()
        while folder != root and root in folder.parents:
            try:
                folder.rmdir()
            except OSError:
                return
            folder = folder.parent


def _moved_rows(moved: Mapping[str, tuple[int, int, str, str]],
                base: str) -> Iterator[tuple[str, str, int, str, int]]:
    """The row of each file moved in with its namespace's folder (`Moved.paths`), unstat'ed.

    Its size and time are the staging helper's, read once it closed the file; one it did not
    report is stat'ed.
    """
    for path, (size, mtime, namespace, sha) in moved.items():
        if mtime < 0:
            info = os.stat(base + path)
            size, mtime = info.st_size, info.st_mtime_ns
        yield path, sha, size, namespace, mtime


def _rows(taken: Iterable[tuple[str, str, int]],
          base: str) -> Iterator[tuple[str, str, int, str, int]]:
    """The row of each file just written: its size and time as the disk has them."""
    for path, sha, _ in taken:
        info = os.stat(base + path)
        yield path, sha, info.st_size, namespace_key(path), info.st_mtime_ns


def _missing(paths: Iterator[str], held: Iterator[str]) -> Iterator[str]:
    """The paths not among `held`; both in SQLite's path order (UTF-8 bytes: code points)."""
    other = next(held, None)
    for path in paths:
        while other is not None and other < path:
            other = next(held, None)
        if other != path:
            yield path


class _Done:
    """The files a commit has put in place so far: streamed from the pull's records.

    The commit writes them in path order, after the namespaces moved in whole (`moved`), so
    what was written is each of those and every other one up to the `last`, not a list.
    """

    def __init__(self, rows: PullRows) -> None:
        self.rows = rows
        self.moved = Moved()
        self.last: str | None = None

    def __iter__(self) -> Iterator[tuple[str, str]]:
        last = self.last
        for path, sha, state in self.rows.rows(PullRows.TAKEN):
            if self.moved.has(path, state) or last is not None and path <= last:
                yield path, sha


def _store_failure(where: str, exc: Exception) -> str:
    """What a failed write of the manifest's store says: a full disk and a size limit alike.

    SQLite reports both as "database or disk is full" (or an I/O error), without the errno.
    A lock held past SQLite's wait (another process writing the cache) says so instead.
    """
    if getattr(exc, "sqlite_errorcode", None) == 5 or "locked" in str(exc):  # SQLITE_BUSY
        return (f"cannot write {where} ({exc}): another process holds the cache's manifest; "
                "sync again once it is done")
    return (f"cannot write {where} ({exc}): the disk may be full (`df -h` shows it) or a file "
            "size limit reached (`ulimit -f`); free space or raise the limit, then sync again")


def _intact(target: str, size: int | None) -> bool:
    """Whether the cached file is there, and of `size` when given.

    A namespace pulled whole because a file's size was off is thus rewritten where it is off.
    """
    try:
        st = os.stat(target)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and (size is None or st.st_size == size)


_KEPT = ("the cache was left as its manifest describes it (what this sync had not finished is "
         "pulled again by the next one)")


class Intake:
    """A pull taken in as it streams, so a pull holds neither its texts nor its paths.

    Each file is checked as it comes, and a text from the server goes to the writer at once
    (a sync's stages it on disk). What becomes of each path is a row of `rows` (to write,
    kept, or dropped), so a first pull of 100,000 files holds no Python object per file. What
    this client cannot write is skipped and named, and the rest goes on: a path or namespace
    its rules refuse, a text over `file_bytes`, not UTF-8, or not matching its sha256. The
    cache itself changes only in `Cache.commit`.
    """

    def __init__(self, cache: Cache, writer: FileWriter, full: bool,
                 full_namespaces: Container[str], file_bytes: int | None) -> None:
        self.root = str(cache.root) + os.sep
        self.writer = writer
        self.cached = cache.load().files
        # A new client's cache holds nothing: no lookup a file (each a query of its store).
        self.empty = not self.cached
        self.damaged = cache.damaged  # not as the manifest says: written again (see _intact)
        self.full = full
        self.full_namespaces = full_namespaces
        self.file_bytes = file_bytes
        self.rows = PullRows()  # path -> sha256 and what becomes of it
        # sha256 -> this client's own text, for the files written from it: the sync holds
        # those texts anyway (what it published), so this adds no text, only a reference.
        self.own: dict[str, str] = {}
        self.skipped: list[dict[str, str]] = []  # the first SKIPPED_SHOWN
        self.skipped_total = 0
        self.namespaces_ok: dict[str, bool] = {}  # see _plain_ok

    def add_own(self, items: Iterable[tuple[str, str, str]]) -> None:
        """Take files as this client published them (path, sha256, text): its walk checked them.

        A first sync takes every file of its own this way, so this is one tight loop.
        """
        cached, record, own, empty = self.cached, self.rows.set, self.own, self.empty
        for path, sha, text in items:
            old = None if empty else cached.get(path)
            if old is not None and old.sha256 == sha and self._intact(path, old):
                record(path, sha, PullRows.KEPT)
            else:
                own[sha] = text
                record(path, sha, PullRows.OWN)

    def add(self, path: str, sha: str, text: str, *, vouched: bool = False,
            plain: bool = False) -> None:
        """Take one pulled file; `vouched`: the text is this client's own for that sha256.

        `plain`: the path is known to keep the path rule (`rules.plain_paths` of its message).
        """
        writer = self.writer
        if path not in writer.own_paths and not (plain and self._plain_ok(path)):
            problems = published_path_problems(path)
            if problems:
                self.skip(path, "bad-path", problems[0])
                return
        old = None if self.empty else self.cached.get(path)
        if old is not None and old.sha256 == sha and self._intact(path, old):
            self.rows.set(path, sha, PullRows.KEPT)
            return
        if vouched or sha in writer.own_texts:
            self.own[sha] = text
            self.rows.set(path, sha, PullRows.OWN)
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
        elif sha256_bytes(data) != sha:
            self._drop(path, "sha256-mismatch")
        else:
            writer.take(path, sha, data)
            self.rows.set(path, sha, PullRows.WRITE)

    def _plain_ok(self, path: str) -> bool:
        """Whether a path that keeps the path rule is in a namespace the layout takes.

        Such a path's only possible problems are its namespace's (a machine or source name),
        so they are checked once a namespace: 5 µs a file, half a second of a first pull of
        100,000. A note's file name has a rule of its own, checked file by file.
        """
        try:
            key = namespace_key(path)
        except ProtocolError:
            return False
        if key == NOTES_DIR:
            return False
        ok = self.namespaces_ok.get(key)
        if ok is None:
            ok = self.namespaces_ok[key] = not published_path_problems(path)
        return ok

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
        self.rows.set(path, "", PullRows.DROPPED)
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
            return sha256_file(handle)
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
    return sha256_bytes(json.dumps([rows, digest]).encode("utf-8"))


def _row_ok(key: str, row: dict[str, Any]) -> bool:
    """Whether one namespace entry of namespaces.json has each field of its kind."""
    generation = row.get("generation", 0)
    return (row.get("key") == key and type(row.get("source")) is str
            and type(row.get("kind")) is str and type(generation) is int and generation >= 0
            and (row.get("machine") is None or type(row["machine"]) is str)
            and (row.get("synced_at") is None or type(row["synced_at"]) is str)
            and (row.get("digest") is None or type(row["digest"]) is str))


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
