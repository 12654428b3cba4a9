"""A manifest's entries and content addresses as the session takes them, each checked once."""

from __future__ import annotations

import re

from sharedmem.protocol import AHEAD_REFS, PeerError
from sharedmem.server.body_pool import NO_REF, REF_BYTES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def mtime_ns(value: object) -> int:
    """An entry's mtime_ns: a non-negative integer, 0 when absent."""
    if type(value) is int and 0 <= value < 2**63:  # `type(x) is int` refuses True and False
        return value
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
        raise PeerError("bad-field", "mtime_ns must be a non-negative integer")
    return value


def parse_entries(raw: list[Any], refs: bytearray | None) -> list[tuple[str, str, int, int]]:
    """Manifest entries as (path, sha256, size, mtime_ns); `refs`: version 3's texts sent ahead.

    One pass, with no call for the usual values: a first sync lists thousands of entries.
    """
    out: list[tuple[str, str, int, int]] = []
    append = out.append
    hexed, count = "", 0  # `refs` in hex, made at the first entry that names a text by place
    for item in raw:  # `type(x) is int` refuses True and False too
        if (type(item) is not list or len(item) != 4 or type(item[0]) is not str
                or type(item[2]) is not int):
            raise PeerError("bad-field", "manifest entries must be [path, sha256, size, mtime_ns]")
        path, sha, size, when = item
        if type(sha) is int and refs is not None:
            if not hexed:
                hexed, count = refs.hex(), len(refs) // REF_BYTES
            place = sha
            sha = hexed[place * 64:place * 64 + 64] if 0 <= place < count else _NO_REF_HEX
            if sha == _NO_REF_HEX:
                raise _unnamed(place, count, path)
        elif type(sha) is not str or len(sha) != 64:
            raise PeerError("bad-field", "manifest entries must be [path, sha256, size, mtime_ns]"
                            + (" (in version 3 the sha256 may be the place of a text sent ahead)"
                               if refs is not None else ""))
        if type(when) is not int or not 0 <= when < 2**63:
            when = mtime_ns(when)
        append((path, sha, size, when))
    if not _HEX.fullmatch("".join(e[1] for e in out)):  # one match for all: each is 64 long
        raise PeerError("bad-field", "manifest entries must be [path, sha256, size, mtime_ns] "
                        "with sha256 in 64 lower-case hex digits")
    return out


_HEX = re.compile("[0-9a-f]*")
_NO_REF_HEX = NO_REF.hex()


def _unnamed(place: int, count: int, path: object) -> PeerError:
    """Why a manifest entry cannot name its body as the text sent ahead at `place`."""
    return PeerError("bad-field", f"manifest entry {path!r} names text {place} sent ahead, "
                     f"but this session took {count} texts ahead that it can name (the first "
                     f"{AHEAD_REFS}, in UTF-8): give that file's sha256 instead")


def address(value: str, what: str) -> str:
    """A sha256 or digest field, which must be 64 lower-case hex digits."""
    if len(value) != 64 or not _HEX.fullmatch(value):
        raise PeerError("bad-field", f"{what} must be a sha256 in 64 lower-case hex digits")
    return value
