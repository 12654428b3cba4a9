"""The client's plain-Markdown cache of the server's export, and the manifest that describes it.

The manifest lives in SQLite (manifest_store.py): one row a file, so a sync reads the rows it
needs and never holds the store's whole file list as Python objects. A manifest that cannot
be what this cache wrote (not a database, a table missing, a failed integrity check, an older
version's JSON pair) reads as damaged (`Cache.damage`), not as an empty or a wrong cache. A
sync then rebuilds the file list from the files and pulls every namespace whole; until it
has, the tools refuse to answer from it. Each file's size and modification time are recorded
too, so a sync hashes only the files that changed behind its back (`Cache.check_files`) and
writes again those whose text is not the one recorded.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections import namedtuple
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from sharedmem.cache import file_check
from sharedmem.cache.intake import Intake
from sharedmem.cache.layout import Folders, namespace_key, published_path_problems
from sharedmem.cache.manifest_store import (
    STORE_NAME,
    CachedFile,
    Damaged,
    FileTable,
    ManifestStore,
    PullRows,
)
from sharedmem.cache.staged_files import STAGING_DIR, write_failure
from sharedmem.cache.writers import FileWriter, Moved
from sharedmem.clock import utc_now
from sharedmem.core import CacheError, ProtocolError, SharedMemoryError
from sharedmem.files import atomic_write
from sharedmem.hashing import sha256_file
from sharedmem.namespaces import Namespace
from sharedmem.rules import MACHINES_DIR, NOTES_DIR, name_problem

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

META_DIR = ".sharedmem"
INDEX_DIR = "index"  # below META_DIR: the search index's folder (search.py)
MANIFEST_NAME = STORE_NAME
SYNCED_NAME = "synced.json"  # the last sync's time alone, for the MCP server's start (status.py)
# Older versions' files beside the manifest. The JSON pair (manifest.json, namespaces.json)
# makes a cache read as damaged until a sync rebuilds it; the others nothing reads.
LEGACY = ("manifest.json", "namespaces.json")
LEFTOVERS = ("manifest.next.part", "replaced")
NOTES_NAMESPACE = NOTES_DIR


class NamespaceInfo(namedtuple("NamespaceInfo", "key machine source kind generation synced_at "
                               "digest", defaults=(0, None, None))):
    """What the cache holds of one server namespace, and which server generation it is.

    key, machine (None for the notes), source and kind (str), generation (int), synced_at (str
    or None), digest (the server's, of the snapshot at that generation; str or None).
    """

    __slots__ = ()

    @classmethod
    def listed(cls, ns: Namespace) -> NamespaceInfo:
        """What the cache keeps of a namespace the server lists."""
        return cls(ns.key, ns.machine, ns.source, ns.kind, ns.generation, ns.synced_at,
                   ns.digest or None)


class Manifest:
    """Everything the cache knows about itself; written last, after the files.

    `files` is always a `FileTable`: over the manifest's store, or over an empty private one
    when there is none yet. A plain class: a sync and the MCP server's start do not load the
    dataclasses module.
    """

    __slots__ = ("namespaces", "files", "last_sync", "server")

    def __init__(self, namespaces: dict[str, NamespaceInfo] | None = None,
                 files: FileTable | None = None, last_sync: str | None = None,
                 server: dict[str, Any] | None = None) -> None:
        self.namespaces = {} if namespaces is None else namespaces
        self.files = FileTable(ManifestStore("")) if files is None else files
        self.last_sync = last_sync
        self.server = {} if server is None else server


class FilesChecked(namedtuple("FilesChecked", "stale damaged verified")):
    """What a check of the cached files against the manifest found (`Cache.check_files`).

    stale: the namespaces with a file not as recorded, which the pull asks for whole;
    damaged: those files' paths, written again even at the sha256 the manifest holds;
    verified: path -> CachedFile of the files whose time alone moved, re-recorded at the
    commit so each is hashed once.
    """

    __slots__ = ()


NOTHING_CHECKED = FilesChecked(frozenset(), frozenset(), {})


class Committed(namedtuple("Committed", "report written removed")):
    """What a commit did: its report (for `sync --json`), the paths written and removed.

    `written` is streamed from the pull's records, not held; both are what the search index
    re-reads.
    """

    __slots__ = ()


class Cache:
    """A folder of plain Markdown mirroring the server, with its manifest in a hidden folder."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.meta = self.root / META_DIR
        self.store = ManifestStore(self.meta / MANIFEST_NAME)
        self._loaded: tuple[str, Manifest] | None = None  # by the store's commit mark
        self.damage: str | None = None  # why the manifest last loaded is unusable, if it is

    @property
    def manifest_path(self) -> Path:
        """Where the manifest lives."""
        return self.meta / MANIFEST_NAME

    def exists(self) -> bool:
        """Whether a sync has ever completed into this cache."""
        return self.manifest_path.is_file()

    def load(self, *, verify: bool = False) -> Manifest:
        """The manifest: its namespaces and small values read, its files a view of the store.

        A manifest that is missing, is not a database of this version, is shorter than its
        header says, or (`verify`) fails SQLite's integrity check loads empty, and `damage` says
        why. So does a cache of an older version, until a sync rebuilds it.
        """
        try:
            if not self.store.exists():
                self.store.close()
                legacy = [n for n in LEGACY if os.path.lexists(self.meta / n)]
                if legacy:
                    raise Damaged(f"{self.meta / legacy[0]} is an older version's record "
                                  "(the next sync rebuilds it)")
                if os.path.lexists(self.meta / SYNCED_NAME):  # a sync wrote it, and the list
                    raise Damaged(f"{self.manifest_path} is missing")
                self.damage = None
                return Manifest()
            self.store.check_size()
            if verify:
                self.store.verify()
            manifest = self.manifest_of(self.store)
        except Damaged as exc:
            self.damage, self._loaded = str(exc), None
            return Manifest()
        self.damage = None
        return manifest

    def manifest_of(self, store: ManifestStore) -> Manifest:
        """The manifest a store holds, its small values re-read only after a commit."""
        meta = store.meta()
        mark = meta.get("commit", "")
        if self._loaded is not None and self._loaded[0] == mark and mark \
                and self._loaded[1].files.store is store:
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
        if not all(_namespace_ok(k, v) for k, v in namespaces.items()):
            raise Damaged(f"{store.path}: a namespace holds a value of the wrong kind")
        manifest = Manifest(namespaces, FileTable(store), meta.get("last_sync"), server)
        self._loaded = (mark, manifest)
        return manifest

    def check(self, *, verify: bool = True) -> str | None:
        """What `damage` says after `load`.

        A search reads its files' texts from its own index, which records the manifest's
        `files` mark it covers; it needs the manifest's small values, not every page, so it
        asks without the integrity check.
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

    def rebuild(self) -> ManifestStore:
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
        return store

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

    def file_path(self, relpath: str) -> Path:
        """The on-disk path of a published path, refused if it breaks the rules or escapes."""
        problems = published_path_problems(relpath)
        if problems:
            raise ProtocolError("; ".join(problems))
        target = (self.root.resolve() / relpath).resolve()
        if self.root.resolve() not in target.parents:
            raise ProtocolError(f"path {relpath!r} escapes the cache {self.root}: refused")
        return target

    def check_files(self, manifest: Manifest,
                    flagged: Iterable[str] | None = None) -> FilesChecked:
        """Each cached file compared with `manifest`: which are not what it records.

        Each file is stat'ed: `flagged` names those whose stat differs when a helper did that
        already (file_check.py), else it is done here, streaming the rows, each sha256 checked
        to be 64 lower-case hex digits. Only a file whose size or modification time differs
        (or is unknown) is hashed; if its sha256 differs too (a killed sync's text, an edit by
        hand) or it is gone or not a regular file, it is damaged. One whose time alone moved is
        verified. A row that cannot be read, or is malformed, raises Damaged.
        """
        files = manifest.files
        root = str(self.root)
        if flagged is None:
            try:
                flagged = list(file_check.differing(root, files.store.stats()))
            except ValueError as exc:
                raise Damaged(f"{files.store.path} is damaged: {exc}") from None
        stale: set[str] = set()
        damaged: set[str] = set()
        verified: dict[str, CachedFile] = {}
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
            stale.add(meta.namespace)
            damaged.add(path)
        return FilesChecked(stale, damaged, verified)

    def remove_leftovers(self) -> None:
        """Remove what older versions left beside the manifest, which no version reads now.

        They wrote the expected manifest ahead (`manifest.next.part`) and kept the files a
        sync replaced linked in `replaced/` until the next one. A link there is removed, not
        followed; the metadata folder itself is checked first (`check_meta`).
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

    def intake(self, writer: FileWriter | None = None, *, whole: Iterable[str] = (),
               file_bytes: int | None = None,
               checked: FilesChecked = NOTHING_CHECKED) -> Intake:
        """Begin taking a pull in, file by file, against the manifest as it is now.

        The files `checked` found damaged are written again even at the sha256 recorded.
        """
        return Intake(str(self.root), self.load().files, writer or FileWriter(),
                      damaged=checked.damaged, whole=whole, file_bytes=file_bytes)

    def apply(self, upserts: Iterable[tuple[str, str, str]], removals: list[str],
              namespaces: dict[str, NamespaceInfo], *, whole: Iterable[str] = (),
              server: dict[str, Any] | None = None, writer: FileWriter | None = None,
              file_bytes: int | None = None,
              checked: FilesChecked = NOTHING_CHECKED) -> dict[str, Any]:
        """Write a pull held whole into the cache: an intake, each upsert added, then `commit`.

        `upserts` are (path, sha256, text); `namespaces` is the server's complete list, so a
        namespace the server no longer has is removed; a namespace in `whole` loses every file
        not upserted. `file_bytes` caps the UTF-8 size of each text; `checked` is what a check
        of the files found (`check_files`).
        """
        self.check_meta()  # a sync checks it once, as it begins (`CacheUpdate.open`)
        intake = self.intake(writer, whole=whole, file_bytes=file_bytes, checked=checked)
        for path, sha, text in upserts:
            intake.add(path, sha, text)
        return self.commit(intake, removals, namespaces, server=server,
                           verified=checked.verified).report

    def commit(self, intake: Intake, removals: Iterable[str],
               namespaces: Mapping[str, NamespaceInfo], *, server: dict[str, Any] | None = None,
               verified: Mapping[str, CachedFile] | None = None,
               rebuilt: ManifestStore | None = None) -> Committed:
        """Write what `intake` took: files first, then removals, then the manifest's rows.

        Nothing in the cache changes before this. A namespace whose key the layout refuses and
        a removal of a path the rules refuse are skipped and named too; the rest is written.
        Only the rows that change are written, in one transaction, into the manifest, or into
        `rebuilt` (the list `rebuild` made), which then replaces it whole. `verified` are the
        rows whose time alone moved (`check_files`). A commit that fails is undone as far as
        the cache can be (`_abandon`).
        """
        listed = _listed(namespaces, intake)
        gone = _removable(removals, intake)
        if rebuilt is None:
            self.load()
            if self.damage is not None:  # written afresh, as a rebuilt one is
                rebuilt = ManifestStore("")
        store = rebuilt or self.store
        manifest = self.manifest_of(store) if store.exists() else Manifest()
        gone |= _gone(store, listed, intake, manifest.files)
        folders = Folders(self.root)
        _refuse_links(folders, listed, intake.rows)
        done = _Done(intake.rows, str(self.root))
        try:
            _put(intake, folders, done)
            removed, unlinked = self._remove(gone, intake.rows, folders)
            done.at(str(self.manifest_path))
            with store.transaction() as writing:
                taken, files = PullRows.TAKEN, manifest.files
                writing.upsert((p, *m) for p, m in (verified or {}).items()
                               if p in files and intake.rows.state(p) not in taken)
                writing.upsert(_rows(intake.rows.rows(taken, outside=done.moved.folders),
                                     folders.root + os.sep))
                writing.upsert(_moved_rows(done.moved.paths, folders.root + os.sep))
                writing.delete(removed)
                writing.set_namespaces((key, *info[1:]) for key, info in sorted(listed.items()))
                writing.set_meta(utc_now(), server or manifest.server)
            if rebuilt is not None:
                self._replace_manifest(rebuilt)
        except OSError as exc:
            self._abandon(done, intake.writer, rebuilt is not None)
            raise CacheError(f"{write_failure(done.where, exc)}; {_KEPT}") from None
        except SharedMemoryError:
            self._abandon(done, intake.writer, rebuilt is not None)
            raise
        except Exception as exc:  # sqlite3.Error, not imported here
            self._abandon(done, intake.writer, rebuilt is not None)
            if type(exc).__module__ != "sqlite3":
                raise
            raise CacheError(f"{_store_failure(done.where, exc)}; {_KEPT}") from None
        self._loaded = None
        self.damage = None
        written = intake.rows.view(PullRows.TAKEN)
        self._write_synced()
        report = {"written": len(written), "removed": unlinked, "files": self.store.count(),
                  "skipped": intake.skipped, "skipped_total": intake.skipped_total}
        return Committed(report, written, removed)

    def _remove(self, gone: set[str], pulled: PullRows,
                folders: Folders) -> tuple[list[str], int]:
        """Remove each file of `gone` the pull does not hold: the paths, and how many were there."""
        removed: list[str] = []
        unlinked = 0
        for path in sorted(gone):
            if pulled.state(path) in PullRows.HELD:
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
        return removed, unlinked

    def _replace_manifest(self, rebuilt: ManifestStore) -> None:
        """Move a rebuilt file list in whole, in place of the manifest and an older version's pair."""
        rebuilt.save_as(self.manifest_path)
        rebuilt.close()
        for name in LEGACY:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.meta / name)

    def _write_synced(self) -> None:
        """The last sync's time, read by the MCP server's start without opening SQLite."""
        with contextlib.suppress(OSError, Damaged):
            last = self.store.meta().get("last_sync")
            atomic_write(self.meta / SYNCED_NAME, json.dumps({"last_sync": last}).encode(),
                         durable=False)

    def _abandon(self, done: _Done, writer: FileWriter, rebuilt: bool) -> None:
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
        if not replaced or rebuilt:
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


