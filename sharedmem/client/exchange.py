"""The end of every session with the server: deliver the queued notes, then pull into the cache.

A sync (sync.py) publishes its sources first and offers the pull what it published; a note
added now (note.py) publishes nothing and does only this. Each holds an `Exchange`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from sharedmem.cache.cache import Cache, CachedFile, NamespaceInfo
from sharedmem.cache.writers import FileWriter
from sharedmem.client.config import ClientConfig
from sharedmem.client.outbox import Outbox, QueuedNote
from sharedmem.core import ProtocolError
from sharedmem.namespaces import NamespaceList

TYPE_CHECKING = False
if TYPE_CHECKING:
    from sharedmem.client.transport import Connection
    from sharedmem.sources.walk import Entry

Progress = Callable[[str], None]


class Published(NamedTuple):
    """What a sync offers its pull of its own files, so the server need not send them back.

    `texts` holds the text of each file this run read, by sha256 (the pull's `have`). `whole`
    names the namespaces it published whole that the cache never had, with the digest sent
    (the pull's `published`); `entries` are their files as sent, taken when the server leaves
    a namespace out of its answer.
    """

    texts: Mapping[str, str] = {}
    whole: Mapping[str, str] = {}
    entries: Mapping[str, Sequence[Entry]] = {}

    def files(self, keys: Collection[str]) -> list[tuple[str, str, str]]:
        """The files of those namespaces as this run sent them: (cache path, sha256, text)."""
        return [(f"{key}/{e.path}", e.sha256, e.text) for key, entries in self.entries.items()
                if key in keys for e in entries if e.text is not None]


class Pulled(NamedTuple):
    """The server's answer to a pull, read and checked for completeness, not yet applied."""

    upserts: list[tuple[str, str, str]]
    removed: list[str]
    namespaces: dict[str, NamespaceInfo]
    full: bool  # a version 1 export: the whole cache is replaced
    full_namespaces: set[str]
    own_texts: set[str]  # sha256s whose text came from this client, not from the server
    server: dict[str, Any]


class Exchange:
    """Notes out, the server's changes in, over one connection; `notes` says what became of each."""

    def __init__(self, config: ClientConfig, progress: Progress | None = None) -> None:
        self.config = config
        self.progress = progress or (lambda _msg: None)
        self.cache = Cache(config.cache)
        self.outbox = Outbox(config.state / "outbox")
        self.cached: dict[str, CachedFile] = {}  # the cache's files when the session began
        self.known: dict[str, int] = {}
        self.offer = Published()
        self.whole: Mapping[str, str] = {}  # the namespaces the pull asked to leave out
        self.sent_notes: list[tuple[Path, QueuedNote]] | None = None
        self.notes: dict[str, Any] = {"delivered": 0, "refused": []}

    def read_cache(self) -> None:
        """Take the server generation of each cached namespace; 0 where it was tampered with."""
        manifest = self.cache.load()
        self.cached = manifest.files
        stale = self.cache.tampered_namespaces()
        self.known = {k: (0 if k in stale else ns.generation)
                      for k, ns in manifest.namespaces.items()}

    def deliver_now(self, conn: Connection) -> None:
        """Deliver and pull with nothing published first, so a note reaches the server at once."""
        self.read_cache()
        self.deliver(conn)
        self.apply(self.receive(conn))

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
            conn.channel.send({"type": "pull", "known": self.known,
                               "have": sorted(self.offer.texts), "published": self.whole})

    def deliver(self, conn: Connection) -> None:
        """Take the server's answer to each note sent; a refused one is kept aside for the user."""
        self.request(conn)
        for path, note in self.sent_notes or []:
            reply = conn.channel.expect("note_result")
            if reply.get("status") == "refused":
                self.notes["refused"].append(
                    {"filename": note.filename, "note_id": note.note_id,
                     "message": reply.get("message", "")})
                _quarantine(path)
            else:
                self.notes["delivered"] += reply.get("status") == "stored"
                self.notes.setdefault("paths", []).append(reply.get("path"))
            self.outbox.done(path)

    def receive(self, conn: Connection) -> Pulled:
        """Read the server's answer to the pull; a body left out must be one this client has."""
        self.request(conn)
        head = conn.channel.expect("namespaces")
        upserts: list[tuple[str, str, str]] = []
        own: set[str] = set()
        skipped = set(head.get("skipped", ())) & self.whole.keys()  # only those asked for
        for path, sha, text in self.offer.files(skipped):
            upserts.append((path, sha, text))
            own.add(sha)
        while (part := conn.channel.expect("files", "end"))["type"] == "files":
            for path, sha, text in part.get("files", []):
                if text is None:
                    if sha not in self.offer.texts:
                        raise ProtocolError(f"the server sent no text for {path!r} and this "
                                            "client has none for its sha256; the cache was "
                                            "left as it was")
                    own.add(sha)
                    text = self.offer.texts[sha]
                upserts.append((path, sha, text))
        namespaces = {ns.key: NamespaceInfo.listed(ns)
                      for ns in NamespaceList.from_rows(head["namespaces"]).every()}
        self.progress(f"cache: {len(upserts)} files to write")
        return Pulled(upserts, list(head.get("removed", [])), namespaces, conn.version == 1,
                      set(head.get("full", [])) | skipped, own,
                      {"server": conn.server.get("server"), "protocol": conn.version})

    def apply(self, pulled: Pulled, writer: FileWriter | None = None) -> dict[str, int]:
        """Write what was pulled into the cache; `writer` as `Cache.apply` takes it."""
        return self.cache.apply(pulled.upserts, pulled.removed, pulled.namespaces,
                                full=pulled.full, full_namespaces=pulled.full_namespaces,
                                server=pulled.server, writer=writer)


def _quarantine(path: Path) -> None:
    """Keep a refused note's text for the user instead of dropping it."""
    with contextlib.suppress(OSError):
        target = path.parent.parent / "refused-notes" / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
