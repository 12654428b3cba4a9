"""Adding a note: check and redact it, queue it in the outbox, then try to deliver it at once.

Delivery is the exchange (exchange.py) with nothing published first, so a note never loads
the sync.
"""

from __future__ import annotations

from typing import Any

from sharedmem.client.config import ClientConfig
from sharedmem.client.exchange import Exchange
from sharedmem.client.lock import sync_lock
from sharedmem.client.outbox import Outbox
from sharedmem.client.transport import Connection
from sharedmem.core import NoteError, SharedMemoryError


def submit_note(config: ClientConfig, filename: str, text: str) -> dict[str, Any]:
    """Queue a note, then try to deliver it now; if the server is unreachable it stays queued."""
    from sharedmem.redact.redactor import redact_note
    body = redact_note(filename, text)[0]  # refused before anything is written
    outbox = Outbox(config.state / "outbox")
    note = outbox.put(filename, body)
    exchange = Exchange(config)
    failure = None
    try:
        with sync_lock(config.state, wait=30), Connection(config) as conn:
            conn.hello()
            exchange.deliver_now(conn)
    except SharedMemoryError as exc:
        failure = exc
    refused = [r for r in exchange.notes["refused"] if r["note_id"] == note.note_id]
    if refused:
        raise NoteError(refused[0]["message"])
    if failure is not None and any(n.note_id == note.note_id for _, n in outbox.pending()):
        return {"status": "queued", "filename": filename, "note_id": note.note_id,
                "message": f"the server could not be reached ({failure}); the note waits in "
                           "the outbox and the next sync delivers it"}
    result = {"status": "stored", "filename": filename, "note_id": note.note_id,
              "path": f"extensions/ad_hoc/notes/{filename}"}
    if failure is not None:
        result["message"] = f"stored, but the cache was not refreshed ({failure})"
    return result
