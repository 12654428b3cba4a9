"""The sync exchange: newline-delimited JSON messages, their shapes, and bounded line reading.

docs/PROTOCOL.md is the contract; this module is its one implementation, used by both ends.
Version 3's raw texts after a `bodies` line are read here too, as part of the framing.
"""

from __future__ import annotations

import json
import re
import time
import zlib
from collections import deque
from collections.abc import Iterable, Iterator

from sharedmem.core import ProtocolError
from sharedmem.rules import MIB

TYPE_CHECKING = False  # typing costs `serve` milliseconds before it can answer
if TYPE_CHECKING:
    from typing import IO, Any

VERSIONS = (1, 2, 3)
MAX_LINE_BYTES = 32 * MIB
# Parsing costs about 75 bytes a JSON value on top of the text (an empty list, a dict entry), so
# a line of 32 MiB of `[],` or `"a":0,` would cost 27 times its size. A million values cost
# about 75 MB, what the largest legal line of text costs anyway; no message either end sends
# comes near it (a manifest of 20,000 files holds about 100,000).
MAX_LINE_VALUES = 1_000_000
CHUNK_BYTES = 4 * MIB
# Version 3: a manifest entry may name its body by its place among the texts this session sent
# ahead (`bodies` before the manifest, counted from 0) instead of by its sha256, which the
# server computed as each came: 3 bytes on the wire instead of 34 once compressed. The server
# remembers the first AHEAD_REFS of them (32 bytes each); a client refers to no later one.
AHEAD_REFS = 1 << 17
# zlib stream compression (version 3, when both hellos say "zlib"). Level 1 to start: on text
# it keeps most of level 6's saving at a fifth of its time. A sender that the link holds back
# to less than level 6 could feed moves to level 6, whose extra time is then spent while it
# would wait anyway (docs/BENCHMARKS.md "Compression").
COMPRESSIONS = ("zlib",)
ZLIB_LEVEL = 1
ZLIB_SLOW_LINK_LEVEL = 6
# The link is judged over each 256 KiB of compressed bytes written: slow when, two windows in
# a row, the writes blocked for at least half the time (the link, not the sender, set the
# pace) and the bytes went at under 4 MB/s, about what level 6 puts out on this kind of text.
# Judging by the share blocked alone missed a 20 Mbit/s link for 4 MB: a sync's sender, busy
# walking, puts out level 1 at about 9 MB/s, so that link blocked it 70-80% of the time.
# Small windows judge soon after the pipes' buffers are full.
SLOW_LINK_WINDOW = 256 * 1024
SLOW_LINK_SHARE = 0.5
SLOW_LINK_RATE = 4_000_000  # bytes a second
SLOW_LINK_WINDOWS = 2
# Those windows see the link only once ssh's channel window (2 MB) and the pipes are full: on
# real text over 40 ms and 20 Mbit/s, after 3.3-4.3 MB went at level 1. A server that offers
# `reports` says, every REPORT_BYTES of this side's stream it has taken off the wire until the
# first message that is not a body sent ahead, how many and when by its own clock
# (`received`). The link is slow as soon as reports over REPORT_SPAN show the bytes arriving
# at under SLOW_LINK_RATE while REPORT_BACKLOG more have been written than had arrived: the
# link, not this side, sets the pace (docs/PROTOCOL.md "Compression").
REPORT_BYTES = 256 * 1024
REPORT_SPAN = 256 * 1024
REPORT_BACKLOG = 1024 * 1024
COMPRESS_SLICE = 256 * 1024  # bytes of a line compressed before what they give is written
INFLATE_READ_BYTES = 256 * 1024  # of the wire read at a time, compressed
INFLATE_STEP_BYTES = MIB  # decompressed at most per step, so a small input cannot grow memory

ERROR_CODES = {
    "bad-json": "a line is not one JSON object in UTF-8",
    "line-too-long": f"a line is longer than {MAX_LINE_BYTES} bytes",
    "too-many-values": f"a line holds more than {MAX_LINE_VALUES} JSON values",
    "unknown-type": "the message type is unknown for the negotiated version",
    "out-of-order": "the message is not allowed at this point of the session",
    "bad-field": "a field is missing or has the wrong type or value",
    "version": "the two sides share no protocol version",
    "machine-mismatch": "the client names a machine other than the one its key is pinned to",
    "stale-base": "a delta manifest's base is not what the server holds; send the whole manifest",
    "ahead-full": "bodies sent ahead of their manifest exceed the server's hello.ahead_bytes",
    "too-many-files": "a manifest or publish lists more files than the server's namespace quota",
    "store": "the server's store refused or failed the operation",
    "disk-full": "the disk holding the server's store is full; nothing of the step was stored",
    "note": "a note was refused",
    "not-found": "the store holds no such file or version (history, show); the session goes on",
}


