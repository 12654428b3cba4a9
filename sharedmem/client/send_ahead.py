"""Bodies a sync sends ahead of their manifest, while it is still walking its sources.

In protocol version 2 the client sends a manifest, the server answers with the bodies it
lacks, and only then does the client send them. On a first sync that is every body, and the
server sits idle while the client walks. So once the server's hello has come (a thread reads
it while the walk goes on) and offers `ahead_bytes`, each file read this time that the server
was not told of before goes out at once, in batches; the server verifies, redacts and stores
them while the walk goes on, and leaves them out of its `need`. A server that does not offer it (or
version 1) gets the usual exchange, and so does whatever is past the offered bytes.
A version 2 `bodies` message carries [sha256, text] pairs (`protocol.encode_bodies`); a version
3 one carries the texts alone, as raw UTF-8 after its line (`protocol.encode_raw_texts`).
"""

from __future__ import annotations

import threading
from queue import SimpleQueue

from sharedmem.client.tails import encode_tails
from sharedmem.core import SharedMemoryError
from sharedmem.protocol import AHEAD_REFS, chunks, encode_bodies, encode_raw_texts

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from sharedmem.client.transport import Connection

BATCH_BYTES = 1 << 20  # small enough that the server redacts one batch while the next comes
# Tails go once this many wait and the hello has come: the server joins, checks and redacts them
# while the walk goes on, not after the manifest.
TAIL_BATCH = 16


