"""Adding a note: check and redact it, queue it in the outbox, then deliver it.

`add_ad_hoc_note` (MCP) queues the note, starts a delivery detached from the MCP server (`sync
--notes-only`, so it goes on when the server stops) and waits, a bounded time (the tool says
how long), until the server has stored the note and the cache shows it (`add_note`); `note`
(the CLI) delivers in its own process (`submit_note`). A delivery is the exchange (exchange.py)
with nothing published first, so a note never loads the sync. One runs at a time per machine:
the delivery lock is handed to the process started from its first instant, and before it ends
it looks again for notes queued meanwhile, so a burst of notes starts one process that
delivers them all. It gives up once the server has not finished within DELIVERY_TIMEOUT
seconds: its notes then wait for the next sync. The MCP server's background `sync` on a stale
cache starts the same way (`start_sync`), under a lock of its own.
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
from sharedmem.client.status import LAST_DELIVERY_FILE, REFUSED_NOTES, REFUSED_SUFFIX
from sharedmem.client.transport import Connection
from sharedmem.core import NoteError, SharedMemoryError, TransportError
from sharedmem.rules import NOTES_DIR

if TYPE_CHECKING:
    import subprocess

DELIVERY_TIMEOUT = 30.0  # seconds a delivery waits on the server, from starting ssh to the pull
NOTE_LOCK_WAIT = 30.0  # seconds `note` waits for a running sync before leaving the note queued
BACKGROUND_LOCK = "background-sync.lock"  # below the state folder: one background sync a machine
HANDED_LOCK = "SHAREDMEM_DELIVERY_LOCK_FD"  # the delivery lock's descriptor, handed to the child
_POLL = 0.05  # seconds between looks at the outbox and the cache while a note is delivered
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


def add_note(config: ClientConfig, filename: str, text: str, wait: float) -> dict[str, Any]:
    """Queue a note, start its delivery detached, and wait until the cache shows it.

    `add_ad_hoc_note`: the answer is `stored` with the path `read` now finds, or, when the server
    has not answered within `wait` seconds (or the delivery failed sooner), `queued` with what
    will deliver it. A note the server refused raises NoteError. Safe on a thread of its own:
    it touches only files and the child it starts.
    """
    import time
    path = f"{NOTES_DIR}/{filename}"
    outbox = Outbox(config.state / "outbox")
    queued_ns = time.time_ns()
    text = _redacted(filename, text)
    shown = _Shown(config, path, text)  # counted before any delivery can take the note
    note = outbox.put(filename, text)
    delivery, why, process = start_detached(config, "--notes-only", hold=True)
    result = {"filename": filename, "note_id": note.note_id, "path": path, "delivery": delivery}
    deadline = time.monotonic() + wait
    stored, failed = False, None
    while True:
        if not stored and not outbox.holds(note.note_id):
            _raise_if_refused(config, note)
            stored = True
        if stored and shown.now():
            return {**result, "status": "stored",
                    "message": f"Stored on the server; read it at {path}."}
        if not stored:
            failed = _failed(config, process, queued_ns)
        if failed is not None or delivery == "not started" or time.monotonic() >= deadline:
            break
        time.sleep(_POLL)
    return {**result, **_waiting(path, wait, delivery, why, stored, failed)}


def _waiting(path: str, wait: float, delivery: str, why: str, stored: bool,
             failed: str | None) -> dict[str, str]:
    """The status and message of a note not yet shown: what will deliver it, where to read it."""
    sync = "the next sync (the schedule's, or `shared_memory.py sync`)"
    if stored:
        return {"status": "stored", "message": f"Stored on the server, but this machine's cache "
                f"did not show it within {wait:g} s: it can be read at {path} after {sync}."}
    if failed is not None:
        return {"status": "queued", "message": f"Queued on this machine: the delivery could not "
                f"reach the server ({failed}). {sync[0].upper()}{sync[1:]} delivers it; it can "
                f"then be read at {path}."}
    if delivery == "not started":
        return {"status": "queued", "message": f"Queued on this machine, but no delivery could "
                f"be started ({why}): {sync} delivers it; it can then be read at {path}."}
    waited = f"the server did not answer within {wait:g} s" if wait > 0 else "not waited for"
    return {"status": "queued", "message": f"Queued: {waited}. The delivery running in the "
            f"background goes on (it gives up on a server that "
            f"has not answered within {DELIVERY_TIMEOUT:g} s); if it cannot deliver the note, "
            f"{sync} does. It can then be read at {path}."}


class _Shown:
    """Whether the cache shows a note: its file holds one more copy of its text than when queued.

    The server renders each entry's text on lines of its own inside a fence (LF line breaks,
    trailing blanks dropped), so one more of those is the note's entry, even in a file that
    already held the same text. The cache's manifest must list the file as it now is too (it
    is written after the files), so `read` finds it with its provenance.
    """

    def __init__(self, config: ClientConfig, path: str, text: str) -> None:
        body = text.replace("\r\n", "\n").replace("\r", "\n").rstrip()
        self.needle = f"\n{body}\n".encode()
        self.cache, self.path = config.cache, path
        data = self._data()
        self.before = 0 if data is None else data.count(self.needle)

    def _data(self) -> bytes | None:
        from sharedmem.cache.layout import CacheFiles
        try:
            with CacheFiles(self.cache) as disk:
                return disk.read(self.path)
        except SharedMemoryError:  # a link or a damaged folder: not shown, the sync repairs it
            return None

    def now(self) -> bool:
        data = self._data()
        if data is None or data.count(self.needle) <= self.before:
            return False
        from sharedmem.cache.cache import Cache
        from sharedmem.hashing import sha256_bytes
        cache = Cache(self.cache)  # this thread's own connection
        try:
            listed = cache.load().files.get(self.path)
        finally:
            cache.store.close()
        return listed is not None and listed.sha256 == sha256_bytes(data)


def _raise_if_refused(config: ClientConfig, note: QueuedNote) -> None:
    """Raise NoteError with the server's reason when it refused this note (kept aside)."""
    import json
    folder = config.state / REFUSED_NOTES
    suffix = f"-{note.note_id}.json"
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            if entry.name.endswith(suffix):
                reason = folder / (entry.name.removesuffix(".json") + REFUSED_SUFFIX)
                try:
                    message = json.loads(reason.read_text(encoding="utf-8"))["message"]
                except (OSError, ValueError, KeyError, TypeError):
                    message = "no reason recorded"
                raise NoteError(f"the server refused the note: {message} (its text is kept in "
                                f"{entry.path})")


