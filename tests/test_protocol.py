"""The exchange's framing: bounded line reading, message checks, versions, fields, chunks."""

from __future__ import annotations

import io
import json
import os
import random
import threading
import time
import tracemalloc
import zlib

import pytest
from conftest import run_with_timeout

from sharedmem.core import ProtocolError
from sharedmem.protocol import (
    CHUNK_BYTES,
    MAX_LINE_BYTES,
    MAX_LINE_VALUES,
    REPORT_BACKLOG,
    REPORT_SPAN,
    ZLIB_LEVEL,
    ZLIB_SLOW_LINK_LEVEL,
    Channel,
    PeerError,
    choose_version,
    chunks,
    encode,
    encode_bodies,
    encode_raw_texts,
    error,
    field,
    json_values,
    printable,
)


class Endless(io.RawIOBase):
    """A peer that would send `total` bytes without a newline; counts what was actually read."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.delivered = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        n = min(len(buffer), self.total - self.delivered)
        buffer[:n] = b"a" * n
        self.delivered += n
        return n


def channel_over(data: bytes) -> Channel:
    return Channel(io.BufferedReader(io.BytesIO(data)), io.BytesIO(), "server")


def test_over_long_line_is_refused_without_reading_the_rest() -> None:
    raw = Endless(100 * 1024 * 1024)
    channel = Channel(io.BufferedReader(raw), io.BytesIO(), "server")
    with pytest.raises(PeerError, match="longer than") as exc:
        channel.receive()
    assert exc.value.code == "line-too-long"
    assert "server" in str(exc.value)
    assert MAX_LINE_BYTES < raw.delivered <= MAX_LINE_BYTES + 1024 * 1024
    assert channel.received == MAX_LINE_BYTES + 1


def test_a_line_of_exactly_the_limit_is_read() -> None:
    head, tail = b'{"type":"files","pad":"', b'"}\n'
    line = head + b"x" * (MAX_LINE_BYTES - len(head) - len(tail)) + tail
    assert len(line) == MAX_LINE_BYTES
    channel = channel_over(line + encode({"type": "end"}))
    assert len(channel.receive()["pad"]) == MAX_LINE_BYTES - len(head) - len(tail)
    assert channel.receive() == {"type": "end"}
    assert channel.receive() is None


@pytest.mark.parametrize("line", [
    b"\xff\xfe{}\n", b'{"type": "hello", "x": "\xc3"}\n', b"not json\n", b"\n", b"[1, 2]\n",
    b'"hello"\n', b'{"no": "type"}\n', b'{"type": 5}\n', b"[" * 100_000 + b"\n",
])
def test_bad_lines_are_bad_json(line: bytes) -> None:
    with pytest.raises(PeerError) as exc:
        channel_over(line).receive()
    assert exc.value.code == "bad-json"


def test_error_message_raises_its_code() -> None:
    channel = channel_over(encode(error("store", "the disk is full")))
    with pytest.raises(PeerError, match="the disk is full") as exc:
        channel.receive()
    assert exc.value.code == "store"
    assert isinstance(exc.value, ProtocolError)


def test_expect() -> None:
    channel = channel_over(encode({"type": "hello", "version": 2}) + encode({"type": "bye"}))
    assert channel.expect("hello", "namespaces")["version"] == 2
    with pytest.raises(PeerError, match="expected files or end from the server, got 'bye'") as exc:
        channel.expect("files", "end")
    assert exc.value.code == "out-of-order"
    with pytest.raises(ProtocolError, match="ended the session while this side waited for hello") \
            as ended:
        channel.expect("hello")
    assert not isinstance(ended.value, PeerError)


def test_byte_counters_and_encoding() -> None:
    writer = io.BytesIO()
    messages = [{"type": "note", "text": "two\nlines, café ✓"}, {"type": "bye"}]
    channel = Channel(io.BufferedReader(io.BytesIO()), writer)
    for message in messages:
        channel.send(message)
    data = writer.getvalue()
    assert channel.sent == len(data)
    assert data.count(b"\n") == 2 and "café ✓".encode() in data
    reader = channel_over(data)
    assert [reader.receive(), reader.receive(), reader.receive()] == [*messages, None]
    assert reader.received == len(data) and reader.sent == 0


def test_send_to_a_closed_peer_is_a_protocol_error() -> None:
    writer = io.BytesIO()
    writer.close()
    channel = Channel(io.BufferedReader(io.BytesIO()), writer, "client")
    with pytest.raises(ProtocolError, match="the client closed the connection"):
        channel.send({"type": "bye"})
    assert channel.sent == 0


@pytest.mark.parametrize("mine,theirs,chosen", [
    ((1, 2), [1, 2], 2), ((1, 2), [1, 2, 3], 2), ((1, 2), [1], 1), ((1,), [2, 1], 1),
    ((1, 2), [2, 5, 9], 2),
])
def test_choose_version_picks_the_highest_shared(mine: tuple[int, ...], theirs: list[int],
                                                 chosen: int) -> None:
    assert choose_version(mine, theirs) == chosen


def test_choose_version_refusals() -> None:
    with pytest.raises(PeerError, match="no shared protocol version") as exc:
        choose_version((1, 2), [3, 4])
    assert exc.value.code == "version"
    with pytest.raises(PeerError) as none:
        choose_version((1, 2), [])
    assert none.value.code == "version"
    for bad in (None, "2", 2, [True], [1.0], [[1]], ["1"], {"1": 1}):
        with pytest.raises(PeerError) as exc:
            choose_version((1, 2), bad)
        assert exc.value.code == "bad-field", bad


def test_field_types() -> None:
    message = {"type": "pull", "n": 3, "flag": True, "name": "x", "items": [], "none": None}
    assert field(message, "n", int) == 3
    assert field(message, "name", str) == "x"
    assert field(message, "items", list) == []
    assert field(message, "flag", bool) is True
    assert field(message, "missing", str, optional=True) is None
    assert field(message, "n", (int, str)) == 3
    for name, kind in (("flag", int), ("flag", (int,)), ("flag", (int, float)), ("n", str),
                       ("name", int), ("missing", str), ("none", str), ("none", str),
                       ("items", dict)):
        with pytest.raises(PeerError, match=f"pull.{name} is missing or of the wrong type") as exc:
            field(message, name, kind)
        assert exc.value.code == "bad-field"
    with pytest.raises(PeerError):
        field(message, "none", str, optional=True)  # present but null is not absent


def test_chunks_stay_under_the_batch_size() -> None:
    rng = random.Random(7)
    items = [rng.randint(1, CHUNK_BYTES // 3) for _ in range(200)]
    items[50] = CHUNK_BYTES * 3  # one item bigger than a batch travels alone
    batches = list(chunks(items, lambda size: size))
    assert [i for b in batches for i in b] == items
    for batch in batches:
        assert sum(batch) <= CHUNK_BYTES or len(batch) == 1
    assert [CHUNK_BYTES * 3] in batches
    assert all(a and sum(a) + b[0] > CHUNK_BYTES for a, b in zip(batches, batches[1:], strict=False))
    assert list(chunks([], len)) == []
    assert list(chunks(["ab", "cd"], len)) == [["ab", "cd"]]


def test_encode_is_one_compact_line() -> None:
    line = encode({"type": "files", "files": [["a.md", "x\ny"]]})
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == {"type": "files", "files": [["a.md", "x\ny"]]}
    assert b", " not in line and b": " not in line


def test_bodies_encoded_from_bytes_decode_to_the_same_texts() -> None:
    """Every character JSON escapes (and some it does not) survives `encode_bodies` as json does."""
    alphabet = [chr(c) for c in range(0x80)] + ["é", "\u2028", "\u2029", "\U0001f600", "中"]
    rng = random.Random(7)
    texts = [alphabet[:], "", "plain", '"quoted" \\ back\\slash\ttab\r\n'] + [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(500)]
    texts[0] = "".join(texts[0])
    bodies = [(f"{i:064x}", t.encode("utf-8")) for i, t in enumerate(texts)]
    line = encode_bodies(bodies)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == {"type": "bodies", "bodies": [[s, t] for (s, _), t in
                                                                zip(bodies, texts, strict=True)]}
    assert json.loads(encode_bodies([])) == {"type": "bodies", "bodies": []}


@pytest.mark.parametrize(("value", "count"), [
    ({"type": "x"}, 2),
    ({"type": "x", "v": [1, [2, {"a": []}], "s"]}, 12),
    ({"type": "x", "v": "[{,:" * 400_000}, 4),  # inside one long string: not values
    # Escaped quotes and backslashes end no string; a short string's few count as values.
    ({"type": "x", "v": ['a"b\\', '\\\\"[,', "c,:[{" * 300_000]}, 9),
])
def test_json_values_counts_the_structure_outside_strings(value: object, count: int) -> None:
    line = encode(value)  # type: ignore[arg-type]
    if len(line) > MAX_LINE_VALUES:
        assert json_values(line) == count
    else:  # a short line is counted roughly: never more than its length, so never refused
        assert count <= json_values(line) <= len(line)


def test_json_values_walks_hostile_text_in_linear_time() -> None:
    import time
    for line in (b'"' + b'\\"' * 2_000_000, b'["' + b'\\"\\\\' * 1_000_000 + b"\\",
                 b"[" + b'"a",' * 1_100_000 + b"0]"):
        start = time.perf_counter()
        json_values(line)
        assert time.perf_counter() - start < 2


@pytest.mark.parametrize("line", [
    b'{"type":"x","v":[' + b"[]," * 600_000 + b"[]]}\n",
    b'{"type":"x","v":{' + b",".join(b'"%d":0' % i for i in range(600_000)) + b"}}\n",
    b'{"type":"x","v":[' + b'"ab",' * 1_100_000 + b'""]}\n',
])
def test_a_line_of_too_many_values_is_refused_before_it_is_parsed(line: bytes) -> None:
    with pytest.raises(PeerError, match="more than 1000000 JSON values") as exc:
        channel_over(line).receive()
    assert exc.value.code == "too-many-values"


def test_what_a_sync_client_sends_stays_far_under_the_value_bound() -> None:
    files = [[f"folder{i // 500}/note-{i}.md", f"{i:064x}", 1234, 1_700_000_000_000_000_000]
             for i in range(20_000)]
    tiny = [(f"{i:064x}", b"") for i in range(CHUNK_BYTES // 80)]  # a batch of empty files
    csv = [(f"{i:064x}", b"a,b:[c]{d}," * 100_000) for i in range(3)]  # text full of structure
    lines = [encode({"type": "manifest", "source": "notes", "kind": "markdown",
                     "digest": "0" * 64, "files": files}),
             encode({"type": "pull", "known": {}, "have": [f"{i:064x}" for i in range(100_000)]}),
             encode_bodies(tiny), encode_bodies(csv),
             encode({"type": "bodies", "bodies": [["0" * 64, "\x01" * (1 << 20)]]})]
    for line in lines:
        assert json_values(line) <= MAX_LINE_VALUES // 3, line[:40]
        assert channel_over(line).receive()["type"] in ("manifest", "pull", "bodies")


def test_a_text_without_a_utf8_form_is_not_sent_and_printable_shows_it() -> None:
    writer = io.BytesIO()
    channel = Channel(io.BufferedReader(io.BytesIO()), writer, "client")
    with pytest.raises(ProtocolError, match="'result' message holds text that is not valid "
                       "Unicode"):
        channel.send({"type": "result", "refused": [{"path": "a\ud800.md"}]})
    assert writer.getvalue() == b"" and channel.sent == 0
    assert printable("a\ud800b\udfff") == "a\\ud800b\\udfff"
    assert printable("café ✓") == "café ✓"
    channel.send({"type": "result", "path": printable("a\ud800.md")})
    assert json.loads(writer.getvalue()) == {"type": "result", "path": "a\\ud800.md"}


# --- zlib compression (version 3) ---------------------------------------------------------------

def compressed_pair() -> tuple[Channel, io.BytesIO]:
    """A channel that compresses what it sends, and the wire it writes to."""
    wire = io.BytesIO()
    sender = Channel(io.BufferedReader(io.BytesIO()), wire, "client")
    sender.compress_output()
    return sender, wire


def inflating(data: bytes, peer: str = "server") -> Channel:
    channel = Channel(io.BufferedReader(io.BytesIO(data)), io.BytesIO(), peer)
    channel.decompress_input()
    return channel


def test_a_compressed_stream_carries_every_message_and_counts_wire_bytes() -> None:
    sender, wire = compressed_pair()
    text = "# note\n" + "the same words again and again. " * 2000
    sender.send({"type": "hello", "versions": [3]})
    sender.send_line(encode_bodies([("a" * 64, text.encode("utf-8"))]))
    sender.send({"type": "bye"})
    assert sender.sent == len(wire.getvalue()) < sender.sent_plain / 10  # wire bytes counted
    reader = inflating(wire.getvalue())
    assert reader.receive() == {"type": "hello", "versions": [3]}
    assert reader.receive() == {"type": "bodies", "bodies": [["a" * 64, text]]}
    assert reader.receive() == {"type": "bye"}
    assert reader.receive() is None
    assert reader.received == sender.sent and reader.received_plain == sender.sent_plain


def test_each_compressed_message_can_be_read_before_the_next_is_sent() -> None:
    """Every write ends in a sync flush: a reader holding one message never waits for more."""
    read_end, write_end = os.pipe()
    with open(read_end, "rb") as reader, open(write_end, "wb") as writer:
        sender = Channel(io.BufferedReader(io.BytesIO()), writer, "client")
        sender.compress_output()
        receiver = Channel(reader, io.BytesIO(), "client")
        receiver.decompress_input()
        for n in range(3):  # the pipe stays open: an unflushed message would block the read
            sender.send({"type": "note", "n": n, "text": "x" * 10_000})
            assert run_with_timeout(receiver.receive, 10)["n"] == n


def test_a_zip_bomb_is_refused_as_a_long_line_without_inflating_it() -> None:
    """A megabyte that inflates to a gigabyte: at most one line's worth is ever decompressed."""
    deflate = zlib.compressobj(9)
    zeros = b"0" * (16 * 1024 * 1024)
    bomb = b"".join(deflate.compress(zeros) for _ in range(64)) + deflate.flush()  # 1 GiB
    assert len(bomb) < 2 * 1024 * 1024
    channel = inflating(bomb)
    tracemalloc.start()
    try:
        with pytest.raises(PeerError) as exc:
            channel.receive()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert exc.value.code == "line-too-long"
    assert peak < 4 * MAX_LINE_BYTES  # not the gigabyte the bomb holds
    assert channel.received <= len(bomb)


