"""The end of every session with the server: deliver the queued notes, then pull into the cache.

A sync (sync.py) publishes its sources first and offers the pull what it published; a note
added now (note.py) publishes nothing and does only this. Each holds an `Exchange`.
"""

from __future__ import annotations

import contextlib
import json
from collections import namedtuple
from collections.abc import Callable, Collection, Container, Mapping
from pathlib import Path

from sharedmem.cache.cache import (
    INDEX_DIR,
    NOTES_NAMESPACE,
    Cache,
    CachedFile,
    Damaged,
    FileTable,
    Intake,
    Manifest,
    NamespaceInfo,
)
from sharedmem.cache.staged_files import Staging
from sharedmem.cache.writers import PreStagedWriter
from sharedmem.client.config import ClientConfig
from sharedmem.client.outbox import Outbox, QueuedNote
from sharedmem.client.status import REFUSED_NOTES, REFUSED_SUFFIX
from sharedmem.clock import utc_now
from sharedmem.core import SharedMemoryError
from sharedmem.files import atomic_write
from sharedmem.namespaces import NamespaceList
from sharedmem.rules import plain_paths

TYPE_CHECKING = False  # typing costs each sync's start milliseconds
if TYPE_CHECKING:
    from typing import Any

    from sharedmem.client.transport import Connection

Progress = Callable[[str], None]


class Published(namedtuple("Published", "texts whole entries changed gone",
                           defaults=({}, {}, {}, frozenset(), {}))):
    """What a sync offers its pull of its own files, so the server need not send them back.

    `texts` holds the text of each file this run read or sent, by sha256 (the pull's `have`
    in version 2). `whole` names the namespaces it published that it can write from its own
    snapshot, with the digest sent (the pull's `published`); `entries` are the files to take
    when the server leaves one out of its answer (`walk.Entry`s by namespace). A namespace in
    `changed` (version 3: one the cache has) takes only those and loses the cache paths in
    `gone`; the others are taken whole. Each is a mapping, `changed` a collection; none is
    changed once made.
    """

    __slots__ = ()

    def files(self, keys: Collection[str]) -> list[tuple[str, str, str]]:
        """The files of those namespaces as this run sent them: (cache path, sha256, text)."""
        return [(f"{key}/{e.path}", e.sha256, e.text) for key, entries in self.entries.items()
                if key in keys for e in entries if e.text is not None]

    def removed(self, keys: Collection[str]) -> list[str]:
        """The cache paths those namespaces no longer hold (of a namespace in `changed`)."""
        return [path for key, paths in self.gone.items() if key in keys for path in paths]


class Pulled(namedtuple("Pulled", "intake removed namespaces server")):
    """The server's answer to a pull, read and checked whole; its texts are staged, not applied.

    intake (an `Intake`: the files, each checked and staged or skipped as it came), removed (a
    list of cache paths), namespaces (`NamespaceInfo`s by key), server (its hello's values).
    """

    __slots__ = ()


NOTE_STATUSES = ("stored", "duplicate", "refused")


