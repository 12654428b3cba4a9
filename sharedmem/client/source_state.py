"""A source's saved record: what its last sync read and published, in `state/sources/<name>.json`.

The record lets the next snapshot skip reading a file whose size and modification time are
unchanged, and names the digest the server acknowledged, which the next manifest is a delta
against. It is written one file a line (`linejson.py`), so a rewrite reuses the lines of the
files it did not read again.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sharedmem import linejson

TYPE_CHECKING = False
if TYPE_CHECKING:
    from sharedmem.sources.walk import Entry


def read(path: Path) -> tuple[dict[str, Any], linejson.Old]:
    """A source's saved record, and its lines; empty when missing or unreadable."""
    try:
        value, lines = linejson.decode(path.read_text(encoding="utf-8"), "record")
    except (OSError, ValueError):
        return {}, {}
    return (value, lines) if isinstance(value, dict) else ({}, {})


def acked_files(saved: dict[str, Any]) -> dict[str, str] | None:
    """Path -> sha256 the server confirmed last time; None when there is nothing to delta from.

    The confirmed files are those of the saved record (older state files held an explicit map).
    """
    acked = saved.get("acked")
    if not isinstance(acked, dict):
        return None
    files = acked.get("files")
    if isinstance(files, dict):
        return files
    record = saved.get("record")
    if not isinstance(record, dict):
        return None
    return {p: r[2] for p, r in record.items() if isinstance(r, list) and len(r) == 5}


def encode(rules: list[Any], acked: dict[str, str] | None, files: Iterable[Entry],
           old: linejson.Old) -> str:
    """The record's text for a snapshot's `files`; `old` are the saved record's lines.

    A file not read this time was taken from the saved record as it was: its old value stands,
    and linejson keeps its line (it finds the very same object).
    """
    return linejson.encode(
        {"rules": rules, "acked": acked}, "record",
        ((e.path, old[e.path][0] if e.text is None and e.path in old else
          [e.disk_size, e.mtime_ns, e.sha256, e.size, dict(e.redactions)])
         for e in files), old)[0]