def _listed(namespaces: Mapping[str, NamespaceInfo], intake: Intake) -> dict[str, NamespaceInfo]:
    """The server's namespaces whose key the layout takes; each other one is skipped, named."""
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
    return listed


def _removable(removals: Iterable[str], intake: Intake) -> set[str]:
    """The removals the path rule and layout take; each other one is skipped, named."""
    gone: set[str] = set()
    for path in removals:
        problems = published_path_problems(path)
        if problems:
            intake.skip(path, "bad-path", problems[0])
        else:
            gone.add(path)
    return gone


def _gone(store: ManifestStore, listed: Mapping[str, NamespaceInfo], intake: Intake,
          files: FileTable) -> set[str]:
    """What else the commit removes, besides the removals the server named.

    The files of a namespace gone, or pulled whole, that the pull does not hold, and the older
    copy of each file the pull dropped.
    """
    gone: set[str] = set()
    pulled = intake.rows
    for namespace in (store.file_namespaces() if store.exists() else []):
        if namespace not in listed or namespace in intake.whole:
            gone.update(_missing(store.paths(namespace),
                                 pulled.paths(PullRows.HELD, namespace + "/")))
    gone.update(p for p in pulled.paths((PullRows.DROPPED,)) if p in files)
    return gone


def _refuse_links(folders: Folders, listed: Iterable[str], pulled: PullRows) -> None:
    """Refuse a link where a file or folder of the pull goes, before anything is written.

    Below a namespace's folder that is not there yet no file is, so each path of one is checked
    by checking the folder.
    """
    absent = {key for key in listed if folders.target(f"{key}/-", create=False,
                                                      strict=True) is None}
    for path in pulled.paths(PullRows.TAKEN, outside=absent):
        folders.target(path, create=False, strict=True)


