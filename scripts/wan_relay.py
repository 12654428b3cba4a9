#!/usr/bin/env python3
"""A slow link for ssh's `ProxyCommand`: one-way delay and a bandwidth cap in each direction.

    ssh -o ProxyCommand='python3 wan_relay.py --rtt-ms 40 --mbit 20 --log LOG 127.0.0.1 %p' ...

It connects to HOST:PORT (after one round trip, as a TCP handshake costs) and forwards its stdin
to the socket ("up") and the socket to its stdout ("down"). Each direction is a link of its
own: a chunk read at time t starts on the wire when the chunk before it has left (a token
bucket with no burst), takes len * 8 / rate seconds, and arrives half the round-trip time after
that. Chunks are small (about 2 ms of the link), so delay and bandwidth compose as on a real
link, and a direction holds at most its delay's worth of data plus a 100 ms buffer before it
stops reading, as a router's queue would.

With `--log FILE` (or $WAN_RELAY_LOG) it appends one line per event, with `time.monotonic()`:
`T connect`, `T up N`, `T down N` (bytes read), `T turn` (a round trip: see `Turns`) and
`T close`. `summarize(FILE, start, end)` reads back the bytes each way and the round trips
between two instants, so one log can serve several runs over a reused connection.
Standard library only; a maintainer's tool, not part of the package.
"""

from __future__ import annotations

import argparse
import collections
import os
import select
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

LOG_ENV = "WAN_RELAY_LOG"
SLICE_SECONDS = 0.002  # a chunk is about this much of the link's time
BUFFER_SECONDS = 0.1  # the queue a direction holds beyond what is in flight
MIN_SLICE, MAX_SLICE = 1024, 65536


class Log:
    """Appends event lines to a file shared by every relay of a run (O_APPEND, one write each)."""

    def __init__(self, path: str | None) -> None:
        self.fd = (os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                   if path else None)
        self.lock = threading.Lock()

    def event(self, kind: str, value: int | None = None, at: float | None = None) -> None:
        """One line: monotonic time, kind, and the value if there is one."""
        if self.fd is None:
            return
        when = time.monotonic() if at is None else at
        line = f"{when:.6f} {kind}" + ("" if value is None else f" {value}") + "\n"
        with self.lock:
            os.write(self.fd, line.encode("ascii"))


class Turns:
    """Counts round trips: times the client sent again only after the server answered it.

    The client's data (up) read at t is a turn when, since the client last sent (at `since`):
    the server's data reached the client (was delivered by t); the client stayed silent for at
    least the one-way delay (an answer cannot come sooner); and the server's link stood idle
    for at least half that at some point. A client streaming up while the server's window
    updates come back is not waiting (it never goes quiet), nor is a server streaming back to
    back (a download, with the client's window updates going up); one that answers a request,
    or goes quiet after an upload it took in, is waited for. The client's end of input counts
    as sending: it too comes after the answer it waited for.
    """

    def __init__(self, delay: float, log: Log, now: float) -> None:
        self.silence = max(delay, 0.001)  # the client's, before a turn
        self.threshold = max(delay / 2, 0.001)  # the server link's idle stretch
        self.log = log
        self.lock = threading.Lock()
        self.count = 0
        self.since = now  # when the client last sent
        self.deliveries: collections.deque[float] = collections.deque()  # server data's arrivals
        self.idle = 0.0  # the longest idle stretch of the down link since `since`
        self.down_free = now  # when the down link finished its last chunk

    def down(self, start: float, end: float, delivered: float) -> None:
        """The server's chunk occupies the down link from `start` to `end`."""
        with self.lock:
            self.idle = max(self.idle, start - max(self.down_free, self.since))
            self.down_free = max(self.down_free, end)
            self.deliveries.append(delivered)

    def up(self, now: float) -> None:
        """The client sent data (or closed its end) read at `now`."""
        with self.lock:
            while self.deliveries and self.deliveries[0] <= self.since:
                self.deliveries.popleft()
            answered = bool(self.deliveries) and self.deliveries[0] <= now
            idle = max(self.idle, now - max(self.down_free, self.since))
            if answered and now - self.since >= self.silence and idle >= self.threshold:
                self.count += 1
                self.log.event("turn", at=now)
            self.since, self.idle = now, 0.0


