"""The sync exchange: newline-delimited JSON messages, their shapes, and bounded line reading.

docs/PROTOCOL.md is the contract; this module is its one implementation, used by both ends.
Version 3's raw texts after a `bodies` or `files` line are read here too, as part of the
framing.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Iterable, Iterator

from sharedmem.compression import Deflating, Inflating, NotZlib
from sharedmem.core import JSONError, ProtocolError
from sharedmem.fastjson import loads
from sharedmem.rules import MIB

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO, Any

VERSIONS = (1, 2, 3)
MAX_LINE_BYTES = 32 * MIB
# Parsing costs several times a line's size in values that are nearly empty (`[],`, `"a":0,`);
# this many values cost what the largest legal line of text costs anyway, and no message
# either end sends comes near it (docs/PROTOCOL.md "Framing").
MAX_LINE_VALUES = 1_000_000
CHUNK_BYTES = 4 * MIB
# Version 3: a manifest entry may name its body by its place among the texts this session sent
# ahead (`bodies` before the manifest, counted from 0) instead of by its sha256, which the
# server computed as each came: a few bytes on the wire instead of a sha256's. The server
# remembers the first AHEAD_REFS of them (32 bytes each); a client refers to no later one.
AHEAD_REFS = 1 << 17
COMPRESSIONS = ("zlib",)  # what a hello may offer; the machinery is compression.py's

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
    "session-limit": "the client sent more than the server takes in one session (bytes or "
                     "messages)",
    "busy": "the server runs as many sessions on its store as it takes at once; try again later",
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
    pass at memory speed (a copy of the line without them, faster than a count of each,
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
    replaces do what `json.dumps` does at a fraction of its cost; JSON needs nothing else escaped.
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


def encode_raw_files(files: list[tuple[str, str, bytes | None]]) -> bytes:
    """A version 3 `files` message whose UTF-8 texts follow its line as they are.

    `{"type":"files","files":[[path, sha256], ...],"sizes":[...]}` (null for a text the client
    holds), then the texts one after another: nothing escaped here, nothing decoded whole on
    the client's side (docs/PROTOCOL.md).
    """
    head = {"type": "files", "files": [[path, sha] for path, sha, _ in files],
            "sizes": [None if data is None else len(data) for _, _, data in files]}
    return b"".join([encode(head), *(data for _, _, data in files if data is not None)])


def error(code: str, message: str) -> dict[str, Any]:
    """An error message; the sender closes the session after a fatal one."""
    return {"type": "error", "code": code, "message": message}


class Channel:
    """Both directions of one session over a pair of byte streams, counting bytes each way.

    `sent` and `received` count bytes on the wire (compressed, when the session compresses);
    `sent_plain` and `received_plain` count the lines themselves (and raw texts after a line).
    What a server takes from its client is bounded with `guard`.
    """

    def __init__(self, reader: IO[bytes], writer: IO[bytes], peer: str = "peer") -> None:
        self.reader: Any = reader
        self.writer = writer
        self.peer = peer
        self.sent = 0
        self.received = 0
        self.sent_plain = 0
        self.received_plain = 0
        self.messages = 0  # received
        self.unicode_only = False
        self.most_bytes: int | None = None
        self.most_messages: int | None = None
        self._deflate: Deflating | None = None
        # The peer's latest `received` reports (`arrived`): a few span a report window, and a
        # peer that sends too many holds no more memory for it.
        self._reports: deque[tuple[int, float]] = deque(maxlen=64)
        self._inflate: Inflating | None = None
        # Version 3: the types of message whose line, when it has `sizes`, is followed by its
        # texts as raw UTF-8 (`_texts_after`): `bodies` to a server, `files` to a client.
        self.raw_texts: frozenset[str] = frozenset()

    def guard(self, *, most_bytes: int, most_messages: int) -> None:
        """Bound what the peer may send from now on: what a server takes from its client.

        A line whose JSON holds a lone surrogate is refused as `bad-json` where it is decoded
        (`fastjson.loads`), so no handler meets one; the whole session may send at most
        `most_bytes` (counted as lines decompress, raw texts too) and `most_messages`: past
        either, the read stops with `session-limit`, nothing more of the peer's stream inflated.
        """
        self.unicode_only = True
        self.most_bytes = most_bytes
        self.most_messages = most_messages

    def take_raw_texts(self, kind: str) -> None:
        """From now on a `kind` line with `sizes` is followed by its texts (version 3)."""
        self.raw_texts |= {kind}

    def compress_output(self) -> None:
        """From the next byte on, what this side sends is one zlib stream (its hello is sent)."""
        self._deflate = Deflating(self.writer, self.sent, self._reports)

    def arrived(self, wire: int, seconds: float) -> None:
        """The peer's report: `wire` bytes of this side's stream had arrived at `seconds`.

        `seconds` is the peer's clock, whose differences alone mean anything. Called by the
        thread that reads the peer while this side's sender writes (a deque's append is atomic).
        """
        self._reports.append((wire, seconds))

    def decompress_input(self) -> None:
        """From the next byte on, what the peer sends is one zlib stream (its hello was read)."""
        self._inflate = Inflating(self.reader, self.peer)

    @property
    def level(self) -> int | None:
        """The zlib level this side's output uses now; None when it is not compressed."""
        return self._deflate.level if self._deflate is not None else None

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
                self._deflate.write(data)
                self.sent = self._deflate.wire
            self.writer.flush()
        except (BrokenPipeError, ConnectionResetError, ValueError, OSError) as exc:
            raise ProtocolError(f"the {self.peer} closed the connection ({exc})") from None
        self.sent_plain += plain

    def _room(self, wanted: int) -> int:
        """How much of `wanted` bytes the session's bound lets the peer send yet, plus one.

        One byte more than allowed is read, so a peer past the bound is told (`_over`) without
        more of its stream inflated or held.
        """
        if self.most_bytes is None:
            return wanted
        return min(wanted, max(0, self.most_bytes - self.received_plain) + 1)

    def _over(self) -> PeerError:
        return PeerError("session-limit", f"the {self.peer} sent more than {self.most_bytes} "
                         "bytes (decompressed) in this session, the most the server takes in one "
                         "(session_bytes); nothing more was read. Publish less in one sync, or "
                         "raise the limit (serve --limit session_bytes=N)")

    def _readline(self) -> bytes:
        """The next line, compressed or not; never more than MAX_LINE_BYTES + 1 bytes of it."""
        limit = self._room(MAX_LINE_BYTES + 1)
        if self._inflate is None:
            line = self.reader.readline(limit)
            self.received += len(line)
        else:
            try:
                line = self._inflate.readline(limit)
            except NotZlib as exc:
                raise PeerError("bad-json", str(exc)) from None
            self.received = self._inflate.wire
        self.received_plain += len(line)
        if self.most_bytes is not None and self.received_plain > self.most_bytes:
            raise self._over()
        return line

    def receive(self) -> dict[str, Any] | None:
        """Read one message; None at a clean end of input. Over-long lines are never held whole."""
        line = self._readline()
        if not line:
            return None
        self.messages += 1
        if self.most_messages is not None and self.messages > self.most_messages:
            raise PeerError("session-limit", f"the {self.peer} sent more than "
                            f"{self.most_messages} messages in this session, the most the server "
                            "takes in one (session_messages); nothing more was read. Raise the "
                            "limit if a client needs more (serve --limit session_messages=N)")
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
            message = loads(text, unicode_only=self.unicode_only)
        except UnicodeDecodeError:
            raise PeerError("bad-json", f"the {self.peer} sent a line that is not one UTF-8 JSON "
                            "object") from None
        except JSONError as exc:
            raise PeerError("bad-json", f"the {self.peer} sent a line that is not one UTF-8 JSON "
                            f"object ({exc})") from None
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            raise PeerError("bad-json", f"the {self.peer} sent a message that is not a JSON "
                            "object with a string 'type'")
        if message["type"] == "error":
            raise PeerError(str(message.get("code", "error")), str(message.get("message", "")),
                            remote=True)
        if message["type"] in self.raw_texts and "sizes" in message:
            self._texts_after(message)
        return message

    def _texts_after(self, message: dict[str, Any]) -> None:
        """The texts a raw message carries after its line, read whole, as bytes.

        Part of the framing: the next message starts after them, so they are read here, never
        left for a handler. JSON gives no value of type bytes, so texts put in the JSON instead
        are told apart (and refused) by their type. A `bodies` message's go in its `bodies`; a
        `files` message's in `texts`, one a file, None for a size of null (a text the client
        holds).
        """
        kind, sizes = message["type"], message["sizes"]
        into = "bodies" if kind == "bodies" else "texts"
        if into in message:
            raise PeerError("bad-field", f"a {kind} message carries its texts after its line "
                            f"(sizes), not in {into}")
        if type(sizes) is not list or not all(type(n) is int and n >= 0 or n is None
                                               and kind == "files" for n in sizes):
            raise PeerError("bad-field", f"{kind}.sizes must be a list of the sizes in bytes "
                            "(integers from 0) of the texts that follow the line"
                            + (", or null for none" if kind == "files" else ""))
        total = sum(n for n in sizes if n)
        if total > MAX_LINE_BYTES:
            raise PeerError("bad-field", f"{kind}.sizes adds up to {total} bytes, more than "
                            f"{MAX_LINE_BYTES} (the limit of a line); split the texts into "
                            f"several {kind} messages")
        if self.most_bytes is not None and self.received_plain + total > self.most_bytes:
            raise self._over()
        data = self.read_exact(total)
        if len(data) < total:
            raise ProtocolError(f"the {self.peer} closed the connection {total - len(data)} "
                                f"bytes short of the {total} bytes of texts its {kind} message "
                                "announced (sizes)")
        texts: list[bytes | None] = []
        at = 0
        for size in sizes:
            texts.append(None if size is None else data[at:at + size])
            at += size or 0
        message[into] = texts

    def read_exact(self, size: int) -> bytes:
        """The next `size` bytes of the stream, compressed or not; fewer only at its end."""
        if self._inflate is None:
            data = self.reader.read(size) if size else b""
            self.received += len(data)
        else:
            try:
                data = self._inflate.read(size)
            except NotZlib as exc:
                raise PeerError("bad-json", str(exc)) from None
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
    """A version 3 `bodies` message whose UTF-8 texts follow its line as they are.

    `{"type":"bodies","sizes":[...]}` and then the texts one after another: nothing escaped on
    this side, nothing parsed or decoded whole on the server's (docs/PROTOCOL.md).
    """
    head: dict[str, Any] = {"type": "bodies"}
    if source is not None:
        head["source"] = source
    head["sizes"] = [len(data) for data in texts]
    return b"".join([encode(head), *texts])



