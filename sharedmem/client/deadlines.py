"""The deadlines of a client's waits on the server (`timeouts` in client.json), kept by a thread."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from sharedmem.client.config import Timeouts


class Watch:
    """The deadlines of one session, kept by a thread that stops the server end past one.

    The client waits on the server while it reads an answer or writes what the server must
    take (`waiting`); its own work in between counts for neither deadline. Per wait: no byte
    moved either way for `reply_seconds`. Per session: the waits add up to more than
    `session_seconds` and one second for every `session_rate` bytes moved, which a server that
    trickles reaches however steadily it trickles.
    """

    def __init__(self, timeouts: Timeouts, where: str, config: Path, moved: Callable[[], int],
                 stop: Callable[[], None]) -> None:
        """`moved`: bytes moved both ways so far; `stop`: kills the server end."""
        self.timeouts = timeouts
        self.where = where  # the server end, as an error names it
        self.config = config  # the client.json that sets the deadlines
        self._moved = moved
        self._stop_server = stop
        self.reason: str | None = None  # why the session was stopped, once it was
        self._lock = threading.Lock()
        self._waits = 0  # waits going on (a thread each)
        self._since = 0.0  # when the present stretch of waiting began
        self._waited = 0.0  # seconds waited in the stretches before it
        self._what = ""  # what the latest wait waits for
        self._sending = False  # whether that wait is a write
        self._paused = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="sharedmem-watch")
        self._thread.start()

    @contextlib.contextmanager
    def waiting(self, what: str, *, sending: bool = False) -> Iterator[None]:
        """The client waits on the server meanwhile: for `what` (as an error would say it)."""
        with self._lock:
            if self._waits == 0:
                self._since = time.monotonic()
            self._waits += 1
            self._what, self._sending = what, sending
        try:
            yield
        finally:
            with self._lock:
                self._waits -= 1
                if self._waits == 0 and not self._paused:
                    self._waited += time.monotonic() - self._since

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No deadline runs meanwhile: the client pauses on purpose (before it connects again)."""
        with self._lock:
            if self._waits and not self._paused:
                self._waited += time.monotonic() - self._since
            self._paused += 1
        try:
            yield
        finally:
            with self._lock:
                self._paused -= 1
                self._since = time.monotonic()

    def stop(self) -> None:
        """The session is over: no deadline runs any more."""
        self._stop.set()

    def _run(self) -> None:
        limits = self.timeouts
        tick = max(0.02, min(1.0, limits.reply_seconds / 8, limits.session_seconds / 8))
        moved, moved_at = self._moved(), time.monotonic()
        while not self._stop.wait(tick):
            now, now_moved = time.monotonic(), self._moved()
            if now_moved != moved:
                moved, moved_at = now_moved, now
            with self._lock:
                if not self._waits or self._paused:
                    continue
                quiet = now - max(moved_at, self._since)
                waited = self._waited + now - self._since
                what, sending = self._what, self._sending
            allowed = limits.session_seconds + moved / limits.session_rate
            if quiet >= limits.reply_seconds:
                self._expire(self._quiet(quiet, what, sending))
                return
            if waited > allowed:
                self._expire(self._slow(waited, moved, what))
                return

    def _quiet(self, seconds: float, what: str, sending: bool) -> str:
        where = self.where
        if sending:
            said = (f"the server ({where}) took nothing of what this client sent for "
                    f"{seconds:.0f} s (it was sending {what})")
        else:
            said = (f"the server ({where}) sent nothing for {seconds:.0f} s while this client "
                    f"waited for {what}")
        return (f"{said}, past `timeouts.reply_seconds` ({self.timeouts.reply_seconds:g} s) in "
                f"{self.config}: {_STOPPED}")

    def _slow(self, seconds: float, moved: int, what: str) -> str:
        limits = self.timeouts
        return (f"the server ({self.where}) answers too slowly: this client waited on it "
                f"{seconds:.0f} s in all (the last time for {what}) while {moved} bytes moved, "
                f"past `timeouts.session_seconds` ({limits.session_seconds:g} s) and one second "
                f"for every `timeouts.session_rate` ({limits.session_rate}) bytes in "
                f"{self.config}: {_STOPPED}")

    def _expire(self, reason: str) -> None:
        self.reason = reason
        self._stop_server()


_STOPPED = ("this client stopped the session, and what it had not finished waits for the next "
            "sync. The server or the network hangs, or a peer that is not a sharedmem server "
            "answers; docs/CONFIGURATION.md \"Timeouts\" says how to set these deadlines")
