"""One walk of a source's folder: the files it publishes and those it skips, one at a time.

The walker applies the rules every source kind shares: hidden names and links are refused, each
path follows the path rule and the kind's allowlist, case and Unicode collisions and the quotas
are reported, and a file whose size and mtime match its saved record is reused unread. What it
reads is redacted in batches. Which folders a kind enters, and which names it offers, is for
`sharedmem.sources.kinds` to say.
"""

from __future__ import annotations

import os
import unicodedata
from collections import namedtuple
from collections.abc import Callable, Iterator, Mapping

from sharedmem.hashing import sha256_bytes
from sharedmem.rules import Limits, collision_key
from sharedmem.sources import allowlist
from sharedmem.sources.safe_open import (
    Handle,
    Refused,
    is_link,
    list_dir,
    open_child_dir,
    read_utf8,
    refusal,
    too_large,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

REDACT_BATCH_BYTES = 1 << 20  # files read are redacted in batches of about this many bytes

_new = tuple.__new__  # a named tuple made from all its fields, without its keywords' cost


# Plain named tuples, as the other snapshot types are (see sources.SourceSpec).
class Entry(namedtuple("Entry", "path sha256 size mtime_ns disk_size redactions text disk_path",
                       defaults=("",))):
    """One published file.

    Its published path, the sha256 and size of its redacted text, the file's mtime_ns and size
    on disk, redaction counts, the text (None when reused from the previous record unread) and
    where it lies below the source's root.
    """

    __slots__ = ()


class Skipped(namedtuple("Skipped", "path reason message")):
    """A file or folder that was not published, with a reason code and a message for people."""

    __slots__ = ()


def display(text: str) -> str:
    """A printable form of an on-disk name that may hold undecodable bytes."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _hex_sha256(text: str) -> bool:
    """Whether `text`, a str of 64 characters, is a sha256 in lower-case hex: checked in C.

    `bytes.fromhex` refuses every character but the hex digits and the ASCII whitespace it
    skips, which leaves fewer than 32 bytes.
    """
    try:
        return len(bytes.fromhex(text)) == 32 and text == text.lower()
    except ValueError:
        return False


def record_entry(e: Entry) -> list[Any]:
    """A file's entry in a source's record: what the next walk compares and reuses unread.

    `[disk size, mtime_ns, sha256, size, redactions]`, JSON as it is saved.
    """
    return [e.disk_size, e.mtime_ns, e.sha256, e.size, dict(e.redactions)]


def valid_record(value: object) -> bool:
    """Whether a saved record entry has the shape `record_entry` gives, each value of its kind.

    Checked once where the record is read (client/source_state.py): the walk trusts what it
    is given as `previous`.
    """
    if type(value) is not list or len(value) != 5:
        return False
    disk_size, mtime_ns, sha, size, counts = value
    return (type(disk_size) is int and disk_size >= 0 and type(mtime_ns) is int
            and type(size) is int and size >= 0 and type(sha) is str and len(sha) == 64
            and _hex_sha256(sha) and type(counts) is dict
            and all(type(k) is str and type(v) is int and v >= 0 for k, v in counts.items()))


class Walker:
    """Collects the files and skips of one snapshot, applying path, collision and quota rules."""

    def __init__(self, kind: str, name: str, limits: Limits, previous: Mapping | None,
                 on_read: Callable[[Entry, bytes], None] | None = None) -> None:
        self.kind = kind
        self.name = name
        self.limits = limits
        self.on_read = on_read
        self.previous = previous if isinstance(previous, Mapping) else {}
        self.files: list[Entry] = []
        self.skipped: list[Skipped] = []
        self.keys: set[str] = set()
        self.bytes = 0
        self.full = False
        # Files read this time that wait for the next flush, in walk order: (disk path,
        # published path, stat, bytes read, raw text). Redaction runs over a run of them at once
        # (redact.redact_many); the bytes read are the text's UTF-8, hashed as they are when
        # nothing changed. A file reused unread flushes them first (`_take_reused`).
        self.queue: list[tuple[str, str, os.stat_result, bytes, str]] = []
        self.queued_bytes = 0

    def skip(self, shown: str, reason: str, message: str) -> None:
        """Report a file or folder left out, in walk order with the files queued before it."""
        self.flush()  # decisions on earlier files come first, as if each were taken at once
        self.skipped.append(Skipped(display(shown), reason, message))

    def flush(self) -> None:
        """Redact the queued files in one batch, then accept or refuse each in walk order."""
        queue, self.queue, self.queued_bytes = self.queue, [], 0
        if not queue:
            return
        from sharedmem.redact.redactor import redact_many  # its patterns compile on first use
        redacted = redact_many([raw for *_, raw in queue], [data for *_, data, _ in queue])
        for (disk, published, st, data, _), (text, counts) in zip(queue, redacted, strict=True):
            if counts:
                data = text.encode("utf-8")
            if len(data) > self.limits.file_bytes:
                skip = too_large(display(disk), len(data), self.limits.file_bytes)
                self.skipped.append(Skipped(display(disk), skip.reason, skip.detail))
                continue
            made = Entry(published, sha256_bytes(data), len(data), st.st_mtime_ns,
                         st.st_size, dict(counts), text, disk)
            if self._accept(disk, made) and self.on_read is not None:
                self.on_read(made, data)

    def _accept(self, disk: str, made: Entry) -> bool:
        """Publish `made` unless the namespace's byte quota is past (then it is skipped)."""
        if self.full or self.bytes + made.size > self.limits.namespace_bytes:
            self.full = True
            shown = display(disk)
            self.skipped.append(Skipped(shown, "quota", self._quota_message(shown)))
            return False
        self.bytes += made.size
        self.files.append(made)
        return True

    def listing(self, handle: Handle, rel: str) -> list[os.DirEntry]:
        """A folder's sorted entries; an unlistable subfolder is reported, the root raises."""
        try:
            return list_dir(handle)
        except OSError as exc:
            if not rel:
                raise
            skip = refusal(exc, display(rel.rstrip("/")))
            self.skip(rel.rstrip("/"), skip.reason, skip.detail)
            return []

    def entries(self, handle: Handle, rel: str,
                listing: list[os.DirEntry] | None = None) -> Iterator[os.DirEntry]:
        """Entries of a folder (`listing` if read already) that are neither hidden nor links."""
        for entry in self.listing(handle, rel) if listing is None else listing:
            if self.admit(entry, rel):
                yield entry

    def admit(self, entry: os.DirEntry, rel: str) -> bool:
        """Whether an entry of folder `rel` is neither hidden nor a link; reported if it is."""
        if entry.name.startswith("."):
            shown = f"{rel}{entry.name}"
            self.skip(shown, "hidden", f"{display(shown)} is hidden; hidden names are never published")
            return False
        try:
            link = is_link(entry)
        except OSError:
            shown = f"{rel}{entry.name}"
            self.skip(shown, "vanished", f"{display(shown)} disappeared during the walk")
            return False
        if link:
            shown = f"{rel}{entry.name}"
            self.skip(shown, "symlink",
                      f"{display(shown)} is a link or junction; links are never followed")
            return False
        return True

    def reuses_plain(self, plain: bool) -> bool:
        """Whether `reuse_plain` may take a folder's files: its names are plain, there is a record.

        Not on Windows, where a file may be a reparse point that only `is_link`'s stat shows.
        """
        return plain and bool(self.previous) and os.name != "nt"

    def reuse_plain(self, entry: os.DirEntry, disk: str, published: str) -> bool:
        """Publish an unchanged `.md` file of a plain folder from its record, in few steps.

        The steps `admit` and `file` take for it, for the one case of every file of a sync
        that changed nothing: a plain name (no NFC or path rule to apply, the collision key is
        the lower case), a regular file, its size and time as recorded, room in the quota.
        False, having reported nothing, leaves the entry to them: a hidden name, a link or
        anything else that is not a regular file, a collision, a full quota, a file whose
        record does not match. `disk` and `published` are the folder's prefixes.
        """
        name = entry.name
        if name[0] == "." or not name.endswith(".md"):
            return False
        try:
            if not entry.is_file(follow_symlinks=False):  # false for a link
                return False
            st = entry.stat(follow_symlinks=False)
        except OSError:
            return False
        path = published + name
        rec = self.previous.get(path)
        if rec is None:
            return False
        disk_size, mtime_ns, sha, size, counts = rec
        limits = self.limits
        if (disk_size != st.st_size or mtime_ns != st.st_mtime_ns or counts
                or disk_size > limits.file_bytes or size > limits.file_bytes):
            return False  # one with redactions goes the general way, which copies its counts
        key = path.lower()
        if (key in self.keys or self.full
                or len(self.files) + len(self.queue) >= limits.namespace_files):
            return False
        self.keys.add(key)
        made = _new(Entry, (path, sha, size, mtime_ns, disk_size, {}, None, disk + name))
        self._take_reused(made.disk_path, made)
        return True

    def _take_reused(self, disk: str, made: Entry) -> None:
        """Publish a file reused unread, after the files read before it that wait in the queue.

        They are redacted now, however few: queued behind them, nearly every reused file of a
        sync that read a few would wait in the queue too, and redacting a file by itself costs
        about what it does in a batch.
        """
        if self.queue:  # as if each were taken at once, in walk order
            self.flush()
        self._accept(disk, made)

    def subdir(self, handle: Handle, name: str, shown: str) -> Handle | None:
        """Open a child folder, reporting why not when it cannot be opened."""
        try:
            return open_child_dir(handle, name)
        except OSError as exc:
            skip = refusal(exc, display(shown))
            self.skip(shown, skip.reason, skip.detail)
            return None

    def file(self, handle: Handle, entry: os.DirEntry, disk: str, published: str,
             plain: bool = False) -> None:
        """Publish one candidate `.md` file found at `disk` (below the root) as `published`.

        `plain`: its folder's names are plain (`allowlist.plain`), so the path rule holds.
        This runs for every file of every sync, so what only a refusal needs is made then.
        """
        try:
            if not entry.is_file(follow_symlinks=False):
                shown = disk if plain else display(disk)
                self.skip(disk, "not-regular",
                          f"{shown} is not a regular file; it is not published")
                return
            # Only a file the last sync read may be reused unread; any other is read, and
            # read_utf8 takes its size and time from the open file.
            st = entry.stat(follow_symlinks=False) if self.previous else None
        except OSError:
            shown = disk if plain else display(disk)
            self.skip(disk, "vanished", f"{shown} disappeared during the walk; sync again")
            return
        if plain:  # plain names are ASCII: the collision key is the lower case
            key = published.lower()
        else:
            published = unicodedata.normalize("NFC", published)
            problems = allowlist.problem(self.kind, published)
            if problems:
                self.skip(disk, "bad-path",
                          f"{display(disk)} cannot be published: {problems}; rename it")
                return
            key = collision_key(published)
        if key in self.keys:
            shown = disk if plain else display(disk)
            self.skip(disk, "collision", f"{shown} has the same name as another file once case and "
                      "Unicode form are ignored; rename one of them")
            return
        self.keys.add(key)
        limit = self.limits.namespace_files
        if len(self.files) + len(self.queue) >= limit:
            self.flush()  # the file-count quota is decided on accepted files only
        if self.full or len(self.files) >= limit:
            self.full = True
            shown = disk if plain else display(disk)
            self.skip(disk, "quota", self._quota_message(shown))
            return
        reused = None if st is None else self._reuse(published, disk, st)
        if reused is not None:
            self._take_reused(disk, reused)
            return
        shown = disk if plain else display(disk)
        try:
            raw, data, st = read_utf8(handle, entry.name, shown, self.limits.file_bytes)
        except Refused as skip:
            self.skip(disk, skip.reason, skip.detail)
            return
        self.queue.append((disk, published, st, data, raw))
        self.queued_bytes += len(raw)
        if self.queued_bytes >= REDACT_BATCH_BYTES:
            self.flush()

    def _quota_message(self, shown: str) -> str:
        return (f"{shown} is past the quota of source {self.name!r} "
                f"({self.limits.namespace_files} files, {self.limits.namespace_bytes} bytes); "
                "remove files or raise the limit")

    def _reuse(self, published: str, disk: str, st: os.stat_result) -> Entry | None:
        """The previous record's entry when size and mtime are unchanged, without reading."""
        rec = self.previous.get(published)
        if rec is None or rec[0] != st.st_size or rec[1] != st.st_mtime_ns:
            return None
        if rec[0] > self.limits.file_bytes or rec[3] > self.limits.file_bytes:
            return None
        return Entry(published, rec[2], rec[3], rec[1], rec[0], dict(rec[4]), None, disk)
