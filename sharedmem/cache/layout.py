"""The published layout on the client: namespaces, the paths a server may send, confined folders.

Paths from a server are never trusted: each is checked against the path rule and the layout
(`machines/<machine>/<source>/...` or `extensions/ad_hoc/notes/<note>.md`), and each folder is
then walked without following links before anything is made in it. What reads the cache
(the tools list, read and search, and the search index) opens its files through `CacheFiles`,
which follows no link either.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path

from sharedmem.core import PathRuleError, ProtocolError
from sharedmem.rules import MACHINES_DIR, NOTES_DIR, name_problem, note_filename_problem, path_problems
from sharedmem.sources.safe_open import (
    REPARSE_POINT,
    Handle,
    Refused,
    close,
    open_child_dir,
    open_file,
    open_root,
    read_open,
    refusal,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO, TypeVar

    T = TypeVar("T")


def namespace_key(path: str) -> str:
    """The namespace a published path belongs to: `machines/<m>/<s>` or the notes folder."""
    parts = path.split("/")
    if parts[0] == MACHINES_DIR and len(parts) >= 4:
        return "/".join(parts[:3])
    if path.startswith(NOTES_DIR + "/") and len(parts) == 4:
        return NOTES_DIR
    raise ProtocolError(
        f"path {path!r} is outside the published layout (machines/<machine>/<source>/... or "
        f"{NOTES_DIR}/<note>.md)"
    )


def published_path_problems(path: object) -> list[str]:
    """The path rule plus the published layout: what a server may ask a client to write."""
    problems = path_problems(path)
    if problems:
        return problems
    assert isinstance(path, str)
    try:
        key = namespace_key(path)
    except ProtocolError as exc:
        return [str(exc)]
    if key != NOTES_DIR:
        _, machine, source = key.split("/")
        for value, what in ((machine, "machine"), (source, "source")):
            problem = name_problem(value, what)
            if problem:
                problems.append(f"path {path!r}: {problem}")
    elif (problem := note_filename_problem(path.rsplit("/", 1)[1])) is not None:
        problems.append(problem)
    return problems


class Folders:
    """Resolves each folder of a pull once: a symlinked folder planted in the cache is refused."""

    def __init__(self, root: Path) -> None:
        self.root = str(root.resolve())
        self.seen: dict[str, str] = {}
        self.absent: set[str] = set()  # folders found missing while nothing was created
        self.made_root = False

    def target(self, path: str, *, create: bool, strict: bool = False) -> str | None:
        """The on-disk file for an already-checked published path, confined to the cache.

        Each folder is walked one component at a time without following links, so a link
        planted in the cache is refused before anything (even a folder) is made through it.
        Without `create`, a missing folder gives None, and so does a file in the way unless
        `strict` (checking a write before it is made) refuses it. Paths are strings: a large
        pull resolves ten thousand of them.
        """
        folder, _, name = path.rpartition("/")
        real = self.seen.get(folder)
        if real is None:
            if not create and folder in self.absent:
                return None
            real = self.root
            if create and not self.made_root:
                os.makedirs(real, exist_ok=True)
                self.made_root = True
            for part in folder.split("/"):
                real = real + os.sep + part
                try:
                    info = os.lstat(real)
                except FileNotFoundError:
                    if not create:
                        self.absent.add(folder)
                        return None
                    os.mkdir(real)
                    continue
                if stat.S_ISLNK(info.st_mode) or ((create or strict)
                                                  and not stat.S_ISDIR(info.st_mode)):
                    raise ProtocolError(f"cache folder {real} is a link or not a folder, inside "
                                        f"the cache {self.root}: remove it, then sync again")
                if not stat.S_ISDIR(info.st_mode):
                    return None
            self.seen[folder] = real
        return real + os.sep + name


class CacheFiles:
    """Cached files opened below the root without following any link, for whatever reads them.

    The tools list, read and search and the index refresh open cached paths only through this,
    so a link planted in the cache (to a file outside it, or to another cached file) is refused
    the same way everywhere, and a FIFO cannot block a read. Each folder is opened once, from
    its parent; `close` (or the end of a `with`) releases them. Paths are trusted to have passed
    the path rule already: this only confines them.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._folders: dict[str, Handle] = {}

    def __enter__(self) -> CacheFiles:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release every folder opened so far."""
        for handle in self._folders.values():
            close(handle)
        self._folders.clear()

    def folder(self, relpath: str) -> Handle | None:
        """The folder at `relpath` ('' is the root), or None when it or one above is missing.

        Raises PathRuleError when it or a folder above it is a link.
        """
        handle = self._folders.get(relpath)
        if handle is None:
            if relpath:
                handle = self._at(relpath, self._open_folder)
            else:
                try:
                    handle = open_root(self.root)  # the root may be a link the user named
                except (FileNotFoundError, NotADirectoryError):
                    return None
            if handle is not None:
                self._folders[relpath] = handle
        return handle

    def read(self, relpath: str) -> bytes | None:
        """The bytes of the cached file at `relpath`, or None when there is no such file.

        Raises PathRuleError for a link, a file that is not a regular file, or one that cannot
        be read.
        """
        fd = self._at(relpath, open_file)
        if fd is None:
            return None
        try:
            return read_open(fd, relpath, sys.maxsize)[0]
        except Refused:
            raise self._not_regular(relpath) from None
        except OSError as exc:
            raise self._refusal(relpath, exc) from None
        finally:
            os.close(fd)

    def open(self, relpath: str) -> BinaryIO | None:
        """The cached file at `relpath` open to stream, or None when there is no such file.

        For a reader that holds only part of a large file at a time (`read`); refused as `read`
        refuses it.
        """
        fd = self._at(relpath, open_file)
        if fd is None:
            return None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or \
                    getattr(info, "st_file_attributes", 0) & REPARSE_POINT:
                raise self._not_regular(relpath)
            return os.fdopen(fd, "rb", buffering=0)
        except BaseException:
            os.close(fd)
            raise

    def _not_regular(self, relpath: str) -> PathRuleError:
        return PathRuleError(f"{relpath!r} in the cache {self.root} is not a regular file: "
                             "remove it, then sync again")

    def stat(self, relpath: str) -> os.stat_result | None:
        """The cached file's own status (a link's, never its target's); None when missing."""
        return self._at(relpath, self._lstat)

    def _at(self, relpath: str, action: Callable[[Handle, str], T]) -> T | None:
        """`action` on the entry's open parent folder and name; None when either is missing."""
        head, _, name = relpath.rpartition("/")
        parent = self.folder(head)
        if parent is None:
            return None
        try:
            return action(parent, name)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise self._refusal(relpath, exc) from None

    def _open_folder(self, parent: Handle, name: str) -> Handle:
        """Open a folder; with O_NOFOLLOW a link fails as a file in the way would: tell them apart."""
        try:
            return open_child_dir(parent, name)
        except NotADirectoryError:
            if stat.S_ISLNK(self._lstat(parent, name).st_mode):
                raise OSError(errno.ELOOP, "is a link", name) from None
            raise

    @staticmethod
    def _lstat(parent: Handle, name: str) -> os.stat_result:
        """The entry's own status (never a link's target's), from its open parent."""
        if isinstance(parent, int):
            return os.stat(name, dir_fd=parent, follow_symlinks=False)
        return os.lstat(os.path.join(parent, name))

    def _refusal(self, relpath: str, exc: OSError) -> PathRuleError:
        """The error for an entry that exists but cannot be opened: a link, or permissions."""
        if refusal(exc, relpath).reason == "symlink":
            return PathRuleError(f"{relpath!r} in the cache {self.root} is a link or lies in a "
                                 "linked folder; links in the cache are never followed: remove "
                                 "it, then sync again")
        return PathRuleError(f"cannot read {relpath!r} in the cache {self.root} "
                             f"({exc.strerror or exc}): check its permissions")
