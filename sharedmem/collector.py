"""Python's cycle collector, paused for a unit of work that makes no reference cycles.

A sync's run and a server's session each hold tens of thousands of long-lived objects (a
source's record and snapshot, a parsed manifest) and make no cycles in their work: every
collection meanwhile walks those objects and frees nothing. Reference counting frees
everything else as before.
"""

from __future__ import annotations

import gc


class Paused:
    """Pause the collector for a `with` block, and turn it back on after if it was on before.

    What the block made and keeps is moved to the oldest generation as it ends, unwalked
    (`gc.freeze` then `gc.unfreeze`): otherwise the first young collection after it walks all of
    it, a sync's whole record and snapshot, and frees nothing. A later full collection still
    frees any cycle it left. A class, not a generator: turning the collector on is the last
    thing its exit does.
    """

    def __enter__(self) -> None:
        self.collecting = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        gc.freeze()  # every tracked object to the permanent generation, the young count to 0
        gc.unfreeze()  # and from there to the oldest generation
        if self.collecting:
            gc.enable()
