"""scripts/wan_relay.py, the slow link of `bench.py wan`: real sockets on 127.0.0.1, a real child."""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import REPO
from loopback_sshd import SSHD

sys.path.insert(0, str(REPO / "scripts"))
import wan_relay  # noqa: E402

RELAY = REPO / "scripts" / "wan_relay.py"


class Server:
    """A TCP server on 127.0.0.1 that runs `handle(conn, server)` for its one connection."""

    def __init__(self, handle: Callable[[socket.socket, Server], None]) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.handle = handle
        self.received = bytearray()
        self.times: list[float] = []  # when each received piece came
        self.got_eof = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            self.handle(conn, self)

    def recv(self, conn: socket.socket) -> bytes:
        data = conn.recv(65536)
        if data:
            self.received += data
            self.times.append(time.monotonic())
        else:
            self.got_eof.set()
        return data

    def close(self) -> None:
        self.sock.close()


def echo(conn: socket.socket, server: Server) -> None:
    while data := server.recv(conn):
        conn.sendall(data)


def sink(conn: socket.socket, server: Server) -> None:
    while server.recv(conn):
        pass


def start(server: Server, tmp_path: Path, rtt_ms: float, mbit: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-S", str(RELAY), "--rtt-ms", str(rtt_ms),
                             "--mbit", str(mbit), "--log", str(tmp_path / "relay.log"),
                             "127.0.0.1", str(server.port)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    made: list[Server] = []
    yield made
    for server in made:
        server.close()


@pytest.fixture
def relays() -> Iterator[list[subprocess.Popen]]:
    made: list[subprocess.Popen] = []
    yield made
    for proc in made:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None and not stream.closed:
                stream.close()


def relay_to(handle: Callable[[socket.socket, Server], None], tmp_path: Path, servers: list,
             relays: list, rtt_ms: float = 10, mbit: float = 0) -> tuple[Server, subprocess.Popen]:
    server = Server(handle)
    servers.append(server)
    proc = start(server, tmp_path, rtt_ms, mbit)
    relays.append(proc)
    return server, proc


def read_exactly(stream, size: int) -> bytes:
    out = bytearray()
    while len(out) < size:
        data = os.read(stream.fileno(), size - len(out))
        assert data, f"EOF after {len(out)} of {size} bytes"
        out += data
    return bytes(out)


def test_forwards_bytes_exactly_both_ways_and_logs_them(tmp_path, servers, relays):
    server, proc = relay_to(echo, tmp_path, servers, relays)
    payload = random.Random(16).randbytes(700_000)  # every byte value, in no pattern
    writer = threading.Thread(target=lambda: (proc.stdin.write(payload), proc.stdin.close()))
    writer.start()
    back = proc.stdout.read()  # to EOF: the echo server closes once the relay half-closed
    writer.join()
    assert proc.wait(timeout=10) == 0
    assert back == payload and bytes(server.received) == payload
    summary = wan_relay.summarize(tmp_path / "relay.log")
    assert (summary["up"], summary["down"], summary["connects"]) == (len(payload),) * 2 + (1,)


def test_delays_each_direction_by_half_the_round_trip(tmp_path, servers, relays):
    _, proc = relay_to(echo, tmp_path, servers, relays, rtt_ms=120)
    started = time.monotonic()
    proc.stdin.write(b"hello")
    proc.stdin.flush()
    assert read_exactly(proc.stdout, 5) == b"hello"
    assert time.monotonic() - started >= 0.24  # the handshake's round trip, then the echo's
    for _ in range(3):
        sent = time.monotonic()
        proc.stdin.write(b"ping")
        proc.stdin.flush()
        assert read_exactly(proc.stdout, 4) == b"ping"
        assert 0.115 <= time.monotonic() - sent <= 0.25


@pytest.mark.parametrize("way", ["up", "down"])
def test_caps_the_rate_of_each_direction(tmp_path, servers, relays, way):
    size, mbit = 600_000, 16  # 2 MB/s: 0.3 s
    arrivals: list[float] = []

    def source(conn: socket.socket, server: Server) -> None:
        conn.sendall(random.Random(1).randbytes(size))

    server, proc = relay_to(sink if way == "up" else source, tmp_path, servers, relays,
                            rtt_ms=10, mbit=mbit)
    if way == "up":
        proc.stdin.write(random.Random(1).randbytes(size))
        proc.stdin.close()
        server.thread.join(10)
        arrivals, total = server.times, len(server.received)
    else:
        total = 0
        while data := os.read(proc.stdout.fileno(), 65536):
            arrivals.append(time.monotonic())
            total += len(data)
    assert total == size
    assert proc.wait(timeout=10) == 0
    first_slice = mbit * 1e6 / 8 * wan_relay.SLICE_SECONDS
    expected = (size - first_slice) / (mbit * 1e6 / 8)
    took = arrivals[-1] - arrivals[0]
    assert 0.8 * expected <= took <= 1.3 * expected, (took, expected)


def test_ends_when_the_server_closes(tmp_path, servers, relays):
    def goodbye(conn: socket.socket, server: Server) -> None:
        conn.sendall(b"bye")

    _, proc = relay_to(goodbye, tmp_path, servers, relays)
    assert proc.stdout.read() == b"bye"  # then EOF, with our input still open
    assert proc.wait(timeout=5) == 0
    assert proc.stderr.read() == b""


def test_ends_when_the_client_closes(tmp_path, servers, relays):
    held = threading.Event()

    def silent(conn: socket.socket, server: Server) -> None:
        while server.recv(conn):
            pass
        held.wait(10)  # the server keeps its end open and says nothing

    server, proc = relay_to(silent, tmp_path, servers, relays)
    proc.stdin.write(b"last words")
    proc.stdin.close()
    assert server.got_eof.wait(5)  # the client's end of input became the socket's half-close
    assert bytes(server.received) == b"last words"
    assert proc.poll() is None  # half-closed: the server may still answer
    proc.stdout.close()  # the client is gone altogether
    assert proc.wait(timeout=5) == 0
    held.set()
    assert proc.stderr.read() == b""


def test_counts_each_answer_the_client_waited_for_as_a_round_trip(tmp_path, servers, relays):
    def answer(conn: socket.socket, server: Server) -> None:
        while server.recv(conn):
            conn.sendall(b"ok\n")

    _, proc = relay_to(answer, tmp_path, servers, relays, rtt_ms=40)
    for _ in range(5):
        proc.stdin.write(b"request\n")
        proc.stdin.flush()
        assert read_exactly(proc.stdout, 3) == b"ok\n"
    proc.stdin.close()
    assert proc.stdout.read() == b""
    assert proc.wait(timeout=5) == 0
    summary = wan_relay.summarize(tmp_path / "relay.log")
    assert (summary["round_trips"], summary["connects"]) == (6, 1)  # connect + 5 answers


def test_a_stream_with_acknowledgements_going_back_costs_no_round_trip(tmp_path, servers,
                                                                        relays):
    """A download with window updates going up: one round trip for the whole stream."""
    size, step = 400_000, 40_000

    def stream(conn: socket.socket, server: Server) -> None:
        conn.sendall(bytes(size))
        while data := server.recv(conn):
            if data.endswith(b"done"):
                conn.sendall(b"ok")

    _, proc = relay_to(stream, tmp_path, servers, relays, rtt_ms=60, mbit=16)
    for _ in range(size // step):
        read_exactly(proc.stdout, step)
        proc.stdin.write(b"ack")
        proc.stdin.flush()
    proc.stdin.write(b"done")
    proc.stdin.flush()
    assert read_exactly(proc.stdout, 2) == b"ok"
    proc.stdin.close()
    assert proc.stdout.read() == b""
    assert proc.wait(timeout=5) == 0
    # The connect (the stream came with it) and the "ok"; not one per acknowledgement.
    assert wan_relay.summarize(tmp_path / "relay.log")["round_trips"] == 2


def test_a_client_streaming_up_past_the_server_s_updates_costs_no_round_trip(tmp_path,
                                                                            servers, relays):
    """An upload with window updates coming back, then one answer: one round trip for that."""
    size, piece = 100_000, 5_000

    def updates(conn: socket.socket, server: Server) -> None:
        told = 0
        while server.recv(conn):
            while len(server.received) >= told + 20_000:
                told += 20_000
                conn.sendall(b"w")
            if server.received.endswith(b"end"):
                conn.sendall(b"ok")

    _, proc = relay_to(updates, tmp_path, servers, relays, rtt_ms=60)
    for _ in range(size // piece):  # pauses shorter than the one-way delay, not waits
        proc.stdin.write(bytes(piece))
        proc.stdin.flush()
        time.sleep(0.02)
    proc.stdin.write(b"end")
    proc.stdin.flush()
    assert read_exactly(proc.stdout, 7) == b"wwwwwok"
    proc.stdin.close()
    assert proc.stdout.read() == b""
    assert proc.wait(timeout=5) == 0
    assert wan_relay.summarize(tmp_path / "relay.log")["round_trips"] == 2  # connect, "ok"


def test_refuses_a_port_nobody_listens_on(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = subprocess.run([sys.executable, "-S", str(RELAY), "--rtt-ms", "0", "127.0.0.1",
                           str(port)], capture_output=True, text=True, timeout=10)
    assert done.returncode == 255
    assert f"cannot connect to 127.0.0.1:{port}" in done.stderr


@pytest.mark.skipif(shutil.which("rsync") is None or not Path(SSHD).exists()
                    or shutil.which("ssh") is None, reason="needs rsync, ssh and sshd")
def test_bench_wan_runs_every_tool_through_the_relay(tmp_path):
    """`bench.py wan` end to end, on a tiny corpus and a link with no delay or cap."""
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bench.py"), "wan", "--files",
                           "10", "--runs", "1", "--link", "0/0", "--json", "--dir",
                           str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1), done.stderr[-2000:]  # 1: a target missed
    assert "link 0/0: 0 ms RTT, no cap each way (10 files" in done.stdout
    report = json.loads(done.stdout[done.stdout.index("\n{") + 1:])
    rows = {r["phase"]: r for r in report["links"][0]["rows"]}
    assert list(rows) == ["first", "nochange", "changed1pct"]
    for row in rows.values():
        for tool in ("sharedmem", "rsync -a", "rsync -az"):
            assert row[tool]["up"] > 0 and row[tool]["down"] > 0 and row[tool]["seconds"] > 0
            assert row[tool]["round_trips"] >= 1
        assert row["rsync -a"]["connects"] == row["rsync -az"]["connects"] == 1
    # Ours connects once, in the first sync; the later ones ride that connection.
    assert [rows[p]["sharedmem"]["connects"] for p in rows] == [1, 0, 0]
    assert rows["first"]["sharedmem"]["up"] > rows["first"]["sharedmem"]["sent"]  # ssh's share
    assert list(tmp_path.iterdir()) == []  # its work folder is gone
