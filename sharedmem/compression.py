"""The exchange's zlib stream compression (protocol version 3), and when a link counts as slow.

`protocol.Channel` writes through `Deflating` and reads through `Inflating` once both hellos
agreed on zlib (docs/PROTOCOL.md "Compression"). Each side starts at level 1 and moves, once,
to level 6 when the link rather than this side sets the pace: its own writes say so, or the
peer's `received` reports do (`SlowLink`). Why these levels and windows: docs/BENCHMARKS.md
"Compression".
"""

from __future__ import annotations

import time
import zlib

from sharedmem.core import ProtocolError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections import deque
    from typing import IO, Any

MIB = 1024 * 1024
# Level 1 keeps most of level 6's saving on text at a fraction of its time; level 6 is worth
# its time only while the link would keep this side waiting anyway.
ZLIB_LEVEL = 1
ZLIB_SLOW_LINK_LEVEL = 6
# The link is judged over each window of compressed bytes written: slow when, two windows in
# a row, the writes blocked for at least half the time (the link, not the sender, set the
# pace) and the bytes went at under SLOW_LINK_RATE, about what level 6 puts out on this kind
# of text. Judging by the share blocked alone misses a link that is slow but faster than a
# busy sender's level 1. Small windows judge soon after the pipes' buffers are full.
SLOW_LINK_WINDOW = 256 * 1024
SLOW_LINK_SHARE = 0.5
SLOW_LINK_RATE = 4_000_000  # bytes a second
SLOW_LINK_WINDOWS = 2
# Those windows see the link only once ssh's channel window and the pipes are full. A server
# that offers `reports` says, every REPORT_BYTES of this side's stream it has taken off the
# wire until the first message that is not a body sent ahead, how many and when by its own
# clock (`received`). The link is slow as soon as reports over REPORT_SPAN show the bytes
# arriving at under SLOW_LINK_RATE while REPORT_BACKLOG more have been written than had
# arrived: the link, not this side, sets the pace.
REPORT_BYTES = 256 * 1024
REPORT_SPAN = 256 * 1024
REPORT_BACKLOG = 1024 * 1024
COMPRESS_SLICE = 256 * 1024  # bytes of a line compressed before what they give is written
INFLATE_READ_BYTES = 256 * 1024  # of the wire read at a time, compressed
INFLATE_STEP_BYTES = MIB  # decompressed at most per step, so a small input cannot grow memory


class SlowLink:
    """Whether the link holds this side back to less than level 6 would feed it.

    Judged from this side's own writes (how long they blocked, window by window) and from the
    peer's reports of what had arrived (`reports`, appended by the thread that reads them).
    """

    def __init__(self, wire: int, reports: deque[tuple[int, float]]) -> None:
        self.reports = reports
        self.window = (time.monotonic(), wire, 0.0)  # its start, bytes sent by then, time blocked
        self.slow_windows = 0  # windows in a row in which the writes mostly blocked

    def blocked(self, seconds: float) -> None:
        """A write took `seconds`: the time the link kept this side waiting, in this window."""
        since, sent, blocked = self.window
        self.window = (since, sent, blocked + seconds)

    def is_slow(self, wire: int) -> bool:
        """Whether, with `wire` bytes of this side's stream written, the link is slow."""
        if self._reports_say_slow(wire):
            return True
        since, sent, blocked = self.window
        if wire - sent < SLOW_LINK_WINDOW:
            return False
        now = time.monotonic()
        self.window = (now, wire, 0.0)
        took = now - since
        slow = blocked >= SLOW_LINK_SHARE * took and wire - sent < SLOW_LINK_RATE * took
        self.slow_windows = self.slow_windows + 1 if slow else 0
        return self.slow_windows >= SLOW_LINK_WINDOWS

    def _reports_say_slow(self, wire: int) -> bool:
        """Whether the peer's reports show the link slower than this side writes.

        The latest reports span REPORT_SPAN arriving at under SLOW_LINK_RATE, and REPORT_BACKLOG
        more bytes have been written than the latest says had arrived.
        """
        reports = list(self.reports)
        if len(reports) < 2:
            return False
        arrived, at = reports[-1]
        if wire - arrived < REPORT_BACKLOG:
            return False
        for earlier, then in reversed(reports[:-1]):
            if arrived - earlier >= REPORT_SPAN:
                return at > then and arrived - earlier < SLOW_LINK_RATE * (at - then)
        return False