class Ahead:
    """The bodies of one sync offered ahead, sent once the server is known to take them."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.pending: list[tuple[str, bytes]] = []  # (sha256, text in UTF-8)
        self.pending_bytes = 0
        self.offered: set[str] = set()
        # Version 3: each body's place among the texts sent ahead, by sha256, which a manifest
        # may give instead of the sha256 (protocol.AHEAD_REFS); in the order they go out.
        self.places: dict[str, int] = {}
        self.sent_bytes = 0
        self.open = True
        # Files that only grew (client/tails.py): (sha256, base sha256, text in UTF-8, tail start).
        self.tails: list[tuple[str, str, bytes, int]] = []
        self.tail_bytes = 0
        self.waiting_tails: list[tuple[str, str, bytes, int]] = []  # offered before the hello
        # Batches of bodies, or one encoded `tails` line.
        self._queue: SimpleQueue[list[tuple[str, bytes]] | bytes | None] = SimpleQueue()
        # Lines encoded before the hello, in the form of the client's highest version,
        # with their bodies in case the server chose another.
        self.waiting: tuple[list[bytes], int, list[list[tuple[str, bytes]]], bool] | None = None
        self._sender: threading.Thread | None = None
        self._failure: SharedMemoryError | None = None

    def offer(self, sha: str, data: bytes) -> None:
        """Queue a body (its text in UTF-8) to go ahead, as soon as the server is known to take it.

        The bytes are those the walk read: they go on the wire as they are, escaped for JSON
        (`protocol.encode_bodies`), without decoding and encoding the text again.
        """
        if not self.open or sha in self.offered:
            return
        self.offered.add(sha)
        self.pending.append((sha, data))
        self.pending_bytes += len(data)
        if self.pending_bytes >= BATCH_BYTES:
            self.flush()

    def offer_tail(self, sha: str, base: str, data: bytes, start: int) -> None:
        """Queue a file that only grew since `base`, the version the server holds: its tail goes.

        `data[start:]` is what was appended (`tails.grown_from`). It counts its whole size
        against `ahead_bytes`, as the server counts the joined text; a version 2 server, which
        takes no `tails`, is sent the whole body ahead instead.
        """
        if not self.open or sha in self.offered:
            return
        self.offered.add(sha)
        self.tails.append((sha, base, data, start))
        self.tail_bytes += len(data) - start
        if self.tail_bytes >= BATCH_BYTES:
            self.flush()
        elif len(self.tails) >= TAIL_BATCH:
            self._flush_tails()

    def _flush_tails(self) -> None:
        """Send the tails that wait, once the hello has come (from `flush`)."""
        hello = self.conn.early
        if hello is None or not self.tails:
            return
        tails, self.tails, self.tail_bytes = self.tails, [], 0
        for line in self._tail_lines(tails, hello):
            self._put(line)

    def _tail_lines(self, tails: list[tuple[str, str, bytes, int]],
                    hello: dict[str, object] | None) -> list[bytes]:
        """The lines that send `tails` ahead, as many as `ahead_bytes` leaves room for.

        Each counts its whole size in `sent_bytes`: `tails` to a version 3 server, whole
        bodies to a version 2 one; nothing to a server that takes nothing ahead.
        """
        terms = _terms(hello)
        if terms is None:
            return []
        limit, compact = terms
        room = self._take(tails, limit, lambda tail: len(tail[2]))
        if not compact:
            return [encode_bodies(b) for b in chunks([(t[0], t[2]) for t in room], _size)]
        return [encode_tails(b) for b in chunks([(t[1], t[2][t[3]:]) for t in room], _size)]

    def flush(self) -> None:
        """Send what waits, up to the server's `ahead_bytes`, once its hello has come.

        Before the hello nothing is sent (the server may not take bodies ahead). Past the
        limit, or with a server that does not offer it, this stops offering: those bodies go
        the usual way, when the server names them in `need`.
        """
        hello = self.conn.early
        self._flush_tails()
        if hello is None or not self.pending:
            return
        terms = _terms(hello)
        if terms is None:
            self.close()
            return
        limit, compact = terms
        room = self._take(self.pending, limit, lambda body: len(body[1]))
        if room:
            if compact:
                self._place(room)
            self._put(room)
        self.pending, self.pending_bytes = [], 0

    def _put(self, item: list[tuple[str, bytes]] | bytes) -> None:
        """Queue a batch or a `tails` line for the sender thread, which the first one starts."""
        if self._sender is None:
            self._sender = threading.Thread(target=self._send, daemon=True, name="sharedmem-ahead")
            self._sender.start()
        self._queue.put(item)

    def _take(self, items: list[Any], limit: int, size: Callable[[Any], int]) -> list[Any]:
        """The first `items` that fit in what `ahead_bytes` leaves; past it nothing more goes."""
        room = []
        for item in items:
            if self.sent_bytes + size(item) > limit:
                self.open = False
                break
            room.append(item)
            self.sent_bytes += size(item)
        return room

    def _place(self, room: list[tuple[str, bytes]]) -> None:
        """Number the bodies about to go, in order: the server counts the texts as they come."""
        places = self.places
        for sha, _ in room:
            if len(places) >= AHEAD_REFS:
                return
            places[sha] = len(places)

    def _send(self) -> None:
        """Encode and write on a thread: the walk goes on while the pipe is full.

        A failure (the server end gone, or stopped past a deadline) is kept for `wait`, which
        raises it on the sync's own thread: nothing of it is printed from here.
        """
        while (room := self._queue.get()) is not None:
            if self._failure is not None:
                continue
            form = _compact(self.conn.early)
            try:
                if isinstance(room, bytes):  # a `tails` line (`_flush_tails`)
                    self.conn.channel.send_line(room)
                    continue
                for batch in chunks(room, _size):
                    self.conn.channel.send_line(_encode(batch, form))
            except SharedMemoryError as exc:
                self._failure = exc

    def close(self) -> None:
        """Offer nothing more; what was not sent goes the usual way."""
        self.open = False
        self.pending, self.pending_bytes = [], 0
        self.tails, self.tail_bytes = [], 0

    def finish(self) -> None:
        """The walk is over: send what waits if the server is ready, then offer nothing more.

        Waiting for the hello here would only delay the manifest that asks for those bodies:
        if it has not come, what waits is encoded now, and `send_waiting` sends it the moment
        the hello offers room for it. Returns while the sender writes its last batches; `wait`
        for it before sending anything else.
        """
        if self.open:
            self.flush()
        if self.open and self.pending:  # no hello yet: most likely it chooses our highest
            batches = list(chunks(self.pending, _size))
            form = max(self.conn.versions, default=0) >= 3
            self.waiting = ([_encode(batch, form) for batch in batches], self.pending_bytes,
                            batches, form)
        if self.open and self.tails:  # no hello yet: sent by `send_waiting`, if there is room
            self.waiting_tails = self.tails
        self.close()
        if self._sender is not None:
            self._queue.put(None)

    def wait(self) -> None:
        """Return once every body is written, so the manifest follows them on the channel."""
        if self._sender is not None:
            self._sender.join()
            self._sender = None
        if self._failure is not None:
            raise self._failure

    def send_waiting(self) -> bool:
        """Once the hello has come: send the bodies `finish` encoded, if the server takes them.

        The tails that waited go first, as many as there is room for. True when bodies went
        that a version 3 manifest may name by their place (`places`).
        """
        tails, self.waiting_tails = self.waiting_tails, []
        for line in self._tail_lines(tails, self.conn.early) if tails else []:
            self.conn.channel.send_line(line)
        waiting, self.waiting = self.waiting, None
        terms = _terms(self.conn.early)
        if waiting is None or terms is None:
            return False
        limit, compact = terms
        lines, size, batches, form = waiting
        if form != compact:
            lines = [_encode(batch, compact) for batch in batches]
        if self.sent_bytes + size <= limit:
            for line in lines:
                self.conn.channel.send_line(line)
            self.sent_bytes += size
            if compact:
                for batch in batches:
                    self._place(batch)
                return True
        return False


def _size(body: tuple[str, bytes]) -> int:
    """About what one (sha256, UTF-8 text) body takes on a `bodies` line."""
    return len(body[1]) + 80


def _terms(hello: dict[str, object] | None) -> tuple[int, bool] | None:
    """The hello's `ahead_bytes` and whether texts go alone (`_compact`); None: nothing ahead."""
    if hello is None:
        return None
    limit, version = hello.get("ahead_bytes"), hello.get("version")
    if type(limit) is not int or type(version) is not int or version < 2:
        return None
    return limit, _compact(hello)


def _compact(hello: dict[str, object] | None) -> bool:
    """Whether the server's hello chose version 3 or later, whose bodies are texts alone."""
    version = hello.get("version") if hello is not None else None
    return type(version) is int and version >= 3


def _encode(batch: list[tuple[str, bytes]], compact: bool) -> bytes:
    """One `bodies` message ahead: version 3's texts alone (`compact`), else version 2's pairs."""
    if compact:
        return encode_raw_texts([data for _, data in batch])
    return encode_bodies(batch)
