"""The server's read-ahead input: the same lines as `io`'s readline, and never more held than asked."""

from __future__ import annotations

import io
import os
import random
import threading
import time
from collections.abc import Iterator

import pytest

from sharedmem.server.input_reader import ReadAhead


class Pipe:
    """Both ends of a pipe, each closed once (a second close could hit a reused number)."""

    def __init__(self) -> None:
        self.read_end, self.write_end = os.pipe()
        self.open = {self.read_end, self.write_end}
        self.lock = threading.Lock()

    def close(self, fd: int) -> None:
        with self.lock:
            if fd in self.open:
                self.open.discard(fd)
                os.close(fd)


@pytest.fixture
def pipe() -> Iterator[Pipe]:
    made = Pipe()
    yield made
    for fd in (made.read_end, made.write_end):
        made.close(fd)


def feed(pipe: Pipe, data: bytes, piece: int) -> threading.Thread:
    """Write `data` in pieces on a thread, then close: a peer that sends as it goes."""
    def run() -> None:
        for at in range(0, len(data), piece):
            os.write(pipe.write_end, data[at:at + piece])
        pipe.close(pipe.write_end)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def sample(seed: int) -> bytes:
    """Lines short and long (some past the thread's start), the last without its line break."""
    rng = random.Random(seed)
    lines = [bytes(rng.choice(b"abc \xc3\xa9{}") for _ in range(rng.choice((0, 5, 300, 70_000))))
             for _ in range(40)]
    lines.append(b"x" * 3_000_000)
    return b"\n".join(lines) + b"\ntail without a break"


@pytest.mark.parametrize("seed", range(4))
def test_lines_and_limits_are_those_of_io(pipe: Pipe, seed: int) -> None:
    data = sample(seed)
    rng = random.Random(seed)
    limits = [rng.choice((1, 7, 4096, 65_537, 2_000_000, 10_000_000)) for _ in range(400)]
    expected = io.BufferedReader(io.BytesIO(data))  # type: ignore[arg-type]
    writer = feed(pipe, data, rng.choice((1000, 65_536, 1 << 20)))
    reader = ReadAhead(pipe.read_end, window=256 * 1024, start=100_000)
    got, want = [], []
    for limit in limits:
        got.append(reader.readline(limit))
        want.append(expected.readline(limit))
    writer.join()
    assert got == want
    assert b"".join(got) == data  # every byte, once, in order
    assert reader.readline(100) == b"" and reader.readline(100) == b""  # the end, and again


def test_a_small_session_starts_no_thread(pipe: Pipe) -> None:
    os.write(pipe.write_end, b'{"type":"hello"}\n{"type":"bye"}\n')
    pipe.close(pipe.write_end)
    before = threading.active_count()
    reader = ReadAhead(pipe.read_end)
    assert reader.readline(1000) == b'{"type":"hello"}\n'
    assert reader.readline(1000) == b'{"type":"bye"}\n'
    assert reader.readline(1000) == b""
    assert threading.active_count() == before


def test_the_thread_holds_at_most_its_window(pipe: Pipe) -> None:
    """A client that sends faster than the server works cannot make it hold more."""
    sent = [0]
    stop = threading.Event()

    def flood() -> None:
        piece = b"y" * 65_536
        while not stop.is_set():
            sent[0] += os.write(pipe.write_end, piece)
        pipe.close(pipe.write_end)
    reader = ReadAhead(pipe.read_end, window=1024 * 1024, start=0)  # a thread at once
    writer = threading.Thread(target=flood, daemon=True)
    writer.start()
    assert len(reader.readline(10)) == 10  # starts the thread; then nobody reads for a while
    held, still, deadline = -1, 0, time.monotonic() + 10
    while still < 3 and time.monotonic() < deadline:  # until the flood has stalled
        time.sleep(0.1)
        still, held = (still + 1, held) if sent[0] == held else (0, sent[0])
    stop.set()
    while reader.readline(1 << 20):  # drain, so the flood ends and the thread sees the end
        pass
    writer.join()
    # the window, one read past it, and what the pipe itself holds (1 MiB where it grew)
    assert 1024 * 1024 <= held <= 3 * 1024 * 1024 + 65_536


