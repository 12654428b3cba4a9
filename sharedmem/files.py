"""Safe file writing: writes never seen half-done, and the OS lock of one writer at a time."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

_TEMP_NUMBERS = itertools.count()


def atomic_write(path: Path, data: bytes, mode: int | None = None, *, durable: bool = True) -> None:
    """Write `data` to `path` so readers see the old file or the new one, never a part.

    `durable` also fsyncs the data first; a derived copy (the cache) may skip that cost. The
    temporary name is unique to this process (pid and a counter, created exclusively), which
    spares every sync loading `tempfile` and `random` for it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    while True:
        tmp = path.parent / f".tmp-{os.getpid()}-{next(_TEMP_NUMBERS)}.part"
        try:
            fd = os.open(tmp, flags, 0o600)
            break
        except FileExistsError:  # left by a dead process that had our pid
            continue
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def try_lock(fd: int) -> bool:
    """Take the OS lock of the open file `fd` without waiting: True when this process holds it.

    The OS drops it when its holder dies, so a lock never goes stale.
    """
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
