"""How many `serve` sessions run on one store at once, and how many wait: a slot each.

At most `count` (`serve --limit sessions=N`) run and as many wait, at most WAIT_SECONDS; one
that finds no slot is told to come back (`Busy`). A slot is an OS lock on a file in
`STORE-sessions/` (`flock`, or a byte lock on Windows), which dies with its process.
Why: docs/ARCHITECTURE.md "Sessions on one store".
"""

from __future__ import annotations

import os
import time

from sharedmem.core import SharedMemoryError

WAIT_SECONDS = 10.0  # a session over the limit waits this long for a slot, then is turned away
POLL_SECONDS = (0.05, 0.25)  # between looks at the slots, spread over this range by pid


class Busy(SharedMemoryError):
    """No slot came free for this session: it answers `busy`."""


class Slot:
    """One session's run slot, held until `release` (or its process ends)."""

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
    """A run slot of the store's `count`, waiting up to `wait` seconds (WAIT_SECONDS) for one.

    Busy at once when every run slot and every wait slot is taken, and when no run slot came
    free within the wait. The slots are tried in order, so sessions one after another use the
    same file; waiting ones look again after a pause of their own (by pid), so they do not all
    look at the same moment. (`random` is not loaded: milliseconds of every session's start.)
    """
    wait = WAIT_SECONDS if wait is None else wait
    where = folder(store)
    os.makedirs(where, mode=0o700, exist_ok=True)
    slot = _free(where, "", count)
    if slot is not None:
        return slot
    waiting = _free(where, "wait-", count) if wait > 0 else None
    if waiting is None:
        raise Busy(_busy(store, count, f"and {count} more already wait for one"))
    try:
        low, high = POLL_SECONDS
        pause = low + (high - low) * (os.getpid() % 97) / 96
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            slot = _free(where, "", count)
            if slot is not None:
                return slot
    finally:
        waiting.release()
    raise Busy(_busy(store, count, f"and none ended in the {wait:.0f} s this one waited"))


def _busy(store: object, count: int, why: str) -> str:
    return (f"the server is busy: {count} sessions already run on store {store}, the most it "
            f"takes at once (serve --limit sessions={count}), {why}. Nothing was done; try "
            "again in a minute (the scheduled sync will)")


def _free(where: str, prefix: str, count: int) -> Slot | None:
    """One of the `count` slot files named `prefix` + a number, locked for this process."""
    for i in range(count):
        fd = os.open(os.path.join(where, f"{prefix}{i}"),
                     os.O_RDWR | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o600)
        if _lock(fd):
            return Slot(fd)
        os.close(fd)
    return None


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
