"""Adding a note: check and redact it, queue it in the outbox, then deliver it.

`add_ad_hoc_note` (MCP) queues the note and starts a delivery detached from it (`sync
--notes-only`), so no tool ever waits on the server; `note` (the CLI) delivers in its own time.
A delivery is the exchange (exchange.py) with nothing published first, so a note never loads
the sync. It holds the sync lock, runs one at a time per machine, and gives up once the server
has not finished within DELIVERY_TIMEOUT seconds: its notes then wait for the next sync. The same
detached start runs the whole `sync` an MCP server starts on a stale cache (`start_sync`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sharedmem.client.config import ClientConfig
from sharedmem.client.exchange import Exchange
from sharedmem.client.lock import Waiting, delivery_lock, delivery_lock_file, sync_lock
from sharedmem.client.outbox import Outbox, QueuedNote
from sharedmem.client.transport import Connection
from sharedmem.core import NoteError, SharedMemoryError, TransportError
from sharedmem.rules import NOTES_DIR

if TYPE_CHECKING:
    import subprocess

DELIVERY_TIMEOUT = 30.0  # seconds a delivery waits on the server, from starting ssh to the pull
NOTE_LOCK_WAIT = 30.0  # seconds `note` waits for a running sync before leaving the note queued
_DETACHED = 0x00000008 | 0x00000200  # Windows: DETACHED_PROCESS | CREATE_NEW_PROCESS_GROUP


def submit_note(config: ClientConfig, filename: str, text: str) -> dict[str, Any]:
    """Queue a note, then deliver it now (`note`); if the server cannot be reached it stays queued."""
    note = _queue(config, filename, text)
    exchange = Exchange(config)
    failure = _deliver(exchange, NOTE_LOCK_WAIT, DELIVERY_TIMEOUT)
    refused = [r for r in exchange.notes["refused"] if r["note_id"] == note.note_id]
    if refused:
        raise NoteError(refused[0]["message"])
    if failure is not None and any(n.note_id == note.note_id for _, n in exchange.outbox.pending()):
        return {"status": "queued", "filename": filename, "note_id": note.note_id,
                "message": f"the server could not be reached ({failure}); the note waits in "
                           "the outbox and the next sync delivers it"}
    result = {"status": "stored", "filename": filename, "note_id": note.note_id,
              "path": f"{NOTES_DIR}/{filename}"}
    if failure is not None:
        result["message"] = f"stored, but the cache was not refreshed ({failure})"
    return result


def queue_note(config: ClientConfig, filename: str, text: str) -> dict[str, Any]:
    """Queue a note and start its delivery in the background (`add_ad_hoc_note`); answers at once."""
    note = _queue(config, filename, text)
    path = f"{NOTES_DIR}/{filename}"
    delivery, why = start_delivery(config)
    later = ("If the server cannot be reached, the note stays queued on this machine and the "
             "next sync delivers it.")
    message = {
        "started": f"Queued; a delivery to the server was started in the background. Once the "
                   f"server has stored the note (usually within seconds) it can be read at "
                   f"{path}. {later}",
        "already running": f"Queued; the delivery (or background sync) already running on this "
                           f"machine takes it too. Once the server has stored the note (usually "
                           f"within seconds) it can be read at {path}. {later}",
        "not started": f"Queued on this machine, but no delivery could be started ({why}): the "
                       f"next sync delivers it, and it can then be read at {path}.",
    }[delivery]
    return {"status": "queued", "filename": filename, "note_id": note.note_id, "path": path,
            "delivery": delivery, "message": message}


def start_delivery(config: ClientConfig) -> tuple[str, str]:
    """Start `sync --notes-only` detached, unless a delivery runs: (what happened, why not)."""
    what, why, _ = start_detached(config, "--notes-only")
    return what, why


def start_sync(config: ClientConfig) -> tuple[str, str, subprocess.Popen[bytes] | None]:
    """Start a whole `sync` detached (the MCP server, on a stale cache), unless one runs.

    The same start as a delivery's, and the same lock: the sync holds the delivery lock until it
    ends (handed over on POSIX), so a second MCP server starts no second one, and a note added
    meanwhile is delivered by it (or, when it has passed that step, by the next sync).
    """
    return start_detached(config, hold=True)


def start_detached(config: ClientConfig, *flags: str, hold: bool = False
                   ) -> tuple[str, str, subprocess.Popen[bytes] | None]:
    """Start `sync FLAGS` detached unless the delivery lock is held: (what, why not, process).

    'already running' when a delivery (which looks for notes queued meanwhile once it is done)
    or a background sync holds the lock. With `hold`, the child is handed the lock.
    """
    import subprocess
    import sys

    from sharedmem.program import LAUNCHER
    with delivery_lock_file(config.state) as fd:
        if fd is None:
            return "already running", "", None
        # `--config=PATH`, one word: so `sync` starts no ssh ahead, which a delivery that finds
        # another one running would only have to stop.
        argv = [sys.executable, str(LAUNCHER), "sync", *flags, f"--config={config.path}"]
        try:
            process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, close_fds=True,
                pass_fds=(fd,) if hold and os.name != "nt" else (),
                creationflags=_DETACHED if os.name == "nt" else 0,
                start_new_session=os.name != "nt")
        except OSError as exc:
            return "not started", f"cannot run {sys.executable}: {exc}", None
    return "started", "", process


def deliver_queued(config: ClientConfig, lock_wait: float, waiting: Waiting | None = None,
                   timeout: float = DELIVERY_TIMEOUT) -> dict[str, Any]:
    """Deliver every queued note and refresh the cache (`sync --notes-only`); one run at a time.

    A run that finds another delivery running leaves the notes to it. Before it ends, a run looks
    again for notes queued while it held the delivery lock (their writers saw it held and
    started none); after a failure it stops, and the next sync delivers what is left.
    """
    report: dict[str, Any] = {"machine": config.machine, "status": "ok",
                              "notes": {"delivered": 0, "refused": []}}
    outbox = Outbox(config.state / "outbox")
    tried: set[str] = set()

    def fresh() -> set[str]:
        return {n.note_id for _, n in outbox.pending()} - tried

    while True:
        with delivery_lock(config.state) as held:
            if not held:
                report["message"] = ("another delivery of this machine is running; it takes "
                                     "the queued notes")
                break
            while new := fresh():
                tried |= new
                exchange = Exchange(config)
                failure = _deliver(exchange, lock_wait, timeout, waiting)
                report["notes"]["delivered"] += exchange.notes["delivered"]
                report["notes"]["refused"] += exchange.notes["refused"]
                if failure is not None:
                    report.update(status="failed", error=str(failure))
                    break
        if report["status"] == "failed" or not fresh():
            break
    if report["status"] == "ok" and report["notes"]["refused"]:
        report["status"] = "partial"
    report["pending"] = len(outbox.pending())
    return report


def wait_for_delivery(config: ClientConfig, seconds: float) -> bool:
    """Wait until no note is queued and no delivery runs (the demo, before it shows the note).

    False if that takes longer than `seconds`: the server is slow or unreachable.
    """
    import time
    outbox = Outbox(config.state / "outbox")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not outbox.pending():
            with delivery_lock(config.state) as free:
                if free:
                    return True
        time.sleep(0.05)
    return False


def _queue(config: ClientConfig, filename: str, text: str) -> QueuedNote:
    """Check, redact and queue a note; refused before anything is written."""
    from sharedmem.redact.redactor import redact_note
    return Outbox(config.state / "outbox").put(filename, redact_note(filename, text)[0])


def _deliver(exchange: Exchange, lock_wait: float, timeout: float,
             waiting: Waiting | None = None) -> SharedMemoryError | None:
    """Deliver the queued notes and pull, under the sync lock; why it failed, or None."""
    config = exchange.config
    try:
        with sync_lock(config.state, lock_wait, waiting, purpose="note delivery"):
            if not exchange.outbox.pending():
                return None  # a sync delivered them while this one waited for the lock
            with Connection(config) as conn, _deadline(conn, timeout):
                conn.hello()
                exchange.deliver_now(conn)
    except SharedMemoryError as exc:
        return exc
    return None


@contextlib.contextmanager
def _deadline(conn: Connection, seconds: float) -> Iterator[None]:
    """Stop the server end once `seconds` have passed, so no read on it waits longer."""
    import threading
    fired = threading.Event()

    def stop() -> None:
        fired.set()
        conn.stop_server()

    timer = threading.Timer(seconds, stop)
    timer.daemon = True
    timer.start()
    try:
        yield
    except SharedMemoryError:
        if not fired.is_set():
            raise
        raise TransportError(f"{conn.where} did not answer within {seconds:g} s (the server or "
                             "the network hangs), so the delivery gave up; notes not yet "
                             "stored wait in the outbox for the next sync") from None
    finally:
        timer.cancel()

