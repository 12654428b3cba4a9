"""How a pull's files reach the cache: each written anew, or moved in from what was staged.

`Cache.commit` hands each file it must change to a writer. Texts the server sent reach the
writer first, as the pull streams in (`take`): the plain writer holds them until the commit;
a sync's pre-staged writer writes each into the staging folder at once, so a pull never holds
more than one message of texts, and moves them into place at the commit. It also moves in the
files its helper wrote ahead (staged_files.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from sharedmem.cache.layout import Folders, namespace_key
from sharedmem.cache.manifest_store import PullRows
from sharedmem.core import CacheError
from sharedmem.files import atomic_write

TYPE_CHECKING = False
if TYPE_CHECKING:
    from sharedmem.cache.staged_files import Staging

class Moved:
    """What `move_namespaces` moved in whole: the sync's own files by path, pulled namespaces.

    A namespace of the sync's own moved in (`folders`) holds every file the pull takes for it
    (each in `paths`); a pulled one (`trees`) every file the pull took from the server for it
    (state `PullRows.WRITE`), nothing else: a file of its own text is still written one by one.
    """

    def __init__(self) -> None:
        # size, time (-1: unknown), namespace, sha256
        self.paths: dict[str, tuple[int, int, str, str]] = {}
        self.folders: set[str] = set()
        self.trees: set[str] = set()

    def has(self, path: str, state: int) -> bool:
        """Whether the file the pull records so (`PullRows`) was moved in with its folder."""
        return path in self.paths or bool(self.trees) and state == PullRows.WRITE \
            and namespace_key(path) in self.trees


class FileWriter:
    """Writes each file atomically (a temporary file, then a rename).

    The texts it takes wait in memory until the commit. Not fsynced: the cache is a copy of
    the server, and the next pull heals a lost write.
    """

    def __init__(self) -> None:
        self.taken: dict[tuple[str, str], bytes] = {}

    def take(self, path: str, sha: str, data: bytes) -> None:
        """Keep a checked text the server sent (UTF-8) until the commit writes it."""
        self.taken[(path, sha)] = data

    def discard(self) -> None:
        """Drop what was taken and not written: a commit failed and is undone."""
        self.taken.clear()

    def plan(self, pulled: PullRows) -> None:
        """Work out ahead of the commit what `move_namespaces` will move; this writer moves none."""

    def move_namespaces(self, pulled: PullRows, folders: Folders, moved: Moved) -> None:
        """Move in whole the namespaces staged just as pulled, into `moved` as each goes.

        This writer stages nothing.
        """

    def write(self, path: str, sha: str, text: str | None, target: str) -> None:
        """Put the file at `target`, the cache file of `path`.

        `text` None: the text taken for that path and sha256.
        """
        data = self.taken.pop((path, sha)) if text is None else text.encode("utf-8")
        atomic_write(Path(target), data, durable=False)


class PreStagedWriter(FileWriter):
    """Moves in what was staged for the very path and sha256 the pull names; writes the rest.

    Texts the server sent are staged as they arrive (`take`).
    """

    def __init__(self, staging: Staging) -> None:
        super().__init__()
        self.staging = staging
        self.plans: dict[str, dict[str, tuple[int, int, str, str]]] = {}  # see `plan`

    def take(self, path: str, sha: str, data: bytes) -> None:
        """Stage a checked text the server sent now, so the pull does not hold it.

        One already staged for that path and sha256 (a sync's own: it then vouches for the
        text, so this is rare) is kept in memory too, in case its helper failed to write it.
        """
        if self.staging.queued(path, sha):
            super().take(path, sha, data)
        else:
            self.staging.put(path, sha, data)

    def discard(self) -> None:
        """Drop the texts held and every staged file, so a failed commit frees their room."""
        super().discard()
        self.staging.discard()

    def move_namespaces(self, pulled: PullRows, folders: Folders, moved: Moved) -> None:
        """Move in whole each namespace new to the cache that was staged just as pulled.

        On a first sync that is one rename a namespace instead of one a file: of the sync's
        own files its helper staged, and of the texts the server sent (`Staging.pull_trees`).
        Each is in `moved` as soon as it is in place, so a commit that fails after it undoes
        it. The rest are moved or written one by one.
        """
        touched = pulled.touched()
        for key in sorted(self.staging.new_namespaces):
            if touched is not None and key not in touched and key in self.plans:
                checked = self.plans[key]  # what `plan` found, which nothing recorded since
            else:
                checked = self._check(pulled, key)
            if not checked:
                continue
            target = folders.target(key, create=True)  # makes machines/<machine>, refusing links
            if (target is not None and not os.path.lexists(target)
                    and self.staging.move_folder(key, checked, target)):
                moved.paths.update(checked)
                moved.folders.add(key)
        for key in sorted(self.staging.pull_trees):
            count = pulled.count((PullRows.WRITE,), key + "/")
            if not count:
                continue
            target = folders.target(key, create=True)
            if target is not None and not os.path.lexists(target) \
                    and self.staging.move_tree(key, count, target):
                moved.trees.add(key)

    def plan(self, pulled: PullRows) -> None:
        """Check each new namespace's staged folder against the pull now, before the commit.

        A sync does it while the server's answer is on its way, once the helper is done: the
        commit then moves what was found, unless the pull recorded a file of that namespace
        since (`PullRows.watch`). A first sync's check of 10,000 files is off its end.
        """
        if not self.staging.new_namespaces:
            return
        self.staging.wait()
        pulled.watch()
        self.plans = {key: self._check(pulled, key) for key in self.staging.new_namespaces}

    def _check(self, pulled: PullRows, key: str) -> dict[str, tuple[int, int, str, str]]:
        """`Staging.check_folder` of a new namespace against what the pull takes of it."""
        files = {path: sha for path, sha, _ in pulled.rows(PullRows.TAKEN, key + "/")}
        return self.staging.check_folder(key, files) if files else {}

    def write(self, path: str, sha: str, text: str | None, target: str) -> None:
        """Rename the staged file onto `target` if there is one of `path` at `sha`, else write."""
        if self.staging.move(path, sha, target, taken=text is None):
            self.taken.pop((path, sha), None)
            return
        if text is None and (path, sha) not in self.taken:
            raise CacheError(f"the staged copy of {path!r} in {self.staging.folder} is gone "
                             "(removed while the sync ran?): sync again")
        super().write(path, sha, text, target)
