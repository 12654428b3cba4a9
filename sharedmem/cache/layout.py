"""The published layout on the client: namespaces, the paths a server may send, confined folders.

Paths from a server are never trusted: each is checked against the path rule and the layout
(`machines/<machine>/<source>/...` or `extensions/ad_hoc/notes/<note>.md`), and each folder is
then walked without following links before anything is made in it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from sharedmem.core import ProtocolError
from sharedmem.rules import MACHINES_DIR, NOTES_DIR, name_problem, note_filename_problem, path_problems


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
