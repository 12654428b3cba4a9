"""Tail deltas (protocol version 3): a body sent as a stored body it grew from, and what was appended.

A file that only grew since the version the server holds is sent as `[base sha256, tail]`
(`tails`); `Session._on_tails` takes the joined text as a body sent ahead, under its own
sha256. Here is the one read of the store that costs: the base's text, never past the file
limit, and nothing at all for a base the store does not hold (the manifest's `need` then asks
for the whole body).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from sharedmem.server.store import Store


def joined(store: Store, base: str, tail: bytes, limit: int) -> bytes | None:
    """The stored text of `base` with `tail` appended, in UTF-8; None when there is none to join.

    None when the store lacks `base` (never stored, collected, or stored redacted under another
    sha256), or holds it longer than `limit`, the file limit: the joined text would be refused
    anyway, and no base costs more than that to read. A body is stored under the sha256 of
    exactly its text, so the base read is the text the client named.
    """
    row = store.conn.execute("SELECT CAST(body AS BLOB) FROM blobs WHERE sha256=? AND size<=?",
                             (base, limit)).fetchone()
    return None if row is None else bytes(row[0]) + tail