class Deflating:
    """This side's output as zlib streams: level 1, then level 6 once the link is slow.

    `wire` counts this side's whole stream on the wire (what went before compression too).
    """

    def __init__(self, writer: IO[bytes], wire: int, reports: deque[tuple[int, float]]) -> None:
        self.writer = writer
        self.wire = wire
        self.level = ZLIB_LEVEL
        self.deflate: Any = zlib.compressobj(ZLIB_LEVEL)
        self.link = SlowLink(wire, reports)

    def write(self, data: bytes) -> None:
        """Compress a slice at a time and write what each gives, ending in a sync flush.

        A 4 MiB batch then starts onto a slow link after the first slice is compressed, not
        after the whole line, and the compressed line is never held whole. The caller flushes.
        """
        view = memoryview(data)
        for start in range(0, len(data), COMPRESS_SLICE):
            if out := self.deflate.compress(view[start:start + COMPRESS_SLICE]):
                self._write_timed(out, flush=True)
            if self.level == ZLIB_LEVEL and self.link.is_slow(self.wire):
                # The stream ends here, even inside a line, and one at the slow link's level
                # starts: the reader takes concatenated zlib streams (`Inflating`).
                self._write_timed(self.deflate.flush(zlib.Z_FINISH), flush=False)
                self.deflate = zlib.compressobj(ZLIB_SLOW_LINK_LEVEL)
                self.level = ZLIB_SLOW_LINK_LEVEL
        self._write_timed(self.deflate.flush(zlib.Z_SYNC_FLUSH), flush=False)

    def _write_timed(self, data: bytes, *, flush: bool) -> None:
        started = time.monotonic()
        self.writer.write(data)
        if flush:
            self.writer.flush()
        self.link.blocked(time.monotonic() - started)
        self.wire += len(data)


class Inflating:
    """`readline` over a zlib stream, holding at most one line (and one step) decompressed.

    The limits of a line apply to what it decompresses to: each step inflates at most what
    the line may still grow by, so a few bytes that would inflate to gigabytes (a zip bomb)
    make a line too long, never a large buffer.
    """

    def __init__(self, reader: Any, peer: str) -> None:
        self.reader = reader
        self.peer = peer
        self.inflater = zlib.decompressobj()
        self.buffer = bytearray()  # decompressed, not yet returned
        self.searched = 0  # bytes of `buffer` known to hold no line break
        self.tail = b""  # compressed, not yet decompressed
        self.wire = 0  # compressed bytes read
        self.ended = False
        self.full = False  # the last step filled its room: zlib may hold more output

    def readline(self, limit: int) -> bytes:
        """Up to and with the next line break, or `limit` bytes, or what is left at the end."""
        while True:
            end = self.buffer.find(b"\n", self.searched, limit)
            if end != -1:
                return self._take(end + 1)
            if len(self.buffer) >= limit or self.ended:
                return self._take(min(limit, len(self.buffer)))
            self.searched = len(self.buffer)
            self._inflate(limit - len(self.buffer))

    def read(self, size: int) -> bytes:
        """Exactly `size` bytes decompressed (the texts after a raw `bodies` line); fewer at the end."""
        while len(self.buffer) < size and not self.ended:
            self._inflate(size - len(self.buffer))
        return self._take(min(size, len(self.buffer)))

    def _inflate(self, room: int) -> None:
        """Decompress at most `room` (and one step of) bytes more, reading the wire if needed."""
        if not self.tail and not self.full:
            read = getattr(self.reader, "read1", None)
            data = (read(INFLATE_READ_BYTES) if read is not None
                    else self.reader.readline(INFLATE_READ_BYTES))
            if not data:
                self.ended = True
                return
            self.wire += len(data)
            self.tail = data
        step = min(room, INFLATE_STEP_BYTES)
        try:
            out = self.inflater.decompress(self.tail, step)
        except zlib.error as exc:
            raise NotZlib(f"the {self.peer} sent data that is not the zlib stream both hellos "
                          f"agreed on ({exc})") from None
        self.tail = self.inflater.unconsumed_tail
        self.full = len(out) == step
        if self.inflater.eof:  # the sender ended its stream; another may follow it at once
            self.tail = self.inflater.unused_data
            self.inflater = zlib.decompressobj()
            self.full = False
        self.buffer += out

    def _take(self, size: int) -> bytes:
        line = bytes(self.buffer[:size])
        del self.buffer[:size]
        self.searched = 0
        return line


class NotZlib(ProtocolError):
    """What the peer sent is not zlib: `protocol.Channel` answers it as `bad-json`."""
