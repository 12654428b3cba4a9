"""The end of every exchange: deliver the queued notes, then pull what changed into the cache.

A sync (client.py) publishes its sources first and tells the pull what it published; a note
added now (note.py) publishes nothing and does only this.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sharedmem.cache.cache import Cache, CachedFile, NamespaceInfo
from sharedmem.cache.staged_files import Staging
from sharedmem.cache.writers import PreStagedWriter
from sharedmem.client.config import ClientConfig
from sharedmem.client.outbox import Outbox, QueuedNote
from sharedmem.core import ProtocolError
from sharedmem.namespaces import NamespaceList

TYPE_CHECKING = False
if TYPE_CHECKING:
    from sharedmem.client.transport import Connection

Progress = Callable[[str], None]


class Pull:
    """Notes out, the server's changes in, over one connection; `notes` says what became of each."""

    def __init__(self, config: ClientConfig, progress: Progress | None = None) -> None:
        self.config = config
        self.progress = progress or (lambda _msg: None)
        self.cache = Cache(config.cache)
        self.outbox = Outbox(config.state / "outbox")
        self.staging = Staging(self.cache.meta, root=self.cache.root)
        self.have: dict[str, str] = {}
        self.cached: dict[str, CachedFile] = {}  # the cache's files when this run began
        self.known: dict[str, int] = {}
        self.sent_notes: list[tuple[Path, QueuedNote]] | None = None
        self.own_paths: set[str] = set()  # cache paths of the files this run published
        self.takes_own: dict[str, str] = {}  # namespaces the pull may leave out (_takes_own)
        self.notes: dict[str, Any] = {"delivered": 0, "refused": []}

    def deliver_now(self, conn: Connection) -> None:
        """Deliver and pull with nothing published first, so a note reaches the server at once."""
        self.known = self._known()
        self._deliver(conn)
        self._pull(conn)

    def _request(self, conn: Connection) -> None:
        """Send the queued notes and the pull request without waiting for the answers.

        The server answers in order. After the last commit a sync sends these at once, so the
        server goes on to them while this side prepares its records.
        """
        if self.sent_notes is not None:
            return
        self.sent_notes = self.outbox.pending()
        for _, note in self.sent_notes:
            conn.channel.send({"type": "note", "note_id": note.note_id,
                               "filename": note.filename, "text": note.text})
        if conn.version == 1:
            conn.channel.send({"type": "export"})
        else:
            self.takes_own = self._takes_own()
            conn.channel.send({"type": "pull", "known": self.known, "have": sorted(self.have),
                               "published": self.takes_own})

    def _takes_own(self) -> dict[str, str]:
        """Namespaces this run published whole and the cache never had; a sync names them."""
        return {}

    def _own_files(self, keys: set[str]) -> list[tuple[str, str, str]]:
        """The files this run sent of namespaces the server left out of the pull; a sync has them."""
        return []

    def _deliver(self, conn: Connection) -> None:
        self._request(conn)
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

    def _known(self) -> dict[str, int]:
        """The server generation of each cached namespace; 0 where the cache was tampered with."""
        manifest = self.cache.load()
        self.cached = manifest.files
        stale = self.cache.tampered_namespaces()
        return {k: (0 if k in stale else ns.generation) for k, ns in manifest.namespaces.items()}

    def _pull(self, conn: Connection) -> dict[str, Any]:
        self._request(conn)
        head = conn.channel.expect("namespaces")
        upserts: list[tuple[str, str, str]] = []
        own: set[str] = set()
        skipped = set(head.get("skipped", ())) & self.takes_own.keys()  # only those asked for
        for path, sha, text in self._own_files(skipped):
            upserts.append((path, sha, text))
            own.add(sha)
        while (part := conn.channel.expect("files", "end"))["type"] == "files":
            for path, sha, text in part.get("files", []):
                if text is None:
                    if sha not in self.have:
                        raise ProtocolError(f"the server sent no text for {path!r} and this "
                                            "client has none for its sha256; the cache was "
                                            "left as it was")
                    own.add(sha)
                    text = self.have[sha]
                upserts.append((path, sha, text))
        namespaces = {ns.key: NamespaceInfo.listed(ns)
                      for ns in NamespaceList.from_rows(head["namespaces"]).every()}
        self.progress(f"cache: {len(upserts)} files to write")
        self.staging.wait()
        done = self.cache.apply(upserts, list(head.get("removed", [])), namespaces,
                                full=conn.version == 1,
                                full_namespaces=set(head.get("full", [])) | skipped,
                                server={"server": conn.server.get("server"),
                                        "protocol": conn.version},
                                writer=PreStagedWriter(self.staging, own, self.own_paths))
        return done


def _quarantine(path: Path) -> None:
    """Keep a refused note's text for the user instead of dropping it."""
    with contextlib.suppress(OSError):
        target = path.parent.parent / "refused-notes" / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