def test_a_compressed_line_is_limited_by_what_it_inflates_to() -> None:
    sender, wire = compressed_pair()
    sender.send_line(b"[" + b"0," * (MAX_LINE_VALUES + 10) + b"0]\n")  # a few KB on the wire
    assert len(wire.getvalue()) < 100_000
    with pytest.raises(PeerError) as exc:
        inflating(wire.getvalue()).receive()
    assert exc.value.code == "too-many-values"


def test_data_that_is_not_the_agreed_zlib_stream_is_bad_json() -> None:
    with pytest.raises(PeerError) as exc:
        inflating(encode({"type": "hello"})).receive()  # plain text where zlib was agreed
    assert exc.value.code == "bad-json" and "zlib" in str(exc.value)


def test_zlib_streams_one_after_another_read_as_one_even_inside_a_line() -> None:
    """A sender may end its stream anywhere and start another (a new level): one input."""
    first, second = zlib.compressobj(1), zlib.compressobj(6)
    note = {"type": "note", "text": "x y z " * 5000}
    lines = encode(note) + encode({"type": "bye"})
    cut = len(lines) // 3  # inside the note's line
    data = (first.compress(lines[:cut]) + first.flush()
            + second.compress(lines[cut:]) + second.flush(zlib.Z_SYNC_FLUSH))
    reader = inflating(data)
    assert reader.receive() == note
    assert reader.receive() == {"type": "bye"}
    assert reader.receive() is None


