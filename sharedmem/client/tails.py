"""Whether a file read this time only grew from the version the server holds, and where it grew.

Protocol version 3 lets a sync send such a file as the sha256 of the version the server
acknowledged and the bytes appended since (`tails`, docs/PROTOCOL.md "Tail deltas"), so a log
that grows by a line costs the line, not the file. It is only worth it for a file of some size
whose tail is clearly the smaller part: otherwise the whole body goes, as before. The server
joins the two only if it still holds the base; if not, its `need` asks for the whole body, so
nothing depends on this guess.
"""

from __future__ import annotations

from collections.abc import Container

from sharedmem.hashing import sha256_bytes
from sharedmem.protocol import encode_pairs

MIN_BYTES = 1024  # smaller files go whole: a tail saves too little to matter


def grown_from(record: object, data: bytes, acked: Container[str]) -> tuple[str, int] | None:
    """(base sha256, where the tail starts) when `data` only appended to what the server holds.

    `record` is the path's saved record, `[disk size, mtime_ns, sha256, size, redactions]`
    (`source_state`), and `data` the text published now, in UTF-8. The base must be one the
    server acknowledged (`acked`), and the first `size` bytes of `data` must hash to it: then
    the tail starts on a character (both parts are whole UTF-8) and the server can join them.
    """
    if len(data) < MIN_BYTES or type(record) is not list or len(record) != 5:
        return None
    sha, size = record[2], record[3]
    if type(sha) is not str or type(size) is not int or sha not in acked:
        return None
    if not 0 < size < len(data) or (len(data) - size) * 2 >= len(data):
        return None
    if sha256_bytes(data[:size]) != sha:
        return None
    return sha, size


def encode_tails(tails: list[tuple[str, bytes]]) -> bytes:
    """A `tails` message of (base sha256, tail in UTF-8) pairs, built from the bytes as they are."""
    return encode_pairs("tails", tails)
