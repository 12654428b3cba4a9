"""A disk that is full: telling it from other failures, and the error that says what to free."""

from __future__ import annotations

from sharedmem.core import StoreError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path


class DiskFull(StoreError):
    """The disk holding the store (or its backups) is full: the step that needed room wrote nothing.

    The store is as it was before that step; the session answers `disk-full`.
    """


# SQLite's primary result codes for a full disk, an I/O error and a file it cannot open: the
# last two are a full disk too when the disk has (next to) no room left (the -shm index and
# the -wal log are grown by writes that fail as I/O errors, not as SQLITE_FULL).
SQLITE_FULL, SQLITE_IOERR, SQLITE_CANTOPEN = 13, 10, 14
LOW_SPACE_BYTES = 1 << 20


def disk_full(exc: BaseException, where: Path | str) -> bool:
    """Whether `exc`, raised writing at `where` (a file or folder), means its disk is full."""
    if isinstance(exc, OSError):
        import errno
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    code = getattr(exc, "sqlite_errorcode", None)
    if not isinstance(code, int):
        return False
    if code & 0xFF == SQLITE_FULL:
        return True
    return code & 0xFF in (SQLITE_IOERR, SQLITE_CANTOPEN) and free_bytes(where) < LOW_SPACE_BYTES


def free_bytes(where: Path | str) -> int:
    """The bytes this account may still write on the disk holding `where` (large if unknown)."""
    import shutil
    from pathlib import Path
    where = Path(where)
    folder = where if where.is_dir() else where.parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return 1 << 62


def full_error(path: Path | str, exc: BaseException, what: str = "") -> DiskFull:
    """The error for a write at `path` that found its disk full, saying what to free."""
    said = exc.strerror if isinstance(exc, OSError) else str(exc)
    return DiskFull(f"{what or f'store {path}'}: the disk holding {path} is full "
                    f"({_amount(free_bytes(path))} free; {said}), so nothing of this step was "
                    f"written and the store is as it was before it. Disk full: free space on "
                    f"the server's disk holding {path}, then try again")


def _amount(size: int) -> str:
    """A number of bytes as people read it: 0 bytes, 12 KiB, 3.5 MiB, 80.2 GiB."""
    if size < 1 << 10:
        return f"{size} bytes"
    if size < 1 << 20:
        return f"{size >> 10} KiB"
    if size < 1 << 30:
        return f"{size / (1 << 20):.1f} MiB"
    return f"{size / (1 << 30):.1f} GiB"