def _put(intake: Intake, folders: Folders, done: _Done) -> None:
    """Put each file the pull takes in place: namespaces moved in whole, then each other file."""
    writer, pulled, own = intake.writer, intake.rows, intake.own
    writer.move_namespaces(pulled, folders, done.moved)
    for path, sha, state in pulled.rows(PullRows.TAKEN, outside=done.moved.folders):
        if done.moved.has(path, state):
            continue
        target = folders.target(path, create=True)
        assert target is not None
        done.at(target)
        writer.write(path, sha, own[sha] if state == PullRows.OWN else None, target)
        done.wrote(path)


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
    """The files a commit has put in place so far, and where it writes now.

    `where` is for the message should the commit fail. The commit writes the files in path
    order, after the namespaces moved in whole (`moved`), so what was written is each of those
    and every other one up to the `last`, not a list.
    """

    def __init__(self, rows: PullRows, where: str) -> None:
        self.rows = rows
        self.moved = Moved()
        self.last: str | None = None
        self.where = where

    def at(self, where: str) -> None:
        """The commit writes `where` next."""
        self.where = where

    def wrote(self, path: str) -> None:
        """The commit put `path` in place; every path before it is in place too."""
        self.last = path

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


_KEPT = ("the cache was left as its manifest describes it (what this sync had not finished is "
         "pulled again by the next one)")


def _file_sha256(path: str) -> str | None:
    """The sha256 of a cached file's bytes; None when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            return sha256_file(handle)
    except OSError:
        return None


def _namespace_ok(key: str, info: NamespaceInfo) -> bool:
    """Whether one namespace of the manifest has each field of its kind."""
    return (info.key == key and type(info.source) is str and type(info.kind) is str
            and type(info.generation) is int and info.generation >= 0
            and (info.machine is None or type(info.machine) is str)
            and (info.synced_at is None or type(info.synced_at) is str)
            and (info.digest is None or type(info.digest) is str))
