"""What a client's cache holds, how old it is, the last sync attempt, and the notes waiting.

`freshness` is what the MCP server tells an agent at `initialize` and in `list`: it reads three
small things (the cache's `synced.json`, `state/last-sync.json`, the names in the outbox) with
`os` and the C JSON of fastjson.py only, so the server's start stays small. `status` (the
command) is the whole picture.
"""

from __future__ import annotations

import os
import stat
import time

from sharedmem.clock import SYNC_INTERVAL_SECONDS, age_text, parse_utc
from sharedmem.core import JSONError
from sharedmem.fastjson import loads

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from sharedmem.client.config import ClientConfig

STALE_PERIODS = 3  # a cache older than this many schedule periods is stale: a sync has been missed
SYNCED_FILE = (".sharedmem", "synced.json")  # below the cache: cache.SYNCED_NAME
LAST_ATTEMPT_FILE = "last-sync.json"  # below the state folder, written by every sync
LAST_DELIVERY_FILE = "last-delivery.json"  # below the state folder: the last note delivery's report
OUTBOX = "outbox"  # below the state folder: outbox.Outbox, one `.json` file a note
REFUSED_NOTES = "refused-notes"  # below the state folder: each refused note's outbox file...
REFUSED_SUFFIX = ".reason"  # ...and beside it (`.json` -> `.reason`) the server's reason, as JSON
REFUSED_SHOWN = 5  # refused notes `status` names one by one; the rest are counted
CLOCK_SLACK = 60  # seconds a last sync may lie ahead of now (clocks stepped by NTP) and count as now
_SMALL = 1 << 20  # a bookkeeping file larger than this is damaged: read as nothing
_ERROR_CHARS = 300  # of a failed attempt's error, in the one-line summary


def status(config: ClientConfig) -> dict[str, Any]:
    """What the cache holds, how old it is, and what waits in the outbox."""
    from sharedmem.cache.cache import Cache
    from sharedmem.client.outbox import Outbox
    cache = Cache(config.cache)
    manifest = cache.load(verify=True)  # a damaged store is named, as doctor reports it
    last = _read_json(os.path.join(config.state, LAST_ATTEMPT_FILE), follow=True)
    synced = _when(manifest.last_sync)
    age = None if synced is None or _future(synced) else max(0, int(time.time() - synced))
    counts = cache.counts()
    return {
        "machine": config.machine,
        "cache": str(config.cache),
        "damage": cache.damage,
        "last_sync": manifest.last_sync,
        "age_seconds": age,
        "age": None if age is None else age_text(age),
        **({"last_sync_in_future": True} if synced is not None and _future(synced) else {}),
        "last_attempt": last,
        "pending_notes": [n.filename for _, n in Outbox(config.state / OUTBOX).pending()],
        **refused_notes(str(config.state)),
        "namespaces": [
            {"key": k, "machine": ns.machine, "source": ns.source, "kind": ns.kind,
             "files": counts.get(k, 0), "synced_at": ns.synced_at}
            for k, ns in sorted(manifest.namespaces.items())],
    }


def refused_notes(state: str) -> dict[str, Any]:
    """How many notes the server refused (kept in `state/refused-notes/`) and the newest few.

    Each with the filename, note_id, message and refused_at the client stored beside it; a note
    kept by an older version, without one, is named by its file and an unknown reason.
    """
    folder = os.path.join(state, REFUSED_NOTES)
    try:
        with os.scandir(folder) as entries:
            names = sorted((e.name for e in entries if e.name.endswith(".json")
                            and not e.name.startswith(".")), reverse=True)
    except OSError:
        names = []
    shown = []
    for name in names[:REFUSED_SHOWN]:
        why = _read_json(os.path.join(folder, name.removesuffix(".json") + REFUSED_SUFFIX))
        note = why or _read_json(os.path.join(folder, name))
        shown.append({"file": os.path.join(folder, name),
                      "filename": str(note.get("filename") or name),
                      "note_id": note.get("note_id"),
                      "message": str(why.get("message") or "no reason recorded (kept by an "
                                     "older version)"),
                      "refused_at": why.get("refused_at")})
    return {"refused_notes_total": len(names), "refused_notes": shown}


def config_paths(config_path: str) -> tuple[str, str] | None:
    """The cache and state folders `client.json` names, read cheaply; None if it cannot say.

    The same paths as `config.load` gives (relative to the file's folder, a leading `~` for
    HOME, the state folder `state` beside the file by default), without validating the rest:
    a broken configuration is reported by the first tool call.
    """
    raw = _read_json(os.path.expanduser(config_path), follow=True)
    base = os.path.dirname(os.path.expanduser(config_path))
    cache, state = raw.get("cache"), raw.get("state", os.path.join(base, "state"))
    if not (isinstance(cache, str) and cache and isinstance(state, str) and state):
        return None
    return os.path.join(base, _home(cache)), os.path.join(base, _home(state))


def _home(value: str) -> str:
    """A leading `~` as config.expand reads it: HOME, else the user's home."""
    if value == "~" or value.startswith("~/"):
        return (os.environ.get("HOME") or os.path.expanduser("~")) + value[1:]
    return value