class PeerError(ProtocolError):
    """An error of the exchange; `code` is one of ERROR_CODES.

    `remote` is True when the peer sent it (an `error` message), False when this side found
    the peer's message at fault.
    """

    def __init__(self, code: str, message: str, *, remote: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.remote = remote


def encode(message: dict[str, Any]) -> bytes:
    """One message as one line of UTF-8 JSON; ProtocolError if a text in it is not Unicode.

    A lone surrogate (which a JSON escape can carry) has no UTF-8 form: a side that echoes
    what its peer sent makes it printable first (`printable`).
    """
    try:
        return (json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
                + b"\n")
    except UnicodeEncodeError:
        raise ProtocolError(f"a {message.get('type')!r} message holds text that is not valid "
                            "Unicode (a lone surrogate); it was not sent") from None


def printable(text: str) -> str:
    """`text` as it is, or with each lone surrogate written out as six characters, to be sent."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def json_values(line: bytes) -> int:
    """How many values a line of JSON holds, at most: the `[`, `{`, `,` and `:` outside strings.

    Every value but the outermost follows one of them. Counting them in the whole line is one
    pass at memory speed (a copy of the line without them, twice as fast as a count of each,
    and gone before the line is decoded, which costs as much); only a line where strings hold
    many of them (a body of JSON or CSV text) is walked string by string, to leave out those
    inside long strings, and a walk stops once the strings alone are too many (each is a value).
    """
    rough = len(line) - len(line.translate(None, b"".join(_STRUCTURE)))
    if rough <= MAX_LINE_VALUES:
        return rough
    inside = 0
    for n, string in enumerate(_STRINGS.finditer(line)):
        if n >= MAX_LINE_VALUES:
            return n + 1
        start, end = string.span()
        if end - start > 64:  # in a short one they are few: counted, as if outside
            inside += sum(line.count(c, start, end) for c in _STRUCTURE)
    return rough - inside


_STRUCTURE = (b"[", b"{", b",", b":")
# A JSON string, or an unterminated one up to the end of the line: every match succeeds and
# nothing backtracks (possessive), so the walk is linear even on hostile text.
_STRINGS = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\\?\Z)', re.DOTALL)


# Control characters JSON must escape, other than the three `json_text` replaces itself.
_RARE_CONTROLS = bytes(c for c in range(32) if c not in b"\n\r\t")


def json_text(data: bytes) -> bytes:
    """`data`, valid UTF-8, as the inside of a JSON string (no quotes), ready to go on a line.

    Markdown rarely holds a control character but the line break and the tab, so a few byte
    replaces do what `json.dumps` does at a quarter of its cost; JSON needs nothing else escaped.
    """
    if len(data.translate(None, _RARE_CONTROLS)) != len(data):
        return json.dumps(data.decode("utf-8"), ensure_ascii=False)[1:-1].encode("utf-8")
    return (data.replace(b"\\", b"\\\\").replace(b'"', b'\\"').replace(b"\n", b"\\n")
            .replace(b"\r", b"\\r").replace(b"\t", b"\\t"))


def encode_bodies(bodies: list[tuple[str, bytes]]) -> bytes:
    """A `bodies` message of (sha256, UTF-8 text) pairs, built from the bytes as they are."""
    return encode_pairs("bodies", bodies)


def encode_pairs(kind: str, pairs: list[tuple[str, bytes]]) -> bytes:
    """A message of type `kind` whose list `kind` holds [address, UTF-8 text] pairs.

    `bodies` (sha256, text) and `tails` (base sha256, tail): built from the bytes as they
    are, without decoding the texts.
    """
    parts = [b'{"type":"%s","%s":[' % (kind.encode(), kind.encode())]
    for address, data in pairs:
        parts += (b'["', json_text(address.encode("utf-8")), b'","', json_text(data), b'"],')
    if pairs:
        parts[-1] = b'"]'
    parts.append(b"]}\n")
    return b"".join(parts)


def encode_files(files: list[tuple[str, str, bytes | None]]) -> bytes:
    """A `files` message of (path, sha256, text in UTF-8 or None), built from the bytes as they are.

    The same line `encode` makes of the texts, at a fraction of the cost, and without a
    string copy of each text: a pull sends hundreds of megabytes this way.
    """
    parts = [b'{"type":"files","files":[']
    for path, sha, data in files:
        parts += (b'["', json_text(path.encode("utf-8")), b'","', json_text(sha.encode("utf-8")),
                  b'",null],' if data is None else b'","')
        if data is not None:
            parts += (json_text(data), b'"],')
    if files:
        parts[-1] = parts[-1][:-1]
    parts.append(b"]}\n")
    return b"".join(parts)


def error(code: str, message: str) -> dict[str, Any]:
    """An error message; the sender closes the session after a fatal one."""
    return {"type": "error", "code": code, "message": message}


class Channel:
    """Both directions of one session over a pair of byte streams, counting bytes each way.

    `sent` and `received` count bytes on the wire (compressed, when the session compresses);
    `sent_plain` and `received_plain` count the lines themselves.
    """

    def __init__(self, reader: IO[bytes], writer: IO[bytes], peer: str = "peer") -> None:
        self.reader: Any = reader
        self.writer = writer
        self.peer = peer
        self.sent = 0
        self.received = 0
        self.sent_plain = 0
        self.received_plain = 0
        self._deflate: Any = None
        self._level = ZLIB_LEVEL
        # The peer's latest `received` reports (`arrived`): a few span REPORT_SPAN, and a peer
        # that sends too many holds no more memory for it.
        self._reports: deque[tuple[int, float]] = deque(maxlen=64)
        self._inflate: _Inflating | None = None
        # Version 3, set by a server that announced `raw_bodies` in its hello: a `bodies`
        # message with `sizes` is followed by its texts as raw UTF-8 (`_texts_after`).
        self.raw_bodies = False

    def compress_output(self) -> None:
        """From the next byte on, what this side sends is one zlib stream (its hello is sent)."""
        self._deflate = zlib.compressobj(ZLIB_LEVEL)
        self._level = ZLIB_LEVEL
        self._window = (time.monotonic(), self.sent, 0.0)  # its start, bytes sent, time blocked
        self._slow_windows = 0  # windows in a row in which the writes mostly blocked

    def arrived(self, wire: int, seconds: float) -> None:
        """The peer's report: `wire` bytes of this side's stream had arrived at `seconds`.

        `seconds` is the peer's clock, whose differences alone mean anything. Called by the
        thread that reads the peer while this side's sender writes (a deque's append is atomic).
        """
        self._reports.append((wire, seconds))

    def decompress_input(self) -> None:
        """From the next byte on, what the peer sends is one zlib stream (its hello was read)."""
        self._inflate = _Inflating(self.reader, self.peer)

    @property
    def level(self) -> int | None:
        """The zlib level this side's output uses now; None when it is not compressed."""
        return self._level if self._deflate is not None else None

    @property
    def compressing(self) -> bool:
        """Whether this side's output is compressed now."""
        return self._deflate is not None

    def send(self, message: dict[str, Any]) -> None:
        """Write one message and flush, so the peer can act on it now."""
        self.send_line(encode(message))

    def send_line(self, data: bytes) -> None:
        """Write one message already encoded (`encode`, `encode_bodies`) and flush.

        Compressed, each write ends in a sync flush: the peer can decode all of it at once.
        """
        plain = len(data)
        try:
            if self._deflate is None:
                self.writer.write(data)
                self.sent += plain
            else:
                self._write_compressed(data)
            self.writer.flush()
        except (BrokenPipeError, ConnectionResetError, ValueError, OSError) as exc:
            raise ProtocolError(f"the {self.peer} closed the connection ({exc})") from None
        self.sent_plain += plain

    def _write_compressed(self, data: bytes) -> None:
        """Compress a slice at a time and write what each gives, ending in a sync flush.

        A 4 MiB batch then starts onto a slow link after the first slice is compressed, not
        after the whole line, and the compressed line is never held whole.
        """
        view = memoryview(data)
        for start in range(0, len(data), COMPRESS_SLICE):
            if out := self._deflate.compress(view[start:start + COMPRESS_SLICE]):
                self._write_timed(out, flush=True)
            if self._level == ZLIB_LEVEL and self._link_is_slow():
                # The stream ends here, even inside a line, and one at the slow link's level
                # starts: the reader takes concatenated zlib streams (`_Inflating`).
                self._write_timed(self._deflate.flush(zlib.Z_FINISH), flush=False)
                self._deflate = zlib.compressobj(ZLIB_SLOW_LINK_LEVEL)
                self._level = ZLIB_SLOW_LINK_LEVEL
        self._write_timed(self._deflate.flush(zlib.Z_SYNC_FLUSH), flush=False)

    def _write_timed(self, data: bytes, *, flush: bool) -> None:
        started = time.monotonic()
        self.writer.write(data)
        if flush:
            self.writer.flush()
        since, sent, blocked = self._window
        self._window = (since, sent, blocked + time.monotonic() - started)
        self.sent += len(data)

    def _link_is_slow(self) -> bool:
        """Whether the link holds this side back to less than level 6 would feed it.

        The peer's reports say so (`_reports_say_slow`), or this side's waits over its windows.
        """
        if self._reports_say_slow():
            return True
        since, sent, blocked = self._window
        if self.sent - sent < SLOW_LINK_WINDOW:
            return False
        now = time.monotonic()
        self._window = (now, self.sent, 0.0)
        took = now - since
        slow = blocked >= SLOW_LINK_SHARE * took and self.sent - sent < SLOW_LINK_RATE * took
        self._slow_windows = self._slow_windows + 1 if slow else 0
        return self._slow_windows >= SLOW_LINK_WINDOWS

    def _reports_say_slow(self) -> bool:
        """Whether the peer's reports show the link slower than this side writes.

        The latest reports span REPORT_SPAN arriving at under SLOW_LINK_RATE, and REPORT_BACKLOG
        more bytes have been written than the latest says had arrived.
        """
        reports = list(self._reports)
        if len(reports) < 2:
            return False
        wire, at = reports[-1]
        if self.sent - wire < REPORT_BACKLOG:
            return False
        for earlier, then in reversed(reports[:-1]):
            if wire - earlier >= REPORT_SPAN:
                return at > then and wire - earlier < SLOW_LINK_RATE * (at - then)
        return False

    def _readline(self) -> bytes:
        """The next line, compressed or not; never more than MAX_LINE_BYTES + 1 bytes of it."""
        if self._inflate is None:
            line = self.reader.readline(MAX_LINE_BYTES + 1)
            self.received += len(line)
        else:
            line = self._inflate.readline(MAX_LINE_BYTES + 1)
            self.received = self._inflate.wire
        self.received_plain += len(line)
        return line

    def receive(self) -> dict[str, Any] | None:
        """Read one message; None at a clean end of input. Over-long lines are never held whole."""
        line = self._readline()
        if not line:
            return None
        if len(line) > MAX_LINE_BYTES:
            raise PeerError("line-too-long", f"a message from the {self.peer} is longer than "
                            f"{MAX_LINE_BYTES} bytes; refused")
        if len(line) > MAX_LINE_VALUES and json_values(line) > MAX_LINE_VALUES:
            raise PeerError("too-many-values", f"a message from the {self.peer} holds more than "
                            f"{MAX_LINE_VALUES} JSON values (lists, objects, strings, numbers); "
                            "refused: split it into several messages")
        try:
            text = line.decode("utf-8")
            del line  # parsed from the text alone: the bytes need not stay meanwhile
            message = json.loads(text)
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise PeerError("bad-json", f"the {self.peer} sent a line that is not one UTF-8 JSON "
                            "object") from None
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            raise PeerError("bad-json", f"the {self.peer} sent a message that is not a JSON "
                            "object with a string 'type'")
        if message["type"] == "error":
            raise PeerError(str(message.get("code", "error")), str(message.get("message", "")),
                            remote=True)
        if self.raw_bodies and message["type"] == "bodies" and "sizes" in message:
            message["bodies"] = self._texts_after(message)
        return message

    def _texts_after(self, message: dict[str, Any]) -> list[bytes]:
        """The texts a raw `bodies` message carries after its line, read whole, as bytes.

        Part of the framing: the next message starts after them, so they are read here, never
        left for a handler. JSON gives no value of type bytes, so the list cannot be mistaken
        for the JSON form's texts (str).
        """
        sizes = message["sizes"]
        if "bodies" in message:
            raise PeerError("bad-field", "a bodies message carries its texts in bodies or after "
                            "its line (sizes), not both")
        if type(sizes) is not list or not all(type(n) is int and n >= 0 for n in sizes):
            raise PeerError("bad-field", "bodies.sizes must be a list of the sizes in bytes "
                            "(integers from 0) of the texts that follow the line")
        total = sum(sizes)
        if total > MAX_LINE_BYTES:
            raise PeerError("bad-field", f"bodies.sizes adds up to {total} bytes, more than "
                            f"{MAX_LINE_BYTES} (the limit of a line); split the texts into "
                            "several bodies messages")
        data = self.read_exact(total)
        if len(data) < total:
            raise ProtocolError(f"the {self.peer} closed the connection {total - len(data)} "
                                f"bytes short of the {total} bytes of texts its bodies message "
                                "announced (sizes)")
        texts, at = [], 0
        for size in sizes:
            texts.append(data[at:at + size])
            at += size
        return texts

    def read_exact(self, size: int) -> bytes:
        """The next `size` bytes of the stream, compressed or not; fewer only at its end."""
        if self._inflate is None:
            data = self.reader.read(size) if size else b""
            self.received += len(data)
        else:
            data = self._inflate.read(size)
            self.received = self._inflate.wire
        self.received_plain += len(data)
        return data

    def ended(self, types: tuple[str, ...]) -> ProtocolError:
        """The error for a peer that ended the session while this side waited for `types`."""
        return ProtocolError(f"the {self.peer} ended the session while this side waited for "
                             f"{' or '.join(types)}")

    def expect(self, *types: str) -> dict[str, Any]:
        """Read one message that must be of one of `types`."""
        message = self.receive()
        if message is None:
            raise self.ended(types)
        if message["type"] not in types:
            raise PeerError("out-of-order", f"expected {' or '.join(types)} from the {self.peer}, "
                            f"got {message['type']!r}")
        return message