@pytest.mark.parametrize("start", [0, 1 << 20])  # with the thread and without
def test_a_limit_that_ends_just_before_or_at_a_line_break(pipe: Pipe, start: int) -> None:
    os.write(pipe.write_end, b"ab\ncd\nef")
    pipe.close(pipe.write_end)
    reader = ReadAhead(pipe.read_end, start=start)
    assert [reader.readline(n) for n in (2, 1, 3, 1, 5, 5)] == [
        b"ab", b"\n", b"cd\n", b"e", b"f", b""]


def test_read1_after_a_line_gives_the_rest_in_order_and_starts_the_thread(pipe: Pipe) -> None:
    """A compressed session reads its hello as a line, then the zlib stream in chunks."""
    data = b'{"type":"hello"}\n' + bytes(random.Random(5).randbytes(3_000_000))
    writer = feed(pipe, data, 65_536)
    reader = ReadAhead(pipe.read_end, window=256 * 1024, start=100_000)
    assert reader.readline(1000) == b'{"type":"hello"}\n'
    parts = []
    while chunk := reader.read1(50_000):
        assert len(chunk) <= 50_000
        parts.append(chunk)
    writer.join()
    assert b'{"type":"hello"}\n' + b"".join(parts) == data
    assert reader._ready is not None  # past `start` bytes, the rest was read ahead
    assert reader.read1(10) == b""


@pytest.mark.parametrize("seed", range(3))
def test_exact_reads_between_lines_are_those_of_io(pipe: Pipe, seed: int) -> None:
    """The texts after a raw `bodies` line: exactly the size asked, across chunks and the thread."""
    data = sample(seed)
    rng = random.Random(seed)
    expected = io.BufferedReader(io.BytesIO(data))  # type: ignore[arg-type]
    writer = feed(pipe, data, rng.choice((1000, 65_536, 1 << 20)))
    reader = ReadAhead(pipe.read_end, window=256 * 1024, start=100_000)
    got, want = [], []
    for _ in range(300):
        if rng.random() < 0.5:
            got.append(reader.readline(1 << 20))
            want.append(expected.readline(1 << 20))
        else:
            size = rng.choice((0, 1, 5, 70_000, 1_500_000))
            got.append(reader.read(size))
            want.append(expected.read(size))
    got.append(reader.read(len(data)))  # past the end: what is left, and no more
    want.append(expected.read(len(data)))
    writer.join()
    assert got == want
    assert b"".join(got) == data
    assert reader._ready is not None  # long reads started the thread
    assert reader.read(10) == b""


def test_arrival_counts_what_was_read_off_the_input_before_the_session_takes_it(
        pipe: Pipe) -> None:
    """The thread reads ahead: the count and its time are the input's, not the session's."""
    data = b'{"type":"hello"}\n' + bytes(random.Random(7).randbytes(600_000))
    before = time.monotonic()
    writer = feed(pipe, data, 65_536)
    reader = ReadAhead(pipe.read_end, window=4 * 1024 * 1024, start=100_000)
    assert reader.arrival()[0] == 0
    assert reader.readline(1000) == b'{"type":"hello"}\n'
    assert 0 < reader.arrival()[0] <= len(data)
    taken = 0
    while reader._ready is None:  # past `start` bytes taken, the thread reads the rest
        taken += len(reader.read1(50_000))
    writer.join(timeout=10)
    deadline = time.monotonic() + 10
    while reader.arrival()[0] < len(data) and time.monotonic() < deadline:
        time.sleep(0.01)
    wire, at = reader.arrival()
    assert wire == len(data) > 17 + taken  # all of it came, more than was taken
    assert before <= at <= time.monotonic()
