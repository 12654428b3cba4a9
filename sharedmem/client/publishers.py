"""How a sync publishes its sources, one class per protocol version it speaks (2 and 3).

A publisher has two steps, between which the sync sends its notes and its pull request:
`send` puts every manifest on the wire, and `finish` reads the answers that remain. Version 2
goes one source at a time, every answer read in `send`. Version 3 pipelines: every manifest
goes out at once, and each `need` is answered as it is read, while the server holds what came
after. The client no longer speaks version 1: every released server speaks version 2
(docs/PROTOCOL.md "hello").
"""

from __future__ import annotations

from collections import deque

from sharedmem.client.own_files import OwnFiles
from sharedmem.client.publication import Publication
from sharedmem.core import ProtocolError
from sharedmem.protocol import PeerError, chunks, encode, encode_raw_texts

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from sharedmem.client.transport import Connection

# Version 3: what the client sends past a manifest whose answer it has not read, at most: the
# server holds up to 64 messages and 8 MiB of them while a manifest waits for its bodies.
PIPELINE_MESSAGES = 48
PIPELINE_BYTES = 6 << 20


class RoundTrips:
    """Answers waited for: one each time this side waits after sending something."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.count = 1  # the hello
        self._sent = conn.channel.sent

    def wait(self) -> None:
        """Count one if something was sent since the last wait."""
        if self.conn.channel.sent != self._sent:
            self.count += 1
            self._sent = self.conn.channel.sent


class Publisher:
    """The exchange of every source's manifest, its bodies and its result, in one version."""

    def __init__(self, conn: Connection, own: Callable[[], OwnFiles], trips: RoundTrips,
                 progress: Callable[[str], None]) -> None:
        self.conn = conn
        self.own = own  # the run's own files, once the pull has been asked for
        self.trips = trips
        self.progress = progress
        self.replies: dict[str, dict[str, Any]] = {}  # by source: its `result`, checked

    def send(self, publications: list[Publication], following: tuple[int, int]) -> None:
        """Send every manifest; `following` is what the request after them sends."""
        raise NotImplementedError

    def finish(self) -> dict[str, dict[str, Any]]:
        """Read the answers that remain; every source's `result` by name."""
        raise NotImplementedError

    def _check_result(self, p: Publication, reply: dict[str, Any]) -> None:
        refused, redacted, digest = reply.get("refused"), reply.get("redacted"), reply.get("digest")
        if (reply.get("source") != p.name or type(reply.get("unchanged")) is not bool
                or type(reply.get("generation")) is not int
                or not (digest is None or type(digest) is str)
                or type(refused) is not list or type(redacted) is not dict
                or not all(type(r) is dict and type(r.get("path")) is str
                           and type(r.get("reason")) is str and type(r.get("message")) is str
                           for r in refused)
                or not all(type(n) is int for n in redacted.values())):
            raise self.conn.malformed(
                "result", f"for source {p.name!r} it needs that source, unchanged (true or "
                "false), an integer generation, a digest, refused as a list of {path, reason, "
                "message} strings and redacted as counts")
        self.replies[p.name] = reply

    def _needed(self, p: Publication, shas: list[Any], limit: int) -> list[str]:
        """The sha256s a `need` names, checked: strings, no more than `limit`."""
        if len(shas) > limit:
            raise self.conn.malformed("need", f"for source {p.name!r} it asks for {len(shas)} "
                                      f"bodies, more than the {limit} files of its manifest")
        return shas


class V2Publisher(Publisher):
    """Version 2 (a 0.1.0 server): one source at a time: manifest, bodies, `commit`, `result`.

    A base the server no longer holds (`stale-base`, after the manifest or at the commit: the
    namespace was forgotten meanwhile) is answered once with the whole manifest.
    """

    def send(self, publications: list[Publication], following: tuple[int, int]) -> None:
        """Publish each source in turn, each `result` read before the next manifest goes."""
        for p in publications:
            if p.ok:
                self.progress(f"{p.name}: {len(p.files)} files")
                self._publish(p)

    def finish(self) -> dict[str, dict[str, Any]]:
        """Every result is read already."""
        return self.replies

    def _publish(self, p: Publication) -> None:
        channel = self.conn.channel
        line = p.line if p.line and not p.placed else encode(p.manifest)
        for attempt in (1, 2):  # the delta, then the whole manifest if its base is stale
            try:
                channel.send_line(line)
                self.trips.wait()
                reply = channel.expect("need", "result")
                if reply["type"] == "need":
                    self._send_bodies(p, reply)
                    self.trips.wait()
                    reply = channel.expect("result")
                self._check_result(p, reply)
                return
            except PeerError as exc:
                if exc.code != "stale-base" or attempt == 2:
                    raise
                line = encode(p.whole)

    def _send_bodies(self, p: Publication, reply: dict[str, Any]) -> None:
        """Answer a `need` with each body it names (once each), then `commit`."""
        need = reply.get("sha256")
        if reply.get("source") != p.name or type(need) is not list or not all(
                type(sha) is str for sha in need):
            raise self.conn.malformed("need", f"for source {p.name!r} it needs that source and "
                                      "sha256 as a list of strings")
        bodies = [[sha, text] for sha, text in p.texts(self._needed(p, need, len(p.files)))]
        self.progress(f"{p.name}: sending {len(bodies)} changed files")
        for batch in chunks(bodies, lambda b: len(b[1]) * 2 + 80):
            self.conn.channel.send({"type": "bodies", "source": p.name, "bodies": batch})
        self.conn.channel.send({"type": "commit", "source": p.name})


