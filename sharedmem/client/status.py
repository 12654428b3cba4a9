"""`status`: what a client's cache holds, how old it is, and what waits in its outbox."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from sharedmem.cache.cache import Cache
from sharedmem.client.config import ClientConfig
from sharedmem.client.outbox import Outbox
from sharedmem.clock import age_text, parse_utc


def status(config: ClientConfig) -> dict[str, Any]:
    """What the cache holds, how old it is, and what waits in the outbox."""
    cache = Cache(config.cache)
    manifest = cache.load()
    last = _read_json(config.state / "last-sync.json")
    age = time.time() - parse_utc(manifest.last_sync) if manifest.last_sync else None
    counts: dict[str, int] = {}
    for meta in manifest.files.values():
        counts[meta.namespace] = counts.get(meta.namespace, 0) + 1
    return {
        "machine": config.machine,
        "cache": str(config.cache),
        "last_sync": manifest.last_sync,
        "age_seconds": None if age is None else int(age),
        "age": None if age is None else age_text(age),
        "last_attempt": last,
        "pending_notes": [n.filename for _, n in Outbox(config.state / "outbox").pending()],
        "namespaces": [
            {"key": k, "machine": ns.machine, "source": ns.source, "kind": ns.kind,
             "files": counts.get(k, 0), "synced_at": ns.synced_at}
            for k, ns in sorted(manifest.namespaces.items())],
    }


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
