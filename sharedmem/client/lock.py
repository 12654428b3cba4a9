"""The machine's locks: one sync (scheduled, manual or a note's delivery) at a time, one delivery.

Both are OS file locks in the state folder, so the OS drops them when their holder dies and
none go stale. The sync lock records who holds it (pid, start time, what runs), so one who
waits can say what for.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from sharedmem.clock import utc_now
from sharedmem.core import LockError
from sharedmem.files import try_lock

# How long `sync` waits for the lock by default: runs are scheduled every two minutes, and a
# note's delivery holds the lock for seconds; below the interval, so waiting runs never pile up.
DEFAULT_WAIT = 90.0
_POLL = 0.05  # seconds between tries while waiting
_REPORT_EVERY = 15.0  # seconds between "still waiting" messages
_RECORD = 96  # bytes of the holder's record in the lock file
DELIVERY_LOCK = "delivery.lock"  # below the state folder: one note delivery a machine at a time
Waiting = Callable[[str], None]


@contextlib.contextmanager
def sync_lock(state: Path, wait: float = 0.0, waiting: Waiting | None = None,
              purpose: str = "sync") -> Iterator[None]:
    """Hold the machine's sync lock, waiting up to `wait` seconds for its holder to finish.

    While it waits, `waiting` is told who holds it (and again when the holder changes, and every
    15 s); past `wait` it raises LockError naming the holder. `purpose` ("sync", "note
    delivery") is what those who wait for this holder are told.
    """
    state.mkdir(parents=True, exist_ok=True)
    path = state / "sync.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    started = time.monotonic()
    told: tuple[str, float] | None = None  # the holder last described, and when
    try:
        while not try_lock(fd):
            what, who = _holder(fd)
            now = time.monotonic()
            if now - started >= wait:
                waited = f", waited {now - started:.0f} s" if wait > 0 else ""
                raise LockError(f"another sync of this machine is running (the {what} {who}; "
                                f"lock {path}{waited}): wait for it to finish, or run `sync "
                                "--wait SECONDS` to wait longer")
            if waiting is not None and (told is None or told[0] != who
                                        or now - told[1] >= _REPORT_EVERY):
                waiting(f"waiting for the {what} of this machine {who} (lock {path}; "
                        f"{now - started:.0f} s of at most {wait:g} s)")
                told = (who, now)
            time.sleep(min(_POLL, max(0.0, wait - (now - started))))
        # One write of a fixed width over the last holder's record: never seen half-empty.
        record = f"{os.getpid()} {utc_now()} {purpose}".ljust(_RECORD - 1).encode() + b"\n"
        os.pwrite(fd, record, 0)
        os.ftruncate(fd, len(record))
        yield
    finally:
        os.close(fd)


def _holder(fd: int) -> tuple[str, str]:
    """What holds the lock and who: ('sync', 'started at T by pid N'), as its holder recorded.

    An older holder recorded only its pid.
    """
    words = os.pread(fd, _RECORD, 0).decode("ascii", "replace").split(maxsplit=2)
    if len(words) == 3:
        return words[2].strip(), f"started at {words[1]} by pid {words[0]}"
    return "sync", f"run by pid {words[0] if words else '?'}"


@contextlib.contextmanager
def delivery_lock(state: Path) -> Iterator[bool]:
    """Try to hold the machine's note-delivery lock, without waiting: True when held.

    One delivery runs at a time; one that finds the lock held leaves its notes to the holder,
    which looks for notes queued meanwhile once it lets go.
    """
    with delivery_lock_file(state) as fd:
        yield fd is not None


@contextlib.contextmanager
def delivery_lock_file(state: Path, name: str = DELIVERY_LOCK) -> Iterator[int | None]:
    """The lock file's open file while this process holds it; None when another holds it.

    The delivery lock, or another of the same kind (`name`: the MCP server's background sync).
    On POSIX a child given the file (`pass_fds`) holds the lock with it until it ends, after
    this process closed its own: so a delivery or a background sync started holds its lock
    from its first instant, with no moment when neither holds it.
    """
    state.mkdir(parents=True, exist_ok=True)
    fd = os.open(state / name, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        yield fd if try_lock(fd) else None
    finally:
        os.close(fd)


def adopt_lock(state: Path, fd: int) -> contextlib.AbstractContextManager[bool] | None:
    """The delivery lock handed to this process as the open file `fd`, held until the `with` ends.

    None unless `fd` is open on this state folder's delivery lock file and holds its lock (a
    number from the environment is checked, not trusted). The file was inheritable to reach
    this process; it is made not to be, so no child (an `ssh`, a helper) holds the lock on.
    """
    try:
        handed, lock = os.fstat(fd), os.stat(state / DELIVERY_LOCK)
    except OSError:
        return None
    if (handed.st_dev, handed.st_ino) != (lock.st_dev, lock.st_ino):
        return None
    if not try_lock(fd):
        os.close(fd)
        return None
    os.set_inheritable(fd, False)  # handed over once: nothing this process starts holds it
    return _closed_after(fd)


@contextlib.contextmanager
def _closed_after(fd: int) -> Iterator[bool]:
    try:
        yield True
    finally:
        os.close(fd)
