"""The end of every session with the server: deliver the queued notes, then pull into the cache.

A sync (sync.py) publishes its sources first and offers the pull what it published
(`OwnFiles`); a note's delivery (note.py) publishes nothing and does only this
(`Exchange.deliver_now`). The notes and the pull request go out together, and the server
answers in order: each note's result, then the pull.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path

from sharedmem.cache.cache import NamespaceInfo
from sharedmem.cache.intake import Intake
from sharedmem.cache.update import CacheUpdate, Pulled
from sharedmem.client.config import ClientConfig
from sharedmem.client.outbox import Outbox, QueuedNote
from sharedmem.client.own_files import OwnFiles
from sharedmem.client.status import REFUSED_NOTES, REFUSED_SUFFIX
from sharedmem.clock import utc_now
from sharedmem.core import ProtocolError
from sharedmem.files import atomic_write
from sharedmem.namespaces import NamespaceList
from sharedmem.rules import plain_paths

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from sharedmem.client.transport import Connection

Progress = Callable[[str], None]

NOTE_STATUSES = ("stored", "duplicate", "refused")


class Exchange:
    """Notes out, the server's changes in, over one connection; `notes` says what became of each."""

    def __init__(self, config: ClientConfig, progress: Progress | None = None) -> None:
        self.config = config
        self.progress = progress or (lambda _msg: None)
        self.outbox = Outbox(config.state / "outbox")
        self.own = OwnFiles()
        self.sent_notes: list[tuple[Path, QueuedNote]] | None = None
        self.answered: list[tuple[Path, dict[str, str] | None]] = []  # each note, why refused
        self.notes: dict[str, Any] = {"delivered": 0, "refused": []}

    def deliver_now(self, conn: Connection) -> None:
        """Deliver and pull with nothing published first, so a note reaches the server at once.

        The notes the server answered leave the outbox even if the pull then fails.
        """
        update = CacheUpdate(self.config.cache, file_bytes=self.config.limits.file_bytes,
                             progress=self.progress)
        try:
            update.open()
            update.check()
            self.request(conn, update)
            self.deliver(conn)
            self.settle()
            update.commit(self.receive(conn, update))
        finally:
            update.discard()

    def pending(self) -> tuple[int, int]:
        """The messages and bytes the request will send: each note, then the pull."""
        notes = self.outbox.pending()
        return len(notes) + 1, sum(len(n.text) * 2 + len(n.filename) + 200 for _, n in notes)

    @property
    def requested(self) -> bool:
        """Whether the notes and the pull request have gone out."""
        return self.sent_notes is not None

    def request(self, conn: Connection, update: CacheUpdate, own: OwnFiles | None = None) -> None:
        """Send the queued notes and the pull request without waiting for the answers; once.

        `update` gives the generation of each namespace the cache holds; `own` what this run
        published (the server leaves out what the cache takes from it).
        """
        if self.requested:
            return
        if own is not None:
            self.own = own
        self.sent_notes = self.outbox.pending()
        for _, note in self.sent_notes:
            conn.channel.send({"type": "note", "note_id": note.note_id,
                               "filename": note.filename, "text": note.text})
        pull = {"type": "pull", "known": update.known, "published": self.own.offered}
        if conn.version == 2:  # version 3: the server knows what this session sent it
            pull["have"] = sorted(self.own.texts)
        conn.channel.send(pull)

    def deliver(self, conn: Connection) -> None:
        """Take the server's answer to each note sent; the outbox changes only in `settle`."""
        for path, note in self.sent_notes or []:
            reply = conn.channel.expect("note_result")
            status, message = reply.get("status"), reply.get("message", "")
            if (reply.get("note_id") != note.note_id or status not in NOTE_STATUSES
                    or type(message) is not str
                    or status != "refused" and type(reply.get("path")) is not str):
                raise conn.malformed("note_result", f"for note {note.note_id!r} it needs that "
                                     "note_id, a status of stored, duplicate or refused, a "
                                     "message or path string")
            refused = None
            if status == "refused":
                refused = {"filename": note.filename, "note_id": note.note_id, "message": message}
                self.notes["refused"].append(refused)
            else:
                self.notes["delivered"] += status == "stored"
                self.notes.setdefault("paths", []).append(reply["path"])
            self.answered.append((path, refused))

    def settle(self) -> None:
        """Take the answered notes out of the outbox, a refused one kept aside for the user.

        A sync does this once all went well, so a failed one leaves the outbox as it was (the
        next delivery of a stored note is a harmless duplicate).
        """
        for path, refused in self.answered:
            if refused is not None:
                _quarantine(path, refused)
            self.outbox.done(path)
        self.answered = []

    def receive(self, conn: Connection, update: CacheUpdate) -> Pulled:
        """Read the server's answer to the pull, taking in each `files` message as it comes.

        Each reply is checked for shape before it is used; a malformed one ends the sync with
        nothing changed. What the server left out of this run's own namespaces is taken from
        what it published; a body left out must be one this client has.
        """
        namespaces, full, removed, skipped = _head(conn, conn.channel.expect("namespaces"))
        own = self.own
        skipped_own = {key for key in skipped if key in own.offered}  # only those asked for
        intake = update.intake(namespaces, full, skipped_own, own.whole(skipped_own),
                               lambda: own.files(skipped_own))
        count = 0
        while (part := conn.channel.expect("files", "end"))["type"] == "files":
            count += _take_files(conn, part, intake, own.texts)
            del part  # so the next message is read with this one gone
        self.progress(f"cache: {count} files pulled")
        return Pulled(intake, removed + own.removed(skipped_own), namespaces,
                      {"server": conn.server.get("server"), "protocol": conn.version})