class Exchange:
    """Notes out, the server's changes in, over one connection; `notes` says what became of each."""

    def __init__(self, config: ClientConfig, progress: Progress | None = None) -> None:
        self.config = config
        self.progress = progress or (lambda _msg: None)
        self.cache = Cache(config.cache)
        self.staging = Staging(self.cache.meta)  # the sync's files written ahead, the pull's texts
        self.outbox = Outbox(config.state / "outbox")
        self.cached: Mapping[str, CachedFile] = {}  # the cache's files (a view of its store)
        self.known: dict[str, int] = {}
        self.digests: dict[str, str | None] = {}  # the server's, as of the cache's generation
        self.checked = False  # the cache's files compared with its manifest (`check_cache`)
        self.offer = Published()
        self.whole: Mapping[str, str] = {}  # the namespaces the pull asked to leave out
        self.ahead: tuple[frozenset[str], frozenset[str], Intake] | None = None  # take_own_ahead
        self.sent_notes: list[tuple[Path, QueuedNote]] | None = None
        self.answered: list[tuple[Path, dict[str, str] | None]] = []  # each note, why refused
        self.notes: dict[str, Any] = {"delivered": 0, "refused": []}
        self.build_index = False  # build a missing search index in this run (see `apply`)

    def read_cache(self) -> None:
        """`open_cache` and `check_cache` at once: for a run with nothing to walk first."""
        self.open_cache()
        self.check_cache()

    def open_cache(self) -> None:
        """Take the server generation of each cached namespace, as the manifest records it.

        A metadata folder that is a link is refused first, before anything is written there.
        The files are checked later (`check_cache`), before the pull is asked for: a sync
        walks its sources and sends its manifests meanwhile, which need no answer from it.
        """
        self.cache.check_meta()
        self.cache.convert()
        self._take(self.cache.load())
        self.checked = False

    def check_cache(self) -> None:
        """Ask for whole each namespace with a file not as recorded (its generation 0); once.

        A manifest that is damaged (`Cache.damage`) is rebuilt from the files, listing no
        namespace, so the pull sends every one whole: the cache is a copy of the server.
        """
        if self.checked:
            return
        self.checked = True
        stale: set[str] = set()
        if self.cache.damage is None:
            try:
                stale = self.cache.tampered_namespaces()  # reads every row: damage shows here
            except Damaged as exc:
                self.cache.damage = str(exc)
        if self.cache.damage is not None:
            self.progress(f"cache: {self.cache.damage}; rebuilding its records from the files "
                          "and pulling everything")
            self._take(self.cache.rebuild())
            stale = self.cache.tampered_namespaces()
        if self.cache.damaged:
            self.progress(f"cache: {len(self.cache.damaged)} files not as last written "
                          "(edited, or left by a killed sync): pulling them again")
        for key in stale & self.known.keys():
            self.known[key] = 0

    def cached_shas(self, paths: list[str]) -> dict[str, str]:
        """The sha256 of each of `paths` the cache lists, by path (as of `open_cache`)."""
        cached = self.cached
        if isinstance(cached, FileTable):
            return cached.sha256s(paths)
        return {p: c.sha256 for p in paths if (c := cached.get(p)) is not None}

    def _take(self, manifest: Manifest) -> None:
        """The manifest's files, and each namespace's generation and digest as recorded."""
        self.cached = manifest.files
        self.known = {k: ns.generation for k, ns in manifest.namespaces.items()}
        self.digests = {k: ns.digest for k, ns in manifest.namespaces.items()}

    def deliver_now(self, conn: Connection) -> None:
        """Deliver and pull with nothing published first, so a note reaches the server at once.

        The notes the server answered leave the outbox even if the pull then fails.
        """
        self.read_cache()
        self.deliver(conn)
        self.settle()
        try:
            writer = PreStagedWriter(self.staging)
            self.apply(self.receive(conn, writer))
        finally:
            self.staging.discard()

    @property
    def requested(self) -> bool:
        """Whether the notes and the pull request have gone out."""
        return self.sent_notes is not None

    def request(self, conn: Connection, offer: Published | None = None) -> None:
        """Send the queued notes and the pull request without waiting for the answers; once.

        The server answers in order. After the last commit a sync sends these at once, so the
        server goes on to them while this side prepares its records.
        """
        if self.requested:
            return
        if offer is not None:
            self.offer = offer
        self.sent_notes = self.outbox.pending()
        for _, note in self.sent_notes:
            conn.channel.send({"type": "note", "note_id": note.note_id,
                               "filename": note.filename, "text": note.text})
        if conn.version == 1:
            conn.channel.send({"type": "export"})
        else:
            self.whole = self.offer.whole
            pull = {"type": "pull", "known": self.known, "published": self.whole}
            if conn.version == 2:  # version 3: the server knows what this session sent it
                pull["have"] = sorted(self.offer.texts)
            conn.channel.send(pull)

    def take_own_ahead(self, writer: PreStagedWriter) -> None:
        """Take this run's own files into an intake while the server's answer is on its way.

        The pull leaves out the namespaces it was offered whole (`skipped`) and takes whole
        those the cache lacks; when the answer says just that of them, `receive` goes on with
        this intake, else it starts one afresh. A first sync's every file is taken here, not
        after the answer. Nothing here changes the cache.
        """
        if self.cache.rebuilt or not self.whole:
            return
        offered = frozenset(self.whole)
        whole = offered - set(self.offer.changed)  # as `receive` will find them, if all goes well
        intake = self._intake_with_own(writer, offered, whole)
        writer.plan(intake.rows)  # what its commit moves in whole, checked now
        self.ahead = (offered, whole, intake)

    def _intake_with_own(self, writer: PreStagedWriter, namespaces: Collection[str],
                         full_namespaces: Container[str], full: bool = False) -> Intake:
        """An intake of the pull that has taken this run's own files of those namespaces."""
        intake = self.cache.intake(writer, full=full, full_namespaces=full_namespaces,
                                   file_bytes=self.config.limits.file_bytes)
        intake.add_own(self.offer.files(namespaces))
        return intake

    def deliver(self, conn: Connection) -> None:
        """Take the server's answer to each note sent; the outbox changes only in `settle`."""
        self.request(conn)
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

    def receive(self, conn: Connection, writer: PreStagedWriter) -> Pulled:
        """Read the server's answer to the pull, taking in each `files` message as it comes.

        Each reply is checked for shape before it is used; a malformed one ends the sync with
        nothing changed. A body left out must be one this client has.
        """
        self.request(conn)
        head = conn.channel.expect("namespaces")
        rows, full, removed = head.get("namespaces"), head.get("full", []), head.get("removed", [])
        skipped = head.get("skipped", [])
        for name, value in (("full", full), ("removed", removed), ("skipped", skipped)):
            if type(value) is not list or not all(type(v) is str for v in value):
                raise conn.malformed("namespaces", f"{name} must be a list of strings")
        if type(rows) is not list or not all(type(row) is dict and _row_ok(row) for row in rows):
            raise conn.malformed("namespaces", "namespaces must be a list of objects with string "
                                 "key, source and kind, integer generation, and machine and "
                                 "synced_at each a string or null")
        namespaces = {ns.key: NamespaceInfo.listed(ns)
                      for ns in NamespaceList.from_rows(rows).every()}
        skipped_own = set(skipped) & self.whole.keys()  # only those asked for
        if not self.cache.rebuilt:  # those the cache lacks are staged as trees, each moved whole
            writer.staging.pull_trees = frozenset(
                key for key in namespaces if key not in self.known and key != NOTES_NAMESPACE)
        # A rebuilt file list asked for every note: one the server does not send goes.
        notes = {NOTES_NAMESPACE} if self.cache.rebuilt else set()
        full_namespaces = set(full) | (skipped_own - set(self.offer.changed)) | notes
        ahead = self.ahead
        if (ahead is not None and conn.version > 1 and ahead[0] == skipped_own
                and ahead[1] == full_namespaces & skipped_own):
            intake = ahead[2]  # this run's own files, taken as `receive` takes them, meanwhile
            intake.full_namespaces = full_namespaces
        else:
            intake = self._intake_with_own(writer, skipped_own, full_namespaces,
                                           full=conn.version == 1)
        self.ahead = None
        removed = removed + self.offer.removed(skipped_own)
        texts = self.offer.texts
        count = 0
        while (part := conn.channel.expect("files", "end"))["type"] == "files":
            items = part.get("files")
            if type(items) is not list:
                raise conn.malformed("files", "files must be a list")
            # One check of every path of the message stands for one a file (rules.plain_paths).
            plain = all(type(i) is list and len(i) == 3 and type(i[0]) is str
                        for i in items) and plain_paths([i[0] for i in items])
            for item in items:
                if type(item) is not list or len(item) != 3:
                    raise conn.malformed("files", "each file must be [path, sha256, text or null]")
                path, sha, text = item
                if type(path) is not str or type(sha) is not str or (
                        text is not None and type(text) is not str):
                    raise conn.malformed("files", "each file must be [path, sha256, text or null]"
                                         " of strings")
                own = texts.get(sha)
                if own is None:
                    if text is None:
                        raise conn.malformed("files", f"it sent no text for {path!r}, and this "
                                             "client has none for its sha256")
                    intake.add(path, sha, text, plain=plain)
                else:  # this client's own text at that sha256, whatever the server sent
                    intake.add(path, sha, own, vouched=True)
            count += len(items)
            del part, items  # so the next message is read with this one gone
        self.progress(f"cache: {count} files pulled")
        return Pulled(intake, removed, namespaces,
                      {"server": conn.server.get("server"), "protocol": conn.version})

    def apply(self, pulled: Pulled) -> dict[str, Any]:
        """Write what was pulled into the cache, then bring the search index up to date.

        The staged texts move in, then the manifest. Then `update_index` indexes the files
        written (a few in this run, many in a background `index` this run does not wait for),
        and an index behind the cache (a background build that a later sync overtook) is
        refreshed. Without an index to update, it is built only when `build_index` says so (the
        installer's first sync): a sync on the schedule leaves that to the first search, which
        builds it in the background and scans meanwhile. The index is derived data: if it
        cannot be written, the sync still succeeds and searches scan what it lacks.
        """
        indexed = self.build_index or (self.cache.meta / INDEX_DIR).exists()
        if indexed:  # no index, none to build: the search module is not even loaded
            from sharedmem.cache import search_index
        mark = search_index.index_mark(self.cache) if indexed else None
        damaged, rebuilt = self.cache.damaged, self.cache.rebuilt
        outcome = self.cache.commit(pulled.intake, pulled.removed, pulled.namespaces,
                                    server=pulled.server)
        if damaged or rebuilt:
            outcome["repaired"] = {"files": len(damaged), "records": rebuilt}
        if not indexed:
            return outcome
        # A time re-recorded is no change of text; a file rewritten at its sha256 is re-read.
        written, removed = self.cache.written, self.cache.removed
        if written or removed or mark is None:
            self.progress(f"search index: updating for {len(written) + len(removed)} files")
            try:
                search_index.update_index(self.cache, written, removed, mark)
            except SharedMemoryError as exc:
                outcome["index_error"] = str(exc)
        return outcome


def _row_ok(row: dict[str, Any]) -> bool:
    """Whether a namespaces row has what the client reads of it, each of its type."""
    return (type(row.get("key")) is str and type(row.get("source")) is str
            and type(row.get("kind")) is str and type(row.get("generation")) is int
            and (row.get("machine") is None or type(row["machine"]) is str)
            and (row.get("synced_at") is None or type(row["synced_at"]) is str))


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