def hex_notes(count: int, size: int) -> list[dict[str, object]]:
    """Messages that compress to about half: enough wire bytes to judge the link by."""
    return [{"type": "note", "n": n, "text": os.urandom(size // 2).hex()} for n in range(count)]


def test_a_sender_that_waits_on_a_slow_link_moves_to_the_slow_link_level() -> None:
    read_end, write_end = os.pipe()
    received: list[bytes] = []

    def drain() -> None:  # about 3 MB/s: a slow link, against level 1's tens of MB/s
        with open(read_end, "rb", buffering=0) as link:
            while chunk := link.read(16 * 1024):
                received.append(chunk)
                time.sleep(0.005)

    reader = threading.Thread(target=drain)
    reader.start()
    notes = hex_notes(6, 512 * 1024)
    with open(write_end, "wb") as writer:
        sender = Channel(io.BufferedReader(io.BytesIO()), writer, "client")
        sender.compress_output()
        assert sender.level == ZLIB_LEVEL
        for note in notes:
            sender.send(note)
        assert sender.level == ZLIB_SLOW_LINK_LEVEL
    reader.join(timeout=30)
    channel = inflating(b"".join(received))
    assert [channel.receive() for _ in notes] == notes  # the two streams read as one
    assert channel.receive() is None


class PacedLink(io.BytesIO):
    """A link whose writes take as long as `rate` bytes a second would: the sender blocks."""

    def __init__(self, rate: float) -> None:
        super().__init__()
        self.rate = rate

    def write(self, data: bytes) -> int:  # type: ignore[override]
        time.sleep(len(data) / self.rate)
        return super().write(data)


def send_busy(sender: Channel, notes: list[dict[str, object]], busy: float) -> None:
    """Send `notes`, working `busy` seconds before each as a sync's walk does."""
    for note in notes:
        time.sleep(busy)
        sender.send(note)


def test_a_busy_sender_on_a_slow_link_moves_to_the_slow_link_level() -> None:
    """Blocked 70% of the time at 2 MB/s: the link holds it back, though not 80% of the time."""
    link = PacedLink(2_000_000)
    sender = Channel(io.BufferedReader(io.BytesIO()), link, "client")
    sender.compress_output()
    notes = hex_notes(12, 256 * 1024)  # about 128 KiB each once compressed: 64 ms at 2 MB/s
    send_busy(sender, notes[:3], 0.027)
    assert sender.level == ZLIB_LEVEL  # judged over windows of 256 KiB, two in a row
    send_busy(sender, notes[3:], 0.027)
    assert sender.level == ZLIB_SLOW_LINK_LEVEL
    channel = inflating(link.getvalue())
    assert [channel.receive() for _ in notes] == notes


def test_a_fast_link_that_blocks_the_sender_keeps_the_fast_level() -> None:
    """Blocked most of the time, but at 8 MB/s: faster than level 6 could feed it."""
    link = PacedLink(8_000_000)
    sender = Channel(io.BufferedReader(io.BytesIO()), link, "client")
    sender.compress_output()
    notes = hex_notes(12, 256 * 1024)
    for note in notes:
        sender.send(note)
    assert sender.level == ZLIB_LEVEL
    channel = inflating(link.getvalue())
    assert [channel.receive() for _ in notes] == notes


def test_a_sender_the_link_keeps_up_with_stays_at_the_fast_level() -> None:
    sender, wire = compressed_pair()
    notes = hex_notes(6, 512 * 1024)
    for note in notes:
        sender.send(note)
    assert sender.level == ZLIB_LEVEL and Channel(io.BufferedReader(io.BytesIO()),
                                                  io.BytesIO()).level is None
    channel = inflating(wire.getvalue())
    assert [channel.receive() for _ in notes] == notes


def test_reports_of_a_slow_link_move_the_sender_before_its_writes_block() -> None:
    """The peer says 256 KiB arrived in 0.1 s (2.6 MB/s) while over 1 MiB more was written:
    the link sets the pace, though no write of this side ever blocked."""
    sender, wire = compressed_pair()
    notes = hex_notes(8, 512 * 1024)  # about 256 KiB each once compressed
    for note in notes[:5]:
        sender.send(note)
    assert sender.level == ZLIB_LEVEL
    sender.arrived(10_000, 50.0)
    sender.arrived(10_000 + REPORT_SPAN, 50.1)
    assert sender.sent - (10_000 + REPORT_SPAN) >= REPORT_BACKLOG
    for note in notes[5:]:
        sender.send(note)
    assert sender.level == ZLIB_SLOW_LINK_LEVEL
    channel = inflating(wire.getvalue())
    assert [channel.receive() for _ in notes] == notes


@pytest.mark.parametrize(("span", "seconds", "behind"), [
    (REPORT_SPAN, 0.05, REPORT_BACKLOG),  # 5.2 MB/s: faster than level 6 could feed it
    (REPORT_SPAN, 0.1, REPORT_BACKLOG // 2),  # slow, but this side writes no faster
    (REPORT_SPAN // 2, 0.1, REPORT_BACKLOG),  # too few bytes between the reports to judge
])
def test_reports_of_a_fast_link_or_a_slow_sender_keep_the_fast_level(
        span: int, seconds: float, behind: int) -> None:
    sender, wire = compressed_pair()
    notes = hex_notes(8, 512 * 1024)
    for note in notes[:5]:
        sender.send(note)
    latest = sender.sent - behind
    sender.arrived(latest - span, 7.0)
    sender.arrived(latest, 7.0 + seconds)
    sender.send(notes[5])
    assert sender.level == ZLIB_LEVEL
    channel = inflating(wire.getvalue())
    assert [channel.receive() for _ in notes[:6]] == notes[:6]


# --- raw texts after a `bodies` line (version 3, `raw_bodies`) ----------------------------------

RAW_TEXTS = [b"# one\n\n\"quoted\" {json} \\ back\n", b"", "d\u00e9j\u00e0 vu \u65e5\u672c\n".encode(),
             b"\n\n\n", b"x" * 300_000]


def raw_reader(data: bytes, *, compressed: bool) -> Channel:
    channel = inflating(data, "client") if compressed else channel_over(data)
    channel.raw_bodies = True  # as a server that announced it sets it
    return channel


def raw_wire(*lines: bytes, compressed: bool) -> bytes:
    """The bytes a client writes: the hello-less stream of `lines`, compressed or not."""
    if not compressed:
        return b"".join(lines)
    sender, wire = compressed_pair()
    for line in lines:
        sender.send_line(line)
    return wire.getvalue()


@pytest.mark.parametrize("compressed", [False, True])
def test_raw_texts_after_a_bodies_line_are_read_exactly(compressed: bool) -> None:
    lines = (encode_raw_texts(RAW_TEXTS), encode_raw_texts(RAW_TEXTS[:1], "notes"),
             encode({"type": "bye"}))
    wire = raw_wire(*lines, compressed=compressed)
    reader = raw_reader(wire, compressed=compressed)
    first = reader.receive()
    assert first == {"type": "bodies", "sizes": [len(t) for t in RAW_TEXTS], "bodies": RAW_TEXTS}
    assert reader.receive() == {"type": "bodies", "source": "notes",
                                "sizes": [len(RAW_TEXTS[0])], "bodies": [RAW_TEXTS[0]]}
    assert reader.receive() == {"type": "bye"}  # the next message starts after the texts
    assert reader.receive() is None
    assert reader.received == len(wire)
    assert reader.received_plain == sum(map(len, lines))


def test_a_channel_that_takes_no_raw_texts_reads_sizes_as_a_plain_field() -> None:
    """Versions 1 and 2 (and a server that did not announce it): `sizes` means nothing."""
    reader = channel_over(encode({"type": "bodies", "sizes": [2]}) + b"{}\n")
    assert reader.receive() == {"type": "bodies", "sizes": [2]}
    with pytest.raises(PeerError) as caught:
        reader.receive()
    assert caught.value.code == "bad-json"


@pytest.mark.parametrize("compressed", [False, True])
def test_raw_texts_that_end_early_name_what_is_missing(compressed: bool) -> None:
    line = encode_raw_texts([b"abcdef", b"ghij"])
    wire = raw_wire(line[:-3], compressed=compressed)  # 3 bytes of the texts never come
    reader = raw_reader(wire, compressed=compressed)
    with pytest.raises(ProtocolError, match="closed the connection 3 bytes short of the 10 bytes"
                       ) as caught:
        reader.receive()
    assert not isinstance(caught.value, PeerError)


@pytest.mark.parametrize("head", [
    {"sizes": "12"}, {"sizes": [-1]}, {"sizes": [1.5]}, {"sizes": [True]}, {"sizes": [None]},
    {"sizes": [MAX_LINE_BYTES + 1]}, {"sizes": [MAX_LINE_BYTES, 1]},
    {"sizes": [2 ** 70, -(2 ** 70)]}, {"sizes": [1], "bodies": ["a"]},
])
@pytest.mark.parametrize("compressed", [False, True])
def test_bad_sizes_are_bad_field_and_nothing_after_the_line_is_read(head: dict,
                                                                      compressed: bool) -> None:
    rest = b"y" * 64
    wire = raw_wire(encode({"type": "bodies", **head}) + rest, compressed=compressed)
    reader = raw_reader(wire, compressed=compressed)
    with pytest.raises(PeerError) as caught:
        reader.receive()
    assert caught.value.code == "bad-field" and "bodies" in str(caught.value)
    assert reader.received_plain == len(encode({"type": "bodies", **head}))


def test_texts_of_exactly_the_limit_are_read() -> None:
    texts = [b"a" * (MAX_LINE_BYTES - 5), b"b" * 5]
    reader = raw_reader(encode_raw_texts(texts) + encode({"type": "bye"}), compressed=False)
    assert reader.receive()["bodies"] == texts
    assert reader.receive() == {"type": "bye"}
