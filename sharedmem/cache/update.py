"""The cache side of one sync: its first look at the cache, what it stages, its pull, its commit.

A sync (or a note's delivery) holds one `CacheUpdate` from start to end. It is the one object
that touches the cache during a run, in this order:

1. `open`: the metadata folder checked (once, before anything is written there), older
   versions' leftovers removed, the manifest read once (the namespaces' generations the
   pull starts from), and a helper started to stat the files while the sync walks its
   sources (file_check.py);
2. `stage`: the files the walk read that the cache lacks, written ahead (staged_files.py);
3. `check`: the manifest checked for damage (SQLite's integrity check, each row's sha256) and
   every cached file compared with it, before the pull is asked for; a namespace with a file
   not as recorded is asked for whole; a damaged manifest is rebuilt from the files, so the
   pull asks for everything;
4. `take_own` (optional, while the server's answer is on its way) and `intake`: the pull's
   intake, holding this run's own files of the namespaces the server leaves out;
5. `commit`: the files moved or written in, the manifest, then the search index;
6. `discard`: the staged files and the helper gone, whatever happened.

Nothing a reader of the cache can see changes before `commit`.
"""

from __future__ import annotations

import os
from collections import namedtuple
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path

from sharedmem.cache import file_check
from sharedmem.cache.cache import (
    INDEX_DIR,
    NOTES_NAMESPACE,
    NOTHING_CHECKED,
    Cache,
    FilesChecked,
    Manifest,
    NamespaceInfo,
)
from sharedmem.cache.intake import Intake
from sharedmem.cache.manifest_store import INTEGRITY_CHECK, STATS_QUERY, Damaged, ManifestStore
from sharedmem.cache.staged_files import Staging
from sharedmem.cache.writers import PreStagedWriter

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

STAGE_BATCH = 256  # files read, looked up in the cache together before they are staged


class Pulled(namedtuple("Pulled", "intake removed namespaces server")):
    """The server's answer to a pull, read and checked whole; its texts are staged, not applied.

    intake (an `Intake`: the files, each checked and staged or skipped as it came), removed (a
    list of cache paths), namespaces (`NamespaceInfo`s by key), server (its hello's values).
    """

    __slots__ = ()


