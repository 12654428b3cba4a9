"""The cache's files compared with the manifest by their stat.

Before every pull a sync makes sure the manifest is intact and each cached file is what it
records (`Cache.check_files`): SQLite's integrity check, each sha256 checked to be 64
lower-case hex digits, and one `lstat` a file. Only the files whose stat differs are hashed.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator


def differing(root: str, rows: Iterable[tuple[str, int, int | None, str]]) -> Iterator[str]:
    """The paths of `rows` (path, size, mtime_ns, sha256) below `root` not as recorded.

    Gone, unreadable, not a regular file (a link is not followed), or of another size or
    modification time; an unknown time always differs. A row whose sha256 is not 64
    lower-case hex digits raises ValueError naming it: the manifest is damaged.
    """
    base = root + os.sep
    lstat, regular = os.lstat, stat.S_ISREG
    for path, size, mtime, sha in rows:
        if not _hex_sha256(sha):
            raise ValueError(f"the sha256 recorded for {path!r} is not 64 lower-case hex digits")
        try:
            info = lstat(base + path)
        except OSError:
            yield path
            continue
        if info.st_mtime_ns != mtime or info.st_size != size or not regular(info.st_mode):
            yield path


def _hex_sha256(text: object) -> bool:
    """Whether `text` is a sha256 as 64 lower-case hex digits (`bytes.fromhex` checks in C).

    `bytes.fromhex` refuses all but hex digits and the ASCII blanks it skips, which leave
    fewer than 32 bytes.
    """
    if type(text) is not str or len(text) != 64 or text != text.lower():
        return False
    try:
        return len(bytes.fromhex(text)) == 32
    except ValueError:
        return False