class _Inflating:
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
            raise PeerError("bad-json", f"the {self.peer} sent data that is not the zlib stream "
                            f"both hellos agreed on ({exc})") from None
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


def choose_version(mine: tuple[int, ...], theirs: object) -> int:
    """The highest version both sides speak."""
    if not isinstance(theirs, list) or not all(isinstance(v, int) and not isinstance(v, bool)
                                               for v in theirs):
        raise PeerError("bad-field", "hello.versions must be a list of integers")
    common = set(mine) & set(theirs)
    if not common:
        raise PeerError("version", f"no shared protocol version: this side speaks "
                        f"{sorted(mine)}, the peer {sorted(theirs)}; upgrade the older side")
    return max(common)


def field(message: dict[str, Any], name: str, kind: type | tuple[type, ...],
          *, optional: bool = False) -> Any:
    """A field of the required type, or a bad-field error naming it."""
    if name not in message and optional:
        return None
    value = message.get(name)
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in kinds):
        raise PeerError("bad-field", f"{message.get('type')}.{name} is missing or of the wrong "
                        f"type ({type(value).__name__})")
    return value


def chunks(items: Iterable[Any], size_of: Any) -> Iterator[list[Any]]:
    """Split items into lists of at most CHUNK_BYTES (by `size_of`), so no line is too long.

    Items are taken as the lists go out, so a stream (a store's cursor) is never held whole.
    """
    batch: list[Any] = []
    total = 0
    for item in items:
        size = size_of(item)
        if batch and total + size > CHUNK_BYTES:
            yield batch
            batch, total = [], 0
        batch.append(item)
        total += size
    if batch:
        yield batch


def encode_raw_texts(texts: list[bytes], source: str | None = None) -> bytes:
    """A version 3 `bodies` message whose UTF-8 texts follow its line as they are (`raw_bodies`).

    `{"type":"bodies","sizes":[...]}` and then the texts one after another: nothing escaped on
    this side, nothing parsed or decoded whole on the server's (docs/PROTOCOL.md).
    """
    head: dict[str, Any] = {"type": "bodies"}
    if source is not None:
        head["source"] = source
    head["sizes"] = [len(data) for data in texts]
    return b"".join([encode(head), *texts])


def encode_texts(texts: Iterable[bytes], source: str | None = None) -> bytes:
    """A version 3 `bodies` message: the UTF-8 texts alone, their sha256 left to the server.

    With `source` it answers that source's `need`; without, it goes ahead of the manifests.
    """
    head = b'{"type":"bodies",' if source is None else (
        b'{"type":"bodies","source":"' + json_text(source.encode("utf-8")) + b'",')
    parts = [head, b'"bodies":[']
    for data in texts:
        parts += (b'"', json_text(data), b'",')
    if parts[-1] == b'",':
        parts[-1] = b'"'
    parts.append(b"]}\n")
    return b"".join(parts)