class Direction:
    """One way of the link: a reader that schedules chunks, a writer that delivers them on time."""

    def __init__(self, name: str, read: Callable[[int], bytes], write: Callable[[bytes], None],
                 finish: Callable[[], None], delay: float, rate: float, log: Log,
                 on_chunk: Callable[[float, float, float, float], None]) -> None:
        self.name, self.read, self.write, self.finish = name, read, write, finish
        self.delay, self.rate, self.log, self.on_chunk = delay, rate, log, on_chunk
        self.slice = (MAX_SLICE if rate <= 0 else
                      int(min(MAX_SLICE, max(MIN_SLICE, rate * SLICE_SECONDS))))
        self.limit = (4 * MAX_SLICE if rate <= 0 else
                      int(rate * (delay + BUFFER_SECONDS)) + MAX_SLICE)
        self.queue: collections.deque[tuple[float, bytes | None]] = collections.deque()
        self.queued = 0
        self.cond = threading.Condition()
        self.free_at = 0.0  # when the link is done sending what it was given
        self.done = threading.Event()  # the writer delivered EOF, or its peer is gone
        self.failed = False

    def start(self) -> None:
        """Run the reader and the writer threads."""
        for target in (self._reader, self._writer):
            threading.Thread(target=target, name=f"relay-{self.name}", daemon=True).start()

    def _reader(self) -> None:
        while True:
            try:
                data = self.read(self.slice)
            except OSError:
                data = b""
            now = time.monotonic()
            if not data:
                self.on_chunk(now, now, now, now + self.delay)  # an end is an answer too
                with self.cond:
                    self.queue.append((max(now, self.free_at) + self.delay, None))
                    self.cond.notify_all()
                return
            start = max(now, self.free_at)
            end = start + (len(data) / self.rate if self.rate > 0 else 0.0)
            self.free_at = end
            self.log.event(self.name, len(data), at=now)
            self.on_chunk(now, start, end, end + self.delay)
            with self.cond:
                self.queue.append((end + self.delay, data))
                self.queued += len(data)
                self.cond.notify_all()
                while self.queued > self.limit and not self.done.is_set():
                    self.cond.wait(0.5)
                if self.done.is_set():
                    return

    def _writer(self) -> None:
        while True:
            with self.cond:
                while not self.queue:
                    self.cond.wait()
                due = self.queue[0][0]
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            batch: list[bytes] = []
            eof = False
            with self.cond:
                now = time.monotonic()
                while self.queue and self.queue[0][0] <= now:
                    _, data = self.queue.popleft()
                    if data is None:
                        eof = True
                        break
                    batch.append(data)
            try:
                if batch:
                    self.write(b"".join(batch))
                if eof:
                    self.finish()
            except OSError:
                self.failed = eof = True
            with self.cond:
                self.queued -= sum(map(len, batch))
                self.cond.notify_all()
            if eof:
                with self.cond:
                    self.done.set()
                    self.cond.notify_all()
                return


def _write_all(fd: int) -> Callable[[bytes], None]:
    def write(data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    return write


def relay(host: str, port: int, rtt: float, mbit: float, log_path: str | None,
          stdin: int = 0, stdout: int = 1) -> int:
    """Forward `stdin`/`stdout` to host:port over the simulated link until it ends; exit status."""
    log = Log(log_path)
    delay = rtt / 2
    rate = mbit * 1e6 / 8  # bytes a second; 0 means no cap
    time.sleep(rtt)  # SYN out, SYN-ACK back
    try:
        sock = socket.create_connection((host, port))
    except OSError as exc:
        sys.stderr.write(f"wan_relay: cannot connect to {host}:{port}: {exc}\n")
        return 255
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    log.event("connect")
    turns = Turns(delay, log, time.monotonic())

    def half_close() -> None:
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close_stdout() -> None:
        # Closing the pipe tells the client the link ended; /dev/null takes the descriptor's
        # place, so nothing else later writes to (or closes) a stale descriptor number.
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, stdout)
        os.close(null)

    up = Direction("up", lambda n: os.read(stdin, n), sock.sendall, half_close, delay, rate, log,
                   lambda now, *_: turns.up(now))
    down = Direction("down", sock.recv, _write_all(stdout), close_stdout, delay, rate, log,
                     lambda now, start, end, delivered: turns.down(start, end, delivered))
    up.start()
    down.start()
    # The server's end closing ends the link (the client has nothing left to talk to); the
    # client closing its input half-closes the socket and waits for the server to finish;
    # the client gone altogether (its end of our output closed) ends the link too.
    watch = select.poll()
    watch.register(stdout, select.POLLERR | select.POLLHUP)
    while not down.done.wait(0.1):
        if up.failed or (not down.done.is_set() and watch.poll(0)):
            break
    log.event("close")
    sock.close()
    return 0


def summarize(path: Path | str, start: float = float("-inf"),
              end: float = float("inf")) -> dict[str, Any]:
    """Bytes up and down, round trips (connects plus turns) and connects logged in [start, end]."""
    out = {"up": 0, "down": 0, "round_trips": 0, "connects": 0}
    try:
        lines = Path(path).read_text(encoding="ascii").splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        parts = line.split()
        if len(parts) < 2 or not start <= float(parts[0]) <= end:
            continue
        kind = parts[1]
        if kind in ("up", "down"):
            out[kind] += int(parts[2])
        elif kind == "turn":
            out["round_trips"] += 1
        elif kind == "connect":
            out["connects"] += 1
            out["round_trips"] += 1
    return out


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and relay."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("--rtt-ms", type=float, default=40.0,
                        help="round-trip time: each direction delays by half (default 40)")
    parser.add_argument("--mbit", type=float, default=20.0,
                        help="bandwidth of each direction in Mbit/s; 0: no cap (default 20)")
    parser.add_argument("--log", default=os.environ.get(LOG_ENV),
                        help=f"append events to this file (default ${LOG_ENV})")
    args = parser.parse_args(argv)
    if args.rtt_ms < 0 or args.mbit < 0:
        parser.error("--rtt-ms and --mbit must not be negative")
    return relay(args.host, args.port, args.rtt_ms / 1000, args.mbit, args.log)


if __name__ == "__main__":
    sys.exit(main())
