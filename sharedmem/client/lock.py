"""The machine's sync lock: one sync (scheduled, manual or a note's delivery) at a time."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from sharedmem.core import LockError


@contextlib.contextmanager
def sync_lock(state: Path, wait: float = 0.0) -> Iterator[None]:
    """One sync per machine at a time; the OS drops the lock when its holder dies, so none go stale."""
    state.mkdir(parents=True, exist_ok=True)
    path = state / "sync.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + wait
    try:
        while not _try_lock(fd):
            if time.monotonic() >= deadline:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
                raise LockError(f"another sync of this machine is running (pid {holder}, lock "
                                f"{path}); wait for it to finish")
            time.sleep(0.1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)


def _try_lock(fd: int) -> bool:
    if os.name == "nt":  # pragma: no cover - exercised on Windows only
        import msvcrt
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            return True
        except OSError:
            return False
    import fcntl
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
