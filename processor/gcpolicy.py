"""Keeping the cyclic garbage collector out of the fold's hot path (issue 15).

Folded sessions are many small long-lived containers (frozen events,
messages, states) and hold no reference cycles: they die by reference
counting.  A full collection still walks every one of them.  Measured with
``python -m bench.gc_cost`` (see BENCHMARKS.md): one full collection takes
about 0.56 s with 10k sessions of 12 events held and 6.0 s with 100k; with
``processor``'s thresholds (50_000, 20, 100) it comes about every 100M
allocations, a multi-second stall of every partition of the member.

:func:`settle_heap` collects once and then moves every surviving object to
the permanent generation (``gc.freeze``): later collections never look at
them again, and as they die by reference counting their memory is freed as
before.  Call it when a large heap has just been built and before the hot
path resumes: after a member restored its partitions, after an offline load.
"""

from __future__ import annotations

import gc


def settle_heap() -> int:
    """Collect, then freeze what survived; returns the number of frozen objects.

    Cyclic garbage created *after* the call is collected as usual; only the
    objects alive now are exempted (a cycle among them would never be
    collected, which is why this is for session state, which has none).
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
