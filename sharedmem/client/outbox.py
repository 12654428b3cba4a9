"""The note outbox: notes queued on the client until the server has them.

A note is queued before it is sent, one file each, so one written while the server cannot be
reached waits for the next sync; its client-made id lets the server store a retried delivery
once.
"""

from __future__ import annotations

import json
import os
import time
from collections import namedtuple
from pathlib import Path

from sharedmem.clock import utc_now
from sharedmem.files import atomic_write
from sharedmem.rules import check_note


class QueuedNote(namedtuple("QueuedNote", "note_id filename text created")):
    """A note waiting to be delivered; its id makes a retried delivery store it once (all str)."""

    __slots__ = ()


class Outbox:
    """Notes written while the server was unreachable, one JSON file each, delivered in order."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def put(self, filename: str, text: str, note_id: str | None = None) -> QueuedNote:
        """Queue a note atomically: it is either wholly in the outbox or not at all."""
        check_note(filename, text)
        if note_id is None:
            import uuid
            note_id = uuid.uuid4().hex
        note = QueuedNote(note_id, filename, text, utc_now())
        # The nanosecond clock keeps notes queued within one second in the order they came.
        name = f"{note.created.replace(':', '-')}-{time.time_ns():020d}-{note.note_id}.json"
        atomic_write(self.folder / name, json.dumps(note._asdict()).encode("utf-8"), mode=0o600)
        return note

    def pending(self) -> list[tuple[Path, QueuedNote]]:
        """Queued notes, oldest first; unreadable entries are left in place for a person to see."""
        out = []
        if not self.folder.is_dir():
            return out
        for entry in sorted(os.scandir(self.folder), key=lambda e: e.name):
            if not entry.name.endswith(".json") or entry.name.startswith("."):
                continue
            try:
                out.append((Path(entry.path), QueuedNote(**json.loads(
                    Path(entry.path).read_text(encoding="utf-8")))))
            except (OSError, ValueError, TypeError):
                continue
        return out

    def holds(self, note_id: str) -> bool:
        """Whether the note `note_id` still waits here, from the file names alone (none read).

        A folder that cannot be read says yes: the note is not known to have left.
        """
        suffix = f"-{note_id}.json"
        try:
            with os.scandir(self.folder) as entries:
                return any(e.name.endswith(suffix) and not e.name.startswith(".")
                           for e in entries)
        except FileNotFoundError:
            return False
        except OSError:
            return True

    def done(self, path: Path) -> None:
        """Forget a note the server has acknowledged."""
        try:
            path.unlink()
        except FileNotFoundError:
            pass
