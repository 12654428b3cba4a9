"""A pull taken in as it streams: each file checked as it comes, nothing in the cache changed.

What becomes of each path is a row of `PullRows` (write it, keep the cached copy, drop the
older one), so a first pull of 100,000 files holds no Python object per file, and a text the
server sent goes to the writer at once (a sync's stages it on disk). What this client cannot
write is skipped and named, and the rest goes on: a path or namespace its rules refuse, a text
over the file limit, not UTF-8, or not matching its sha256. The cache changes only in
`Cache.commit`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection, Iterable

from sharedmem.cache.layout import namespace_key, published_path_problems
from sharedmem.cache.manifest_store import CachedFile, FileTable, PullRows
from sharedmem.core import ProtocolError
from sharedmem.hashing import sha256_bytes
from sharedmem.rules import NOTES_DIR

TYPE_CHECKING = False
if TYPE_CHECKING:
    from sharedmem.cache.writers import FileWriter

SKIPPED_SHOWN = 100  # skipped items a report names one by one; the rest are counted


class Intake:
    """One pull's files, checked and recorded as they come; `Cache.commit` writes them.

    `files` is the manifest's file table as the pull began, `damaged` the cached files found
    not as recorded (written again even at the sha256 the manifest holds), `whole` the
    namespaces the pull replaces whole (a cached file there must also have its recorded size,
    and one the pull does not name goes at the commit).
    """

    def __init__(self, root: str, files: FileTable, writer: FileWriter, *,
                 damaged: Collection[str] = frozenset(), whole: Iterable[str] = (),
                 file_bytes: int | None = None) -> None:
        self.root = root + os.sep
        self.files = files
        self.writer = writer
        self.damaged = damaged
        self.whole = set(whole)
        self.file_bytes = file_bytes
        self.empty = not files  # a new client's cache: no lookup a file
        self.rows = PullRows()
        # sha256 -> this client's own text, for the files written from it: the sync holds
        # those texts anyway (what it published), so this adds no text, only a reference.
        self.own: dict[str, str] = {}
        self.skipped: list[dict[str, str]] = []  # the first SKIPPED_SHOWN
        self.skipped_total = 0
        self._namespaces_ok: dict[str, bool] = {}  # see _plain_ok

    def replace_whole(self, keys: Iterable[str]) -> None:
        """Replace these namespaces whole as well: the server's answer named them so."""
        self.whole.update(keys)

    def add_own(self, items: Iterable[tuple[str, str, str]]) -> None:
        """Take files as this client published them (path, sha256, text): its walk checked them.

        A first sync takes every file of its own this way, so this is one tight loop.
        """
        files, record, own, empty = self.files, self.rows.set, self.own, self.empty
        for path, sha, text in items:
            old = None if empty else files.get(path)
            if old is not None and old.sha256 == sha and self._intact(path, old):
                record(path, sha, PullRows.KEPT)
            else:
                own[sha] = text
                record(path, sha, PullRows.OWN)

    def add(self, path: str, sha: str, text: str | bytes, *, vouched: bool = False,
            plain: bool = False) -> None:
        """Take one pulled file; `vouched`: the text is this client's own for that sha256.

        `plain`: the path is known to keep the path rule (`rules.plain_paths` of its message),
        so only its namespace's names are left to check, once a namespace. A text the server
        sent is checked even where the cache holds that sha256 already: a text that is not
        the one its sha256 names is a lie, named in the report (the cached copy stays).
        """
        if not (plain and self._plain_ok(path)):
            problems = published_path_problems(path)
            if problems:
                self.skip(path, "bad-path", problems[0])
                return
        data, problem = (None, None) if vouched else self._check(text, sha)
        old = None if self.empty else self.files.get(path)
        if old is not None and old.sha256 == sha and self._intact(path, old):
            self.rows.set(path, sha, PullRows.KEPT)
            if problem is not None:
                self._refuse(path, problem, len(text))
            return
        if problem is not None:
            self.rows.set(path, "", PullRows.DROPPED)  # its older copy goes at the commit
            self._refuse(path, problem, len(text))
        elif data is None:
            assert isinstance(text, str)  # vouched: this client's own text
            self.own[sha] = text
            self.rows.set(path, sha, PullRows.OWN)
        else:
            self.writer.take(path, sha, data)
            self.rows.set(path, sha, PullRows.WRITE)

    def _check(self, text: str | bytes, sha: str) -> tuple[bytes | None, str | None]:
        """A text the server sent, in UTF-8, or why it is refused: its size, encoding, sha256.

        As bytes (version 3) it is checked to be UTF-8; as a string (JSON), that it encodes.
        """
        limit = self.file_bytes
        if limit is not None and len(text) > limit:  # more characters than bytes allowed
            return None, "too-large"
        try:
            if isinstance(text, bytes):
                text.decode("utf-8")
                data = text
            else:
                data = text.encode("utf-8")
        except UnicodeError:
            return None, "invalid-utf8"
        if limit is not None and len(data) > limit:
            return None, "too-large"
        if sha256_bytes(data) != sha:
            return None, "sha256-mismatch"
        return data, None

    def _plain_ok(self, path: str) -> bool:
        """Whether a path that keeps the path rule is in a namespace the layout takes.

        Such a path's only possible problems are its namespace's (a machine or source name),
        so they are checked once a namespace. A note's file name has a rule of its own,
        checked file by file.
        """
        try:
            key = namespace_key(path)
        except ProtocolError:
            return False
        if key == NOTES_DIR:
            return False
        ok = self._namespaces_ok.get(key)
        if ok is None:
            ok = self._namespaces_ok[key] = not published_path_problems(path)
        return ok

    def _intact(self, path: str, old: CachedFile) -> bool:
        """Whether the cache holds `old` intact, so a pull of the same sha256 writes nothing.

        A file the sync found damaged is not; in a namespace pulled whole, the size is checked
        too, so a namespace asked for whole because a file's size was off is rewritten there.
        """
        if path in self.damaged:
            return False
        try:
            st = os.stat(self.root + path)
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and (
            old.namespace not in self.whole or st.st_size == old.size)

    def _refuse(self, path: str, reason: str, size: int) -> None:
        """Name a text the server sent that this client does not take, and why."""
        self.skip(path, reason, {
            "too-large": f"{path!r} is over this client's limit of {self.file_bytes} bytes a "
                         f"file (at least {size}); raise limits.file_bytes in client.json to "
                         "take it",
            "invalid-utf8": f"the text sent for {path!r} is not valid UTF-8",
            "sha256-mismatch": f"the server sent a text for {path!r} that does not match "
                               "its sha256"}[reason])

    def skip(self, path: str, reason: str, message: str) -> None:
        """Name one item this client did not take; past SKIPPED_SHOWN they are only counted."""
        self.skipped_total += 1
        if len(self.skipped) < SKIPPED_SHOWN:
            self.skipped.append({"path": _cut(path, 300), "reason": reason,
                                 "message": _cut(message, 500)})


def _cut(text: str, limit: int) -> str:
    """A peer's text kept short enough for a report: a path may be megabytes long."""
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"