class V3Publisher(Publisher):
    """Version 3: every manifest at once; each `need` answered with texts as it is read.

    No more than PIPELINE_MESSAGES and PIPELINE_BYTES go out past an unanswered manifest:
    past that, answers are read first.
    """

    def __init__(self, conn: Connection, own: Callable[[], OwnFiles], trips: RoundTrips,
                 progress: Callable[[str], None]) -> None:
        super().__init__(conn, own, trips, progress)
        self.window: deque[tuple[Publication, int]] = deque()  # sent, answers unread

    def send(self, publications: list[Publication], following: tuple[int, int]) -> None:
        """Send every manifest, reading the oldest answers whenever the window is full."""
        in_flight = 0
        for p in publications:
            if not p.ok:
                continue
            line = p.line or encode(p.manifest)
            while self.window and (len(self.window) >= PIPELINE_MESSAGES
                                   or in_flight + len(line) > PIPELINE_BYTES):
                in_flight -= self._answer_oldest()
            self.progress(f"{p.name}: {len(p.files)} files")
            self.conn.channel.send_line(line)
            self.window.append((p, len(line)))
            in_flight += len(line)
        messages, size = following
        if self.window and (len(self.window) + messages > PIPELINE_MESSAGES
                            or in_flight + size > PIPELINE_BYTES):
            while self.window:
                self._answer_oldest()

    def finish(self) -> dict[str, dict[str, Any]]:
        """Read the answer to every manifest still unanswered."""
        while self.window:
            self._answer_oldest()
        return self.replies

    def _answer_oldest(self) -> int:
        """Read the answers to the oldest manifest and answer each `need`; its size on the wire.

        `need {"stale": true}` (after the manifest, or at the commit when the namespace was
        forgotten meanwhile) asks for the whole manifest, once.
        """
        p, size = self.window.popleft()
        channel = self.conn.channel
        sent, stale = p.manifest, False
        while True:
            self.trips.wait()
            reply = channel.expect("need", "result")
            if reply["type"] == "result":
                self._check_result(p, reply)
                return size
            if reply.get("stale") is True and not stale:
                sent, stale = p.whole, True  # the base is not what the server holds
                channel.send(sent)
                continue
            self._send_texts(p, reply, sent["files"])

    def _send_texts(self, p: Publication, reply: dict[str, Any], files: list[Any]) -> None:
        """Answer a `need` with the text of each file it names (once each), then `commit`."""
        index = reply.get("index")
        if reply.get("source") != p.name or reply.get("stale") is not None or type(
                index) is not list or not all(type(i) is int and 0 <= i < len(files)
                                              for i in index):
            raise self.conn.malformed("need", f"for source {p.name!r} it needs that source and "
                                      "index as a list of positions in the manifest's files")
        own = self.own()
        texts: list[bytes] = []
        for sha, text in p.texts(files[i][1] for i in self._needed(p, index, len(files))):
            own.add_text(sha, text)  # the server sends null for it in the pull
            texts.append(text.encode("utf-8"))
        self.progress(f"{p.name}: sending {len(texts)} changed files")
        for batch in chunks(texts, lambda data: len(data) + 8):
            self.conn.channel.send_line(encode_raw_texts(batch, p.name))
        self.conn.channel.send({"type": "commit", "source": p.name})


PUBLISHERS = {2: V2Publisher, 3: V3Publisher}


def publisher_for(conn: Connection, own: Callable[[], OwnFiles], trips: RoundTrips,
                  progress: Callable[[str], None]) -> Publisher:
    """The publisher of the version the session speaks; refused below version 2."""
    kind = PUBLISHERS.get(conn.version)
    if kind is None:
        raise ProtocolError(f"{conn.where} speaks protocol version {conn.version} only; this "
                            f"client speaks {', '.join(map(str, sorted(PUBLISHERS)))}: upgrade "
                            "the server (install_server.py), then sync again")
    return kind(conn, own, trips, progress)