class CacheUpdate:
    """One run's changes to the cache; see the module's docstring for the order of its steps."""

    def __init__(self, root: Path, *, file_bytes: int | None = None,
                 progress: Callable[[str], None] | None = None,
                 build_index: bool = False) -> None:
        self.cache = Cache(root)
        self.file_bytes = file_bytes
        self.progress = progress or (lambda _msg: None)
        self.build_index = build_index  # build a missing search index in this run
        self.manifest = Manifest()
        self.known: dict[str, int] = {}  # namespace -> the generation the cache holds
        self.digests: dict[str, str | None] = {}  # the server's, as of that generation
        self.damage: str | None = None  # why the manifest cannot be used, if it cannot
        self.rebuilt: ManifestStore | None = None  # the file list rebuilt from the files
        self.checked: FilesChecked | None = None
        self.staging = Staging(self.cache.meta)
        self.writer = PreStagedWriter(self.staging)
        self._helper: file_check.Check | None = None
        self._unstaged: list[tuple[str, str, bytes]] = []
        self._ahead: tuple[frozenset[str], frozenset[str], Intake] | None = None  # take_own

    def open(self, own_namespaces: Collection[str] = (), *, check_ahead: bool = False) -> None:
        """Look at the cache once, before anything is written there.

        `own_namespaces` are this machine's, which the sync publishes: those the cache lacks
        are staged as folders that move in whole. With `check_ahead`, a helper stats the files
        while the sync walks (a cache of `file_check.MIN_FILES` or more).
        """
        cache = self.cache
        cache.check_meta()
        cache.remove_leftovers()
        self._take(cache.load())
        self.damage = cache.damage
        self.staging = Staging(cache.meta, frozenset(own_namespaces) - self.known.keys())
        self.writer = PreStagedWriter(self.staging)
        if check_ahead and self.damage is None:
            try:
                big = cache.store.exists() and cache.store.holds(file_check.MIN_FILES)
            except Damaged:
                big = False
            if big:
                self._helper = file_check.start(str(cache.root), str(cache.manifest_path),
                                                STATS_QUERY, INTEGRITY_CHECK)

    def _take(self, manifest: Manifest) -> None:
        """The manifest's files, and each namespace's generation and digest as recorded."""
        self.manifest = manifest
        self.known = {k: ns.generation for k, ns in manifest.namespaces.items()}
        self.digests = {k: ns.digest for k, ns in manifest.namespaces.items()}

    def stage(self, path: str, sha: str, data: bytes) -> None:
        """A file this run read (its cache path, sha256, UTF-8): staged unless the cache has it.

        The files are looked up in the manifest STAGE_BATCH at a time.
        """
        self._unstaged.append((path, sha, data))
        if len(self._unstaged) >= STAGE_BATCH:
            self._stage_batch()

    def _stage_batch(self) -> None:
        batch, self._unstaged = self._unstaged, []
        if not batch:
            return
        held = self.sha256s([path for path, _, _ in batch])
        for path, sha, data in batch:
            if held.get(path) != sha:
                self.staging.add(path, sha, data)

    def staged(self) -> None:
        """The walk is over: what waits goes to the staging helper now."""
        self._stage_batch()
        self.staging.flush()

    def sha256s(self, paths: list[str]) -> dict[str, str]:
        """The sha256 of each of `paths` the cache lists, by path (as of `open`)."""
        return self.manifest.files.sha256s(paths)

    def held(self, namespace: str) -> dict[str, str]:
        """Path -> sha256 of every file the cache holds in one namespace, in one pass."""
        return {row[0]: row[1] for row in self.manifest.files.rows(namespace)}

    def check(self) -> None:
        """Compare every cached file with the manifest; once, before the pull is asked for.

        Each namespace with a file not as recorded is asked for whole (generation 0). A
        manifest that is damaged is rebuilt from the files and lists no namespace, so the pull
        sends every one whole: the cache is a copy of the server.
        """
        if self.checked is not None:
            return
        helper, self._helper = self._helper, None
        checked = NOTHING_CHECKED
        if self.damage is None:
            try:  # the helper checked the manifest's pages and rows; else it is done here
                flagged = helper.answer() if helper is not None else None
                if helper is not None and helper.damage is not None:
                    raise Damaged(helper.damage)
                if flagged is None and self.cache.store.exists():
                    self.cache.store.verify()
                checked = self.cache.check_files(self.manifest, flagged)
            except Damaged as exc:  # damaged pages, a row that cannot be read or is malformed
                self.damage = str(exc)
        elif helper is not None:
            helper.discard()
        if self.damage is not None:
            self.progress(f"cache: {self.damage}; rebuilding its records from the files and "
                          "pulling everything")
            self.rebuilt = self.cache.rebuild()
            self._take(self.cache.manifest_of(self.rebuilt))
        if checked.damaged:
            self.progress(f"cache: {len(checked.damaged)} files not as last written "
                          "(edited, or left by a killed sync): pulling them again")
        for key in checked.stale & self.known.keys():
            self.known[key] = 0
        self.checked = checked

    def take_own(self, offered: Collection[str], whole: Collection[str],
                 files: Iterable[tuple[str, str, str]]) -> None:
        """Take this run's own files into the pull's intake while the answer is on its way.

        The few files no staging helper took are staged first, here, so the commit moves
        them in as it does the helper's. `offered` are the namespaces the pull asks the server
        to leave out, `whole` those of them taken whole, `files` their files as this run sent
        them. When the answer leaves out just those, `intake` goes on with this one; a first
        sync takes every file here, not after the answer. Nothing here changes the cache.
        """
        self.staging.write_few()
        if self.rebuilt is not None or not offered:
            return
        intake = self._new_intake(whole, files)
        self.writer.plan(intake.rows)  # what its commit moves in whole, checked now
        self._ahead = (frozenset(offered), frozenset(whole), intake)

    def intake(self, namespaces: Mapping[str, NamespaceInfo], full: Collection[str],
               skipped: Collection[str], own_whole: Collection[str],
               own_files: Callable[[], Iterable[tuple[str, str, str]]]) -> Intake:
        """The intake of a pull whose answer names these namespaces.

        `full` are the namespaces the server sends whole, `skipped` those of this run's own it
        left out (taken from `own_files`), `own_whole` those of them taken whole. The pull's
        texts of a namespace new to the cache are staged as a folder that moves in whole.
        """
        if self.rebuilt is None:
            self.staging.put_trees(frozenset(key for key in namespaces if key not in self.known
                                             and key != NOTES_NAMESPACE))
        # A rebuilt file list asked for every note: one the server does not send goes.
        whole = {*full, *own_whole, *([NOTES_NAMESPACE] if self.rebuilt is not None else [])}
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == frozenset(skipped) \
                and ahead[1] == frozenset(whole & ahead[0]):
            intake = ahead[2]
            intake.replace_whole(whole)
            return intake
        return self._new_intake(whole, own_files())

    def _new_intake(self, whole: Iterable[str], own: Iterable[tuple[str, str, str]]) -> Intake:
        intake = Intake(str(self.cache.root), self.manifest.files, self.writer,
                        damaged=(self.checked or NOTHING_CHECKED).damaged, whole=whole,
                        file_bytes=self.file_bytes)
        intake.add_own(own)
        return intake

    def commit(self, pulled: Pulled) -> dict[str, Any]:
        """Write what was pulled into the cache, then bring the search index up to date.

        The staged texts move in, then the manifest. When the run changed the cache, or the
        index is behind it (a background build that a later sync overtook), a detached `index`
        brings the index up to date once this run has ended: the sync never waits for it, and
        until it is done searches read the files the index does not vouch for, so their results
        are the same. Without an index to update, it is built only when `build_index` says so
        (the installer's first sync): a sync on the schedule leaves that to the first search,
        which builds it in the background and scans meanwhile.
        """
        self.staging.wait()
        indexed = self.build_index or (self.cache.meta / INDEX_DIR).exists()
        if indexed:  # no index, none to build: the search index's module is not even loaded
            from sharedmem.cache import search_index
        checked = self.checked or NOTHING_CHECKED
        rebuilt, self.rebuilt = self.rebuilt, None
        committed = self.cache.commit(pulled.intake, pulled.removed, pulled.namespaces,
                                      server=pulled.server, verified=checked.verified,
                                      rebuilt=rebuilt)
        outcome = committed.report
        if checked.damaged or rebuilt is not None:
            outcome["repaired"] = {"files": len(checked.damaged), "records": rebuilt is not None}
        if not indexed:
            return outcome
        # A time re-recorded is no change of text; a file rewritten at its sha256 is re-read.
        changed = outcome["written"] + len(committed.removed)  # counted once, by the commit
        if changed or search_index.index_mark(self.cache) is None:
            self.progress(f"search index: updating for {changed} files, in the background")
            if not search_index.refresh_in_background(self.cache, os.getpid()):
                outcome["index_error"] = ("the background `index` could not be started: the "
                                          "first search starts it again")
        return outcome

    def discard(self) -> None:
        """Remove every staged file and stop the helpers: the run is over, however it went."""
        self.staging.discard()
        helper, self._helper = self._helper, None
        if helper is not None:
            helper.discard()
        if self.rebuilt is not None:
            self.rebuilt.close()
            self.rebuilt = None
