"""The server's input, read on a thread ahead of the session that parses it.

Over SSH the client's bytes reach `serve` through ssh, sshd and a pipe, and SSH lets only a
window of about 2 MB travel unread. A session that parses, redacts and stores one message
before it reads the next therefore stops the transfer while it works, and waits for it after.
Reading on a thread keeps the window open: the next message travels while this one is
processed. The thread holds at most `window` bytes the session has not taken, so a client that
sends faster than the server works cannot make it hold more.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque

TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading

MIB = 1024 * 1024
WINDOW_BYTES = 16 * MIB
READ_BYTES = MIB
START_BYTES = MIB  # a line longer than this starts the thread: small sessions never need it
PIPE_BYTES = MIB  # asked of the kernel for a pipe, so one read takes more while we work


class ReadAhead:
    """`readline` and `read` over a file descriptor, read ahead by a thread once a line is long."""

    def __init__(self, fd: int, window: int = WINDOW_BYTES, start: int = START_BYTES) -> None:
        self._fd = fd
        self._window = window
        self._start_bytes = start
        self._chunks: deque[bytes] = deque()
        self._buffered = 0  # bytes in `_chunks`
        self._ended = False
        self._failure: OSError | None = None
        self._ready: threading.Condition | None = None  # set when the thread starts
        self._read_whole = 0  # bytes `read1` took before the thread started
        self._arrived = (0, time.monotonic())  # bytes read off the input, and when: `arrival`

    def arrival(self) -> tuple[int, float]:
        """The bytes read off the input so far, and the `time.monotonic()` of the last read.

        Read ahead by the thread, as they came: what the session has parsed may lag behind.
        """
        return self._arrived

    def _count(self, data: bytes) -> bytes:
        if data:
            self._arrived = (self._arrived[0] + len(data), time.monotonic())
        return data

    def _start(self) -> None:
        import threading
        _grow_pipe(self._fd)
        self._ready = threading.Condition()
        threading.Thread(target=self._read, args=(self._ready,), daemon=True,
                         name="sharedmem-read").start()

    def _read(self, ready: threading.Condition) -> None:
        while True:
            with ready:
                while self._buffered >= self._window:
                    ready.wait()
            try:
                data = self._count(os.read(self._fd, READ_BYTES))
            except OSError as exc:
                data, failure = b"", exc
            else:
                failure = None
            with ready:
                if data:
                    self._chunks.append(data)
                    self._buffered += len(data)
                else:
                    self._ended, self._failure = True, failure
                ready.notify_all()
            if not data:
                return

    def _next(self) -> bytes:
        """The next chunk, waiting for it; b"" at the end of input."""
        ready = self._ready
        if ready is None:  # no thread: read here
            return self._take() if self._chunks else self._count(os.read(self._fd, READ_BYTES))
        with ready:
            while not self._chunks and not self._ended:
                ready.wait()
            if not self._chunks:
                if self._failure is not None:
                    raise self._failure
                return b""
            ready.notify_all()  # room in the window again
            return self._take()

    def _take(self) -> bytes:
        data = self._chunks.popleft()
        self._buffered -= len(data)
        return data

    def _unread(self, data: bytes) -> None:
        with self._ready or contextlib.nullcontext():
            self._chunks.appendleft(data)
            self._buffered += len(data)

    def read1(self, size: int) -> bytes:
        """Up to `size` bytes of what has come (a compressed session reads its stream so).

        The thread starts once `start` bytes were taken this way, as it does for a long line.
        """
        if self._ready is None:
            if self._read_whole >= self._start_bytes:
                self._start()
        data = self._next()
        if len(data) > size:
            self._unread(data[size:])
            data = data[:size]
        self._read_whole += len(data)
        return data

    def read(self, size: int) -> bytes:
        """Exactly `size` bytes (the texts after a raw `bodies` line); fewer only at the end.

        The thread starts once `start` bytes were read this way, as it does for a long line.
        """
        return self._gather(size, line=False)

    def readline(self, limit: int) -> bytes:
        """Up to and with the next line break, or `limit` bytes, or what is left: as `io`'s."""
        return self._gather(limit, line=True)

    def _gather(self, size: int, *, line: bool) -> bytes:
        """Chunks up to `size` bytes, ending after the first line break when `line`."""
        parts: list[bytes] = []
        got = 0
        while got < size:
            if self._ready is None and got >= self._start_bytes:
                self._start()
            data = self._next()
            if not data:
                break
            end = data.find(b"\n", 0, size - got) + 1 if line else 0  # 0: no line break
            cut = end or size - got
            if cut < len(data):
                self._unread(data[cut:])
                data = data[:cut]
            parts.append(data)
            got += len(data)
            if end:
                break
        return b"".join(parts)


def _grow_pipe(fd: int) -> None:
    """Ask for a larger pipe buffer where the input is a pipe on Linux; no harm if refused."""
    try:
        import fcntl
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (ImportError, AttributeError, OSError):
        pass
