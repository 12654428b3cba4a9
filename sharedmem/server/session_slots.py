"""How many `serve` sessions run on one store at once: each holds a slot, taken before it opens it.

A session's memory (the interpreter, SQLite's page cache, the lines it reads) is what a burst of
clients multiplies, so the server bounds the sessions rather than the clients: at most `count`
(`serve --limit sessions=N`) hold a slot, and one that finds none free waits, at most
WAIT_SECONDS, then is told to come back (`Busy`). A slot is an OS lock on a small file in the
folder `STORE-sessions/` beside the store (`flock`, or a byte lock on Windows): the OS drops it
when its process ends, so a killed session never keeps one.
"""

from __future__ import annotations

import os
import random
import time

from sharedmem.core import SharedMemoryError

WAIT_SECONDS = 10.0  # a session over the limit waits this long for a slot, then is turned away
POLL_SECONDS = (0.05, 0.25)  # between looks at the slots, at random in this range


class Busy(SharedMemoryError):
    """Every slot stayed taken while this session waited: the session answers `busy`."""


class Slot:
    """One session's slot, held until `release` (or its process ends)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def release(self) -> None:
        """Give the slot back; closing the file drops its lock."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def folder(store: object) -> str:
    """The folder of a store's slot files."""
    return f"{store}-sessions"


def take(store: object, count: int, wait: float | None = None) -> Slot:
    """A free slot of the store's `count`, waiting up to `wait` seconds (WAIT_SECONDS) for one.

    Busy when none came free meanwhile. The slots are tried from a random one, so sessions that
    wait together do not all try the same file first.
    """
    wait = WAIT_SECONDS if wait is None else wait
    where = folder(store)
    os.makedirs(where, mode=0o700, exist_ok=True)
    deadline = time.monotonic() + wait
    first = random.randrange(count)
    while True:
        for i in range(count):
            fd = os.open(os.path.join(where, str((first + i) % count)),
                         os.O_RDWR | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o600)
            if _lock(fd):
                return Slot(fd)
            os.close(fd)
        if time.monotonic() >= deadline:
            raise Busy(f"the server is busy: {count} sessions already run on store {store}, the "
                       f"most it takes at once (serve --limit sessions={count}), and none ended "
                       f"in the {wait:.0f} s this one waited. Nothing was done; try again in a "
                       "minute (the scheduled sync will)")
        time.sleep(random.uniform(*POLL_SECONDS))


def _lock(fd: int) -> bool:
    """Lock the file of `fd` for this open file alone, without waiting; False if it is held."""
    try:
        import fcntl
    except ImportError:  # Windows: a lock on the file's first byte, held by this handle
        import msvcrt
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
