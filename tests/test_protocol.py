"""The exchange's framing: bounded line reading, message checks, versions, fields, chunks."""

from __future__ import annotations

import io
import json
import random
import time

import pytest
from conftest import compressed_pair, inflating

from sharedmem.core import ProtocolError
from sharedmem.protocol import (
    CHUNK_BYTES,
    MAX_LINE_BYTES,
    MAX_LINE_VALUES,
    Channel,
    PeerError,
    choose_version,
    chunks,
    encode,
    encode_bodies,
    encode_raw_files,
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
    # A guard against a hostile peer, not a speed target: a walk that went back over escapes
    # would take minutes on one such line and hold the session meanwhile.
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


RAW_TEXTS = [b"# one\n\n\"quoted\" {json} \\ back\n", b"", "d\u00e9j\u00e0 vu \u65e5\u672c\n".encode(),
             b"\n\n\n", b"x" * 300_000]


def raw_reader(data: bytes, *, compressed: bool) -> Channel:
    channel = inflating(data, "client") if compressed else channel_over(data)
    channel.take_raw_texts("bodies")  # as a version 3 server does
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


@pytest.mark.parametrize("compressed", [False, True])
def test_raw_texts_after_a_files_line_are_read_exactly_none_for_a_text_held(
        compressed: bool) -> None:
    files = [("machines/a/n/x.md", "1" * 64, RAW_TEXTS[0]), ("machines/a/n/y.md", "2" * 64, None),
             ("machines/a/n/z.md", "3" * 64, RAW_TEXTS[4])]
    wire = raw_wire(encode_raw_files(files), encode({"type": "end"}), compressed=compressed)
    reader = inflating(wire, "server") if compressed else channel_over(wire)
    reader.take_raw_texts("files")  # as a version 3 client does
    got = reader.receive()
    assert got["files"] == [[path, sha] for path, sha, _ in files]
    assert got["sizes"] == [len(RAW_TEXTS[0]), None, len(RAW_TEXTS[4])]
    assert got["texts"] == [RAW_TEXTS[0], None, RAW_TEXTS[4]]
    assert reader.receive() == {"type": "end"}  # the next message starts after the texts


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
