"""Link-safe file access: open folders and files relative to their parent, never through a link.

Every folder below a root and every file is opened relative to its already-open parent with
O_NOFOLLOW where the platform allows, so a symlink, junction or FIFO swapped in mid-walk is
refused rather than read. Where `dir_fd` is missing (Windows) a handle is a path instead of a file
descriptor, and each step is checked with lstat, refusing symlinks and reparse points.
"""

from __future__ import annotations

import errno
import os
import stat
from operator import attrgetter

from sharedmem.core import SourceError

Handle = int | str  # an open folder: a file descriptor, or a path where dir_fd is unavailable

REPARSE_POINT = getattr(stat, "FILE_ATTRIBUTE_REPARSE_POINT", 0x400)
USE_FD = (
    hasattr(os, "O_NOFOLLOW")
    and hasattr(os, "O_DIRECTORY")
    and os.open in os.supports_dir_fd
    and os.scandir in os.supports_fd
)
_FILE_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_GROWN_CHUNK = 1 << 20
_LINK_ERRNOS = {errno.ELOOP, getattr(errno, "EMLINK", -1), getattr(errno, "EFTYPE", -1)}


class Refused(SourceError):
    """One file or folder cannot be read, for `reason` (a sources skip code); `detail` says why."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def is_link(entry: os.DirEntry) -> bool:
    """True for symlinks, and on Windows for junctions and other reparse points."""
    if entry.is_symlink():
        return True
    if os.name == "nt":
        attrs = getattr(entry.stat(follow_symlinks=False), "st_file_attributes", 0)
        return bool(attrs & REPARSE_POINT)
    return False


def open_root(root: os.PathLike[str] | str) -> Handle:
    """Open the root folder (following a link the user named); an fd or, without dir_fd, a path."""
    if USE_FD:
        return os.open(root, _DIR_FLAGS)
    if not stat.S_ISDIR(os.stat(root).st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(root))
    return str(root)


def open_child_dir(parent: Handle, name: str) -> Handle:
    """Open folder `name` inside `parent`, refusing a link in its place."""
    if isinstance(parent, int):
        return os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=parent)
    path = os.path.join(parent, name)
    if not stat.S_ISDIR(lstat_no_link(path).st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", path)
    return path


def lstat_no_link(path: str) -> os.stat_result:
    """Where dir_fd is missing (Windows): lstat `path`, refusing links and junctions."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or getattr(st, "st_file_attributes", 0) & REPARSE_POINT:
        raise OSError(errno.ELOOP, "is a link", path)
    return st


def close(handle: Handle) -> None:
    """Release a folder handle; a path handle holds nothing to release."""
    if isinstance(handle, int):
        os.close(handle)


def list_dir(handle: Handle) -> list[os.DirEntry]:
    """Entries of a folder, sorted by name so every walk is deterministic."""
    with os.scandir(handle) as it:
        return sorted(it, key=_NAME)


_NAME = attrgetter("name")  # of a DirEntry: no Python call per entry, as a lambda would make


def refusal(exc: OSError, shown: str) -> Refused:
    """Turn an OS error met while opening or reading `shown` into a reason people can act on."""
    if exc.errno in _LINK_ERRNOS:
        return Refused("symlink", f"{shown} is a symbolic link; links are never followed")
    if isinstance(exc, FileNotFoundError):
        return Refused("vanished", f"{shown} disappeared while it was being read; sync again")
    if isinstance(exc, NotADirectoryError):
        return Refused("vanished", f"a folder at or above {shown} was replaced; sync again")
    why = exc.strerror or exc
    return Refused("unreadable", f"{shown} cannot be read ({why}); fix its permissions")


def too_large(shown: str, size: int, max_bytes: int) -> Refused:
    """The refusal for a file of `size` bytes over the per-file limit `max_bytes`."""
    return Refused(
        "too-large",
        f"{shown} is {size} bytes, over the per-file limit of {max_bytes} bytes; "
        "shorten or split it",
    )


def read_text(parent: Handle, name: str, shown: str,
              max_bytes: int) -> tuple[str, os.stat_result]:
    """Read one regular file as UTF-8 without following links or blocking; at most max+1 bytes.

    Raises Refused (reasons: symlink, vanished, unreadable, not-regular, too-large, invalid-utf8).
    """
    text, _, st = read_utf8(parent, name, shown, max_bytes)
    return text, st


def open_file(parent: Handle, name: str) -> int:
    """Open file `name` in `parent` to read, refusing a link (ELOOP) and never blocking on a FIFO."""
    if isinstance(parent, int):
        return os.open(name, _FILE_FLAGS, dir_fd=parent)
    path = os.path.join(parent, name)
    lstat_no_link(path)
    return os.open(path, _FILE_FLAGS)


def read_open(fd: int, shown: str, max_bytes: int) -> tuple[bytes, os.stat_result]:
    """The bytes of the open file `fd`, a regular file of at most `max_bytes`, and its fstat.

    Raises Refused (not-regular, too-large) and OSError; reads at most max+1 bytes.
    """
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or getattr(st, "st_file_attributes", 0) & REPARSE_POINT:
        raise Refused("not-regular", f"{shown} is not a regular file; it is not published")
    if st.st_size > max_bytes:
        raise too_large(shown, st.st_size, max_bytes)
    chunks: list[bytes] = []
    total = 0
    want = min(max_bytes, st.st_size) + 1  # one read, one exact buffer, for a file as stat'ed
    while total <= max_bytes:
        chunk = os.read(fd, want)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        if len(chunk) < want:  # a short read of a regular file: its end
            break
        want = min(max_bytes + 1 - total, _GROWN_CHUNK)  # it grew while read
    if total > max_bytes:
        raise too_large(shown, total, max_bytes)
    return b"".join(chunks), st


def read_utf8(parent: Handle, name: str, shown: str,
              max_bytes: int) -> tuple[str, bytes, os.stat_result]:
    """`read_text`, also returning the bytes read: they are the text's UTF-8, to hash or write."""
    try:
        fd = open_file(parent, name)
    except OSError as exc:
        raise refusal(exc, shown) from None
    try:
        data, st = read_open(fd, shown, max_bytes)
    except OSError as exc:
        raise refusal(exc, shown) from None
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8"), data, st
    except UnicodeDecodeError as exc:
        raise Refused(
            "invalid-utf8",
            f"{shown} is not valid UTF-8 (bad byte at offset {exc.start}); save it as UTF-8",
        ) from None


def read_below(root: os.PathLike[str] | str, relpath: str, shown: str,
               max_bytes: int) -> tuple[str, os.stat_result]:
    """Read the file at slash-separated `relpath` below `root`, opening each folder on the way.

    Raises Refused as read_text does, and OSError when the root or a folder cannot be opened.
    """
    parts = relpath.split("/")
    opened: list[Handle] = []
    try:
        opened.append(open_root(root))
        for part in parts[:-1]:
            opened.append(open_child_dir(opened[-1], part))
        return read_text(opened[-1], parts[-1], shown, max_bytes)
    finally:
        for handle in reversed(opened):
            close(handle)
