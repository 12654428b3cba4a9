"""zlib stream compression (protocol version 3) through a real Channel: every message carried,
zip bombs refused uninflated, streams one after another, and when a link counts as slow."""

from __future__ import annotations

import io
import os
import threading
import time
import tracemalloc
import zlib

import pytest
from conftest import compressed_pair, inflating, run_with_timeout

from sharedmem.compression import REPORT_BACKLOG, REPORT_SPAN, ZLIB_LEVEL, ZLIB_SLOW_LINK_LEVEL
from sharedmem.protocol import MAX_LINE_BYTES, MAX_LINE_VALUES, Channel, PeerError, encode, encode_bodies


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


# --- raw texts after a `bodies` line (version 3) ------------------------------------------------
