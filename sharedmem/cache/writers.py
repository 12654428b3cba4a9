"""How a pull's files reach the cache: each written anew, or moved in from what a sync staged.

`Cache.apply` checks the pull, then hands each file it must change to a writer. The plain one
writes every file; a sync passes the pre-staged one, which moves in the files its helper wrote
ahead (staged_files.py) and vouches for what the sync published itself, so apply does not
check that again.
"""

from __future__ import annotations

import os
from collections.abc import Container, Sequence
from pathlib import Path

from sharedmem.cache.layout import Folders, namespace_key
from sharedmem.files import atomic_write

TYPE_CHECKING = False
if TYPE_CHECKING:
    from sharedmem.cache.staged_files import Staging

Upserts = Sequence[tuple[str, str, str]]  # (path, sha256, text), as a pull sends them


class FileWriter:
    """Writes each file atomically (a temporary file, then a rename); vouches for nothing.

    Not fsynced: the cache is a copy of the server, and the next pull heals a lost write.
    """

    own_texts: Container[str] = frozenset()  # sha256s whose text need not be hashed again
    own_paths: Container[str] = frozenset()  # cache paths that need not be checked again

    def move_namespaces(self, upserts: Upserts, folders: Folders) -> dict[str, int]:
        """Move in whole the namespaces staged just as pulled: path -> size of each file moved."""
        return {}

    def write(self, path: str, sha: str, text: str, target: str) -> int:
        """Put `text` at `target`, the cache file of `path`; returns its size in bytes."""
        data = text.encode("utf-8")
        atomic_write(Path(target), data, durable=False)
        return len(data)


class PreStagedWriter(FileWriter):
    """Moves in the files a sync staged ahead when the pull names that path at that sha256.

    Everything else is written as the plain writer does. `own_texts` are the sha256s of texts
    this client hashed itself (the server sent no body for them); `own_paths` are cache paths
    this client published itself, so they passed the walk's rules, and the layout is its own.
    """

    def __init__(self, staging: Staging, own_texts: Container[str] = frozenset(),
                 own_paths: Container[str] = frozenset()) -> None:
        self.staging = staging
        self.own_texts = own_texts
        self.own_paths = own_paths

    def move_namespaces(self, upserts: Upserts, folders: Folders) -> dict[str, int]:
        """Move in whole each namespace new to the cache that was staged just as pulled.

        On a first sync that is one rename instead of one a file; the rest are moved or
        written one by one.
        """
        new: dict[str, dict[str, str]] = {}
        if self.staging.new_namespaces:
            for path, sha, _ in upserts:
                if (key := namespace_key(path)) in self.staging.new_namespaces:
                    new.setdefault(key, {})[path] = sha
        moved: dict[str, int] = {}
        for key, pulled in new.items():
            target = folders.target(key, create=True)  # makes machines/<machine>, refusing links
            if target is not None and not os.path.lexists(target):
                moved.update(self.staging.move_folder(key, pulled, target))
        return moved

    def write(self, path: str, sha: str, text: str, target: str) -> int:
        """Rename the staged file onto `target` if there is one of `path` at `sha`, else write."""
        size = self.staging.move(path, sha, target)
        return super().write(path, sha, text, target) if size is None else size
