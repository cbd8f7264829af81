"""Young-generation collections paced by the work that needs them, not by allocation counts.

CPython collects when allocations outnumber deallocations by the young threshold
(``server.gc_threshold``, 200,000 in the server). A busy server defeats that count: each call
keeps a result and drops an older one, so the count stays near zero while the young generation
fills with every entry kept since the last collection, until some other collection walks them
all at once (0.2-0.5 s of stalled event loop, bench/README.md). So the code that leaves objects
for the collector says how many (``owe``): the stores (two records per kept result, which the
first collection that meets them stops tracking) and the MCP endpoint (each stateless request
leaves ~16 objects in reference cycles inside the SDK). Once ``budget`` objects are owed, the
young generation is collected: no collection meets more than about that many of them.

Every ``MIDDLE_EVERY``-th collection takes the middle generation too: cycles that were still
alive at a young collection (a request in flight) end up there, and with the young collections
paced here CPython's own count would rarely reach it. The oldest generation is left to
CPython's own rule (and ``gc.freeze`` keeps what start-up built out of it).
"""

from __future__ import annotations

import gc

__all__ = ["GcPacer", "MIDDLE_EVERY", "YOUNG_BUDGET"]

YOUNG_BUDGET = 16_384  # owed objects per young collection: a few milliseconds of walking
MIDDLE_EVERY = 10  # as CPython's own second threshold


class GcPacer:
    """Counts the objects owed to the collector and collects once ``budget`` are owed."""

    __slots__ = ("budget", "owed", "collections")

    def __init__(self, budget: int = YOUNG_BUDGET) -> None:
        self.budget = budget
        self.owed = 0
        self.collections = 0  # paced collections so far

    def owe(self, objects: int) -> None:
        self.owed += objects
        if self.owed >= self.budget:
            self.collect()

    def collect(self) -> None:
        self.owed = 0
        if not gc.isenabled():  # the process turned the collector off: not ours to run it
            return
        self.collections += 1
        gc.collect(1 if self.collections % MIDDLE_EVERY == 0 else 0)