def _head(conn: Connection, head: dict[str, Any]
          ) -> tuple[dict[str, NamespaceInfo], list[str], list[str], list[str]]:
    """A pull's `namespaces` message, checked: the list, and the full, removed, skipped keys."""
    rows, full, removed = head.get("namespaces"), head.get("full", []), head.get("removed", [])
    skipped = head.get("skipped", [])
    for name, value in (("full", full), ("removed", removed), ("skipped", skipped)):
        if type(value) is not list or not all(type(v) is str for v in value):
            raise conn.malformed("namespaces", f"{name} must be a list of strings")
    try:
        listed = NamespaceList.from_rows(rows)
    except ProtocolError as exc:
        raise conn.malformed("namespaces", str(exc)) from None
    return ({ns.key: NamespaceInfo.listed(ns) for ns in listed.every()}, full, removed,
            skipped)


def _take_files(conn: Connection, part: dict[str, Any], intake: Intake,
                texts: Mapping[str, str]) -> int:
    """Take in one `files` message, each entry checked; how many files it held.

    Version 3 sends each text raw after the line (`texts`, as bytes; None for one this client
    holds), versions 1 and 2 in the JSON. A text this client holds for the sha256 (its own)
    stands for whatever the server sent.
    """
    items, raw = part.get("files"), part.get("texts")
    version_3 = "files" in conn.channel.raw_texts
    shape = "[path, sha256]" if version_3 else "[path, sha256, text or null]"
    if type(items) is not list:
        raise conn.malformed("files", "files must be a list")
    if version_3:
        if raw is None:
            raise conn.malformed("files", "a version 3 files message carries its texts raw "
                                 "after its line (sizes), not in the JSON")
        if len(raw) != len(items) or not all(type(i) is list and len(i) == 2 for i in items):
            raise conn.malformed("files", f"each file must be {shape}, with one size each")
        items = [[*item, text] for item, text in zip(items, raw, strict=True)]
    # One check of every path of the message stands for one a file (rules.plain_paths).
    plain = all(type(i) is list and len(i) == 3 and type(i[0]) is str
                for i in items) and plain_paths([i[0] for i in items])
    for item in items:
        if type(item) is not list or len(item) != 3:
            raise conn.malformed("files", f"each file must be {shape}")
        path, sha, text = item
        if type(path) is not str or type(sha) is not str or (
                text is not None and type(text) not in (str, bytes)):
            raise conn.malformed("files", f"each file must be {shape} of strings")
        mine = texts.get(sha)
        if mine is not None:
            intake.add(path, sha, mine, vouched=True, plain=plain)
        elif text is None:
            raise conn.malformed("files", f"it sent no text for {path!r}, and this client has "
                                 "none for its sha256")
        else:
            intake.add(path, sha, text, plain=plain)
    return len(items)


def _quarantine(path: Path, refused: Mapping[str, str]) -> None:
    """Keep a refused note's text for the user, and the server's reason beside it.

    `status` lists the notes of the folder with their reasons (REFUSED_SUFFIX), so a note queued
    while the server was away is not refused unseen.
    """
    with contextlib.suppress(OSError):
        target = path.parent.parent / REFUSED_NOTES / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
        reason = {**refused, "refused_at": utc_now()}
        atomic_write(target.with_name(target.name.removesuffix(".json") + REFUSED_SUFFIX),
                     json.dumps(reason, ensure_ascii=False).encode("utf-8"), mode=0o600)