def _failed(config: ClientConfig, process: subprocess.Popen[bytes] | None,
            queued_ns: int) -> str | None:
    """Why the delivery this note waits for failed, or None while it may still deliver it.

    The one started for it failed when it ended with an error (its report says why); one that
    was already running, when it reported a failure after the note was queued (it found the
    note queued, then could not deliver).
    """
    if process is None:
        return _failure(config, queued_ns)
    if process.poll() in (None, 0):
        return None
    return _failure(config, queued_ns) or f"the delivery ended with exit status {process.returncode}"


def _failure(config: ClientConfig, since_ns: int) -> str | None:
    """Why the delivery that ended after `since_ns` failed, from its report; None if none did."""
    import json
    try:
        report = json.loads((config.state / LAST_DELIVERY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(report, dict) or report.get("status") != "failed":
        return None
    ended = report.get("finished_ns")
    if not isinstance(ended, int) or ended <= since_ns:
        return None
    return str(report.get("error") or "no reason recorded")


def start_sync(config: ClientConfig) -> tuple[str, str, subprocess.Popen[bytes] | None]:
    """Start a whole `sync` detached (the MCP server, on a stale cache), unless one runs.

    It holds a lock of its own (BACKGROUND_LOCK, handed over on POSIX) until it ends, so a second
    MCP server starts no second one. A note added meanwhile starts its own delivery, which
    waits for this sync's sync lock and then delivers what the sync did not.
    """
    return start_detached(config, hold=True, lock=BACKGROUND_LOCK)


def start_detached(config: ClientConfig, *flags: str, hold: bool = False,
                   lock: str | None = None) -> tuple[str, str, subprocess.Popen[bytes] | None]:
    """Start `sync FLAGS` detached unless its lock is held: (what, why not, process).

    The lock is the delivery lock, or `lock`; 'already running' when another process holds it
    (a delivery looks for notes queued meanwhile before it ends). With `hold`, the child is
    handed the lock (POSIX), so no moment passes with neither holding it.
    """
    import subprocess
    import sys

    from sharedmem.program import LAUNCHER
    with delivery_lock_file(config.state, *([lock] if lock else [])) as fd:
        if fd is None:
            return "already running", "", None
        # `--config=PATH`, one word: so `sync` starts no ssh ahead, which a delivery that finds
        # another one running would only have to stop.
        argv = [sys.executable, str(LAUNCHER), "sync", *flags, f"--config={config.path}"]
        handed = hold and os.name != "nt"
        env = None
        if handed and lock is None:
            env = {**os.environ, HANDED_LOCK: str(fd)}
        try:
            process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, close_fds=True, env=env,
                pass_fds=(fd,) if handed else (),
                creationflags=_DETACHED if os.name == "nt" else 0,
                start_new_session=os.name != "nt")
        except OSError as exc:
            return "not started", f"cannot run {sys.executable}: {exc}", None
    return "started", "", process


def deliver_queued(config: ClientConfig, lock_wait: float, waiting: Waiting | None = None,
                   timeout: float = DELIVERY_TIMEOUT) -> dict[str, Any]:
    """Deliver every queued note and refresh the cache (`sync --notes-only`); one run at a time.

    A run that finds another delivery running leaves the notes to it; one started by `add_note`
    holds the lock from its start (handed over). Before it ends, a run looks again for notes
    queued while it held the delivery lock (their writers saw it held and started none); after
    a failure it stops, and the next sync delivers what is left. Its report is kept in
    LAST_DELIVERY_FILE, where a note waiting on it reads why it failed.
    """
    import time
    report: dict[str, Any] = {"machine": config.machine, "status": "ok",
                              "notes": {"delivered": 0, "refused": []}}
    outbox = Outbox(config.state / "outbox")
    tried: set[str] = set()

    def fresh() -> set[str]:
        return {n.note_id for _, n in outbox.pending()} - tried

    handed = _handed_lock(config)
    while True:
        with handed or delivery_lock(config.state) as held:
            handed = None
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
    _keep_report(config, {**report, "finished_ns": time.time_ns()})
    return report


def _handed_lock(config: ClientConfig) -> contextlib.AbstractContextManager[bool] | None:
    """The delivery lock this process was handed by the one that started it, if it was.

    Trusted only when the descriptor named in HANDED_LOCK is open on this machine's delivery
    lock file and holds its lock; it is taken out of the environment, so nothing this process
    starts sees it.
    """
    from sharedmem.client.lock import adopt_lock
    value = os.environ.pop(HANDED_LOCK, "")
    if not (value.isascii() and value.isdigit()):
        return None
    return adopt_lock(config.state, int(value))


def _keep_report(config: ClientConfig, report: dict[str, Any]) -> None:
    """Keep a delivery's report for the notes waiting on it; a failure to write loses only that."""
    import json

    from sharedmem.clock import utc_now
    from sharedmem.files import atomic_write
    kept = {k: report[k] for k in ("status", "error", "pending", "finished_ns") if k in report}
    with contextlib.suppress(OSError):
        atomic_write(config.state / LAST_DELIVERY_FILE, json.dumps(
            {**kept, "delivered": report["notes"]["delivered"], "finished_at": utc_now()},
            ensure_ascii=False).encode("utf-8"), mode=0o600, durable=False)


def _redacted(filename: str, text: str) -> str:
    """A note checked and redacted; refused (NoteError) before anything is written."""
    from sharedmem.redact.redactor import redact_note
    return redact_note(filename, text)[0]


def _queue(config: ClientConfig, filename: str, text: str) -> QueuedNote:
    """Check, redact and queue a note; refused before anything is written."""
    return Outbox(config.state / "outbox").put(filename, _redacted(filename, text))


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

