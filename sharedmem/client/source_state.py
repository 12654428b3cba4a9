"""A source's saved state: what its last sync read and published, in `state/sources/<name>.json`.

The record lets the next snapshot skip reading a file whose size and modification time are
unchanged, and the acknowledged digest is what the next manifest is a delta against. It is
written one file a line (`linejson.py`), so a rewrite reuses the lines of the files it did not
read again.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Iterable
from pathlib import Path

from sharedmem import linejson

TYPE_CHECKING = False  # typing costs each sync's start milliseconds
if TYPE_CHECKING:
    from typing import Any

    from sharedmem.sources.walk import Entry


class Acked(namedtuple("Acked", "digest files", defaults=(None, None))):
    """What the server confirmed of the last snapshot: its digest, the next delta's base.

    `files` maps path -> sha256 as older versions listed them (None in this one).
    """

    __slots__ = ()

    def to_row(self) -> dict[str, Any]:
        """The `acked` object of the state file."""
        return {"digest": self.digest} if self.files is None else {
            "digest": self.digest, "files": self.files}

    @classmethod
    def from_row(cls, row: object) -> Acked | None:
        """Read `acked`; None when there is none (nothing was confirmed: no delta)."""
        if not isinstance(row, dict):
            return None
        files = row.get("files")
        return cls(row.get("digest"), files if isinstance(files, dict) else None)


class SourceState(namedtuple("SourceState", "rules acked record", defaults=(None, None, None))):
    """One source's state file: the rules it was made under, what was acknowledged, the record.

    `rules` are the release and limits (under others the record is not reused), `acked` an
    `Acked` or None. `record` maps each published path to `[disk size, mtime_ns, sha256, size,
    redactions]`, as the walk reads it back (`walk._valid_record` checks each entry).
    """

    __slots__ = ()

    def to_row(self) -> dict[str, Any]:
        """The JSON object the state file holds."""
        return {"rules": self.rules, "acked": None if self.acked is None else self.acked.to_row(),
                "record": self.record}

    @classmethod
    def from_row(cls, row: object) -> SourceState:
        """Read a state file's object; what is missing or of another shape reads as absent."""
        if not isinstance(row, dict):
            return cls()
        record = row.get("record")
        return cls(row.get("rules"), Acked.from_row(row.get("acked")),
                   record if isinstance(record, dict) else None)

    def acked_files(self) -> dict[str, str] | None:
        """Path -> sha256 the server confirmed last time; None when there is nothing to delta from.

        The confirmed files are those of the record (older state files listed them in `acked`).
        """
        if self.acked is None:
            return None
        if self.acked.files is not None:
            return self.acked.files
        if self.record is None:
            return None
        return {p: r[2] for p, r in self.record.items() if isinstance(r, list) and len(r) == 5}

    def acked_shas(self) -> set[str]:
        """The sha256s the server confirmed: `acked_files`' values, without making that map."""
        if self.acked is None:
            return set()
        if self.acked.files is not None:
            return set(self.acked.files.values())
        if self.record is None:
            return set()
        return {r[2] for r in self.record.values() if isinstance(r, list) and len(r) == 5}


def encode_state(rules: Any, acked: Acked | None, files: Iterable[Entry],
                 old: linejson.Old) -> str:
    """The state file's text for a snapshot's `files`; `old` are the saved record's lines.

    A file not read this time keeps its saved line as it is (`linejson.rewrite`): a sync that
    read 100 of 10,000 files encodes 100 lines.
    """
    head = {"rules": rules, "acked": None if acked is None else acked.to_row()}
    return linejson.rewrite(head, "record", ((e.path, e, e.text is None) for e in files), old,
                            _record_value)


def _record_value(e: Entry) -> list[Any]:
    """An entry's value in the record: see SourceState."""
    return [e.disk_size, e.mtime_ns, e.sha256, e.size, dict(e.redactions)]


def read(path: Path) -> tuple[SourceState, linejson.Old]:
    """A source's saved state, and its record's lines; empty when missing or unreadable."""
    try:
        value, lines = linejson.decode(path.read_text(encoding="utf-8"), "record")
    except (OSError, ValueError):
        return SourceState(), {}
    return (SourceState.from_row(value), lines) if isinstance(value, dict) else (SourceState(), {})
