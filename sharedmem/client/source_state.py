"""A source's saved state: what its last sync read and published, in `state/sources/<name>.json`.

The record lets the next snapshot skip reading a file whose size and modification time are
unchanged, and the acknowledged digest is what the next manifest is a delta against. It is
written one file a line (`linejson.py`), so a rewrite reuses the lines of the files it did not
read again. It is checked once, here, as it is read: an entry of another shape is left out
(that file is read again), and the walk and the delta trust what is left.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Iterable
from pathlib import Path

from sharedmem import linejson
from sharedmem.sources.walk import Entry, record_entry, valid_record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from sharedmem.linejson import Old as Lines  # the record's lines as read, for reuse


class SourceState(namedtuple("SourceState", "rules acked record", defaults=(None, None, {}))):
    """One source's state file: the rules it was made under, what was acknowledged, the record.

    `rules` are the release and limits (under others the record is not reused); `acked` the
    digest the server confirmed of the record's files (the next delta's base), or None;
    `record` maps each published path to `[disk size, mtime_ns, sha256, size, redactions]`
    (`walk.record_entry`), every entry checked.
    """

    __slots__ = ()

    def acked_shas(self) -> set[str]:
        """The sha256s the server confirmed: those of the record, when it was acknowledged."""
        if self.acked is None:
            return set()
        return {r[2] for r in self.record.values()}


def encode_state(rules: Any, acked: str | None, files: Iterable[Entry], old: Lines) -> str:
    """The state file's text for a snapshot's `files`; `old` are the saved record's lines.

    A file not read this time keeps its saved line as it is (`linejson.rewrite`): a sync that
    read 100 of 10,000 files encodes 100 lines.
    """
    head = {"rules": rules, "acked": None if acked is None else {"digest": acked}}
    return linejson.rewrite(head, "record", ((e.path, e, e.text is None) for e in files), old,
                            record_entry)


def read(path: Path) -> tuple[SourceState, Lines]:
    """A source's saved state and its record's lines; empty when missing or unreadable.

    An acknowledgement of another shape (older versions listed the files in it) reads as
    none: the next manifest is then the whole file list, once.
    """
    try:
        value, lines = linejson.decode(path.read_text(encoding="utf-8"), "record")
    except (OSError, ValueError):
        return SourceState(), {}
    if not isinstance(value, dict):
        return SourceState(), {}
    raw = value.get("record")
    record = {}
    if isinstance(raw, dict):
        for key, entry in raw.items():
            if valid_record(entry):
                record[key] = entry
    acked = value.get("acked")
    digest = acked.get("digest") if isinstance(acked, dict) and set(acked) == {"digest"} else None
    rules = value.get("rules")
    return SourceState(rules if isinstance(rules, list) else None,
                       digest if type(digest) is str else None, record), lines
