"""Python's cycle collector, paused for a unit of work that makes no reference cycles.

A sync's run and a server's session each hold tens of thousands of long-lived objects (a
source's record and snapshot, a parsed manifest) and make no cycles in their work: every
collection meanwhile walks those objects and frees nothing (docs/BENCHMARKS.md). Reference
counting frees everything else as before.
"""

from __future__ import annotations

import gc


class Paused:
    """Pause the collector for a `with` block, and turn it back on after if it was on before.

    A class, not a generator: turning the collector on is the last thing its exit does, so
    the collections the block put off are not run inside it.
    """

    def __enter__(self) -> None:
        self.collecting = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self.collecting:
            gc.enable()