def freshness(cache: str, state: str, now: float | None = None) -> dict[str, Any]:
    """When the cache last synced and its age, the last attempt, and how many notes wait.

    `last_sync` is the last pull written into the cache; `last_attempt` the last whole sync's
    outcome (status, error, finished_at), None before the first; `pending_notes` the notes in
    the outbox. Nothing here fails: what cannot be read is reported as unknown. A last sync
    later than now (past CLOCK_SLACK: a clock set back, a damaged record) has no age and is
    marked `last_sync_in_future`: it is stale, not fresh.
    """
    now = time.time() if now is None else now
    last_sync = _read_json(os.path.join(cache, *SYNCED_FILE)).get("last_sync")
    synced = _when(last_sync)
    raw = _read_json(os.path.join(state, LAST_ATTEMPT_FILE), follow=True)
    attempt = {k: raw[k] for k in ("status", "error", "finished_at") if isinstance(raw.get(k), str)}
    future = synced is not None and _future(synced, now)
    age = None if synced is None or future else max(0, int(now - synced))
    fresh = {"last_sync": last_sync if synced is not None else None, "age_seconds": age,
             "age": None if age is None else age_text(age),
             "last_attempt": attempt if attempt.get("status") else None,
             "pending_notes": _count_notes(os.path.join(state, OUTBOX))}
    if future:
        fresh["last_sync_in_future"] = True
    return fresh


def stale_reason(fresh: dict[str, Any], now: float | None = None) -> str | None:
    """Why a sync should start now ('the cache was 2h 5m old'), or None.

    Stale is older than STALE_PERIODS runs of the schedule (a laptop that slept, a schedule
    that stopped), or synced at a time in the future, which no age can be told from. Never for
    a cache no sync has completed into (the installer's first sync, or a person's, is what sets
    a client up), nor when a sync finished within the last period (the schedule is trying: the
    server is likely unreachable, and another try would only fail too).
    """
    age = fresh.get("age_seconds")
    future = fresh.get("last_sync_in_future")
    if not future and (age is None or age <= STALE_PERIODS * SYNC_INTERVAL_SECONDS):
        return None
    now = time.time() if now is None else now
    tried = _when((fresh.get("last_attempt") or {}).get("finished_at"))
    if tried is not None and 0 <= now - tried < SYNC_INTERVAL_SECONDS:
        return None
    if future:
        return (f"the cache's last sync time ({fresh['last_sync']}) is in the future, so its "
                "age is unknown")
    return f"the cache was {fresh['age']} old"


def describe(fresh: dict[str, Any]) -> str:
    """The freshness as sentences an agent reads: age, a failed last attempt, notes waiting.

    A `background_sync` entry (added by the MCP server) says what it started.
    """
    if fresh.get("last_sync_in_future"):
        parts = [f"The shared memory cache records its last sync at {fresh['last_sync']}, a time "
                 "in the future (this machine's clock was set back, or the record is damaged), "
                 "so how old it is cannot be told: treat it as possibly out of date."]
    elif fresh.get("last_sync"):
        parts = [f"The shared memory cache was last synced at {fresh['last_sync']} "
                 f"({fresh['age']} ago)."]
    else:
        parts = ["No sync has completed into the shared memory cache yet, so it may be empty: "
                 "run `shared_memory.py sync --config PATH` on this machine."]
    attempt = fresh.get("last_attempt") or {}
    if attempt.get("status") == "failed":
        error = " ".join(str(attempt.get("error") or "no reason recorded").split())
        if len(error) > _ERROR_CHARS:
            error = error[:_ERROR_CHARS] + "…"
        if not error.endswith((".", "!", "?", "…")):
            error += "."
        parts.append(f"The last sync attempt ({attempt.get('finished_at') or 'time unknown'}) "
                     f"failed: {error}")
    pending = fresh.get("pending_notes") or 0
    if pending:
        parts.append(f"{pending} note{'s wait' if pending > 1 else ' waits'} on this machine "
                     "to be delivered to the server.")
    background = fresh.get("background_sync") or {}
    if background.get("status") == "starting":
        parts.append(f"A sync is being started in the background because "
                     f"{background['reason']} (unless one already runs); `list` without a path "
                     "says which, and how it goes.")
    elif background.get("status") == "started":
        parts.append(f"A sync was started in the background at {background['started_at']} "
                     f"because {background['reason']}"
                     + ("; it is still running." if background.get("running") else "."))
    elif background.get("status") == "already running":
        parts.append(f"{background['reason'][0].upper()}{background['reason'][1:]}; a sync or "
                     "note delivery of this machine was already running in the background, "
                     "so none was started.")
    elif background.get("status") == "not started":
        parts.append(f"{background['reason'][0].upper()}{background['reason'][1:]}, but no "
                     f"background sync could be started: {background['why']}.")
    return " ".join(parts)


def _future(when: float, now: float | None = None) -> bool:
    """Whether `when` is later than now by more than CLOCK_SLACK."""
    return when - (time.time() if now is None else now) > CLOCK_SLACK


def _when(stamp: object) -> float | None:
    """The time of a stamp as utc_now writes it; None for anything else."""
    if not isinstance(stamp, str):
        return None
    try:
        return parse_utc(stamp)
    except ValueError:
        return None


def _count_notes(folder: str) -> int:
    """Notes queued in the outbox: its `.json` entries, as Outbox.pending lists them (unread)."""
    try:
        with os.scandir(folder) as entries:
            return sum(1 for e in entries if e.name.endswith(".json") and not e.name.startswith("."))
    except OSError:
        return 0


def _read_json(path: str, *, follow: bool = False) -> dict[str, Any]:
    """A small JSON object from a file; {} when it is missing, damaged, large or not a file.

    Opened without blocking, so a FIFO in its place cannot stall the MCP server's start; a link
    is followed only with `follow` (the user's own files: client.json, the state folder), never
    in the cache, which others may write.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_BINARY", 0))
    except OSError:
        return {}
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {}
        data = b""
        while len(data) <= _SMALL and (chunk := os.read(fd, _SMALL + 1 - len(data))):
            data += chunk
        value = loads(data.decode("utf-8")) if len(data) <= _SMALL else None
    except (OSError, UnicodeDecodeError, JSONError):
        return {}
    finally:
        os.close(fd)
    return value if isinstance(value, dict) else {}
