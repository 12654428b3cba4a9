"""The search index as the benchmarks measure it: a client as installed keeps one current.

An installed client's first sync is the installer's `sync --index`, and every later sync keeps
the index current (in a detached `index --background`, which the sync does not wait for). The
benchmarks time each sync as the user waits for it, then wait, untimed, until the index covers
the cache (`ready`), so that no phase pays for the one before, and report that time too.
`--no-index` benchmarks a plain client with no index.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

NOTE = ("measured as an installed client: its search index is built by the first sync "
        "(`sync --index`, as the installer runs it) and kept current by every later one")
PLAIN = "measured as a plain client, with no search index (--no-index)"

_WAIT = """
import sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from sharedmem.cache.cache import Cache
try:
    from sharedmem.cache.search_index import index_mark, writer_lock
except ImportError:  # an older checkout, which indexed in the sync's own run
    from sharedmem.cache.search import index_mark
    writer_lock = None
cache, deadline = Cache(Path(sys.argv[2])), time.monotonic() + float(sys.argv[3])
while time.monotonic() < deadline:
    if index_mark(cache) is not None:
        if writer_lock is None:
            break
        with writer_lock(cache, 0) as held:
            if held:
                break
    time.sleep(0.02)
else:
    sys.exit("the search index did not cover the cache in time")
print(time.time())
"""


def ready(launcher: Path, cache: Path, started: float, timeout: float = 1800) -> float:
    """Seconds from `started` (time.time()) until the index covers `cache` and no one writes it.

    Asked with the code beside `launcher`, so a baseline checkout is asked its own way.
    """
    done = subprocess.run([sys.executable, "-c", _WAIT, str(launcher.parent), str(cache),
                           str(timeout)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"waiting for the search index of {cache}: {done.stderr[-800:]}")
    return float(done.stdout) - started


def sync_args(phase: str, index: bool) -> list[str]:
    """The extra arguments of a phase's sync: the first sync of an installed client indexes."""
    return ["--index"] if index and phase == "first" else []
