"""The cyclic garbage collector in the processing loop (issue 15).

Folded sessions are many small long-lived containers without reference
cycles (gcpolicy.py).  Two costs follow, both measured on figure 1
(BENCHMARKS.md §1, the in-memory transport):

- with the interpreter's default thresholds (700, 10, 10) the collector
  runs ~900 young and 8 full collections per 60k events, 25-35% of the
  loop's CPU; ``processor run`` has set (50_000, 20, 100) since bbf3a5b,
  and an embedded :class:`~processor.service.loop.runner.Processor` now does the
  same for the time it runs;
- a full collection walks every held session: 1.2 s at 10k sessions,
  14 s at 100k — a stall of every partition of the member, which breaks
  the latency bound whenever it comes.

:class:`HeapPolicy` therefore, after every commit, runs a full collection
over what the previous freeze left -- what this batch allocated, including
what a young collection already moved to the old generation, so none of the
batch's cyclic garbage is kept -- and freezes what survived (``gc.freeze``).
Held sessions thus never stay in the collected generations: no collection
walks them again, and the pause per commit grows with the batch, not with
the sessions held.  What a freeze keeps for good is an object alive at a
commit that later dies *in a cycle*; session state has none (gcpolicy.py).
"""

from __future__ import annotations

import gc
import time

#: the thresholds ``processor run`` sets (cli/main.py); an embedded processor uses them too
THRESHOLDS = (50_000, 20, 100)


class HeapPolicy:
    """When the loop lets the collector run a full pass, and over what."""

    def __init__(self) -> None:
        self._saved: tuple[int, int, int] | None = None
        self.settles = 0
        self.settle_seconds = 0.0

    def start(self) -> None:
        """Raise lower thresholds to the service's for the time the loop runs."""
        current = gc.get_threshold()
        if current[0] < THRESHOLDS[0]:
            self._saved = current
            gc.set_threshold(*THRESHOLDS)

    def stop(self) -> None:
        """Give back the thresholds found at :meth:`start` (an embedding process's),
        and let the collector see the frozen objects again: what the run froze and
        has since become garbage in a cycle (the processor itself, its clients)
        would otherwise stay for the life of an embedding process."""
        if self._saved is not None and gc.get_threshold() == THRESHOLDS:
            gc.set_threshold(*self._saved)
        self._saved = None
        gc.unfreeze()

    def committed(self) -> None:
        """After a commit: collect what the batch left, freeze what is alive."""
        if not gc.isenabled():
            return
        t0 = time.perf_counter()
        gc.collect()  # a full pass, but over what the last freeze left: this batch's
        gc.freeze()
        self.settles += 1
        self.settle_seconds += time.perf_counter() - t0
