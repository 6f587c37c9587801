"""The sessions held in memory, least recently used first, with their estimated size.

The budget (``state_budget_bytes``) is of session state, which Python does
not measure cheaply: a session's size is estimated from what it was built
from — the encoded bytes of the checkpoint it was loaded from and of the
events folded since — times a factor measured on the bench workload
(``bench/memory.py``: resident bytes per session over encoded bytes), plus
a fixed cost per session.  The estimate only has to rank and bound: it
grows with exactly what makes a session big (nodes, transcript, units).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator

from processor.engine.runtime import SessionRuntime

#: Resident bytes per encoded byte (checkpoint parts and event values), and a
#: fixed cost per session.  Shape fitted to BENCHMARKS.md figure 6 (20,426 B/session
#: at 12 events of 2,654 encoded bytes, 70,030 at 60 events of 13,736: 4.5 per
#: byte + 8,500), scaled by 1.51 to what bench/state_budget.py measures through
#: the engine (31.3 KB per 12-event session: ledgers, LRU entry, allocator).  A
#: session loaded from its checkpoint (4,083 / 11,502 encoded bytes at 12 / 60
#: events) is then over-estimated by ~30% at 12 events, under by ~14% at 60.
BYTES_FACTOR = 6.8
BASE_BYTES = 12_800


class HeldSessions:
    """Runtimes in least-recently-used order, and the sum of their estimates."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lru: OrderedDict[tuple[int, str], SessionRuntime] = OrderedDict()
        self.clock = clock
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._lru)

    def add(self, rt: SessionRuntime, encoded_bytes: int) -> None:
        key = (rt.partition, rt.session_id)
        old = self._lru.pop(key, None)
        if old is not None:
            self.bytes -= old.held_bytes
        rt.held_bytes = BASE_BYTES + int(BYTES_FACTOR * encoded_bytes)
        rt.last_used = self.clock()
        self._lru[key] = rt
        self.bytes += rt.held_bytes

    def touch(self, rt: SessionRuntime) -> None:
        key = (rt.partition, rt.session_id)
        if self._lru.get(key) is rt:
            self._lru.move_to_end(key)
            rt.last_used = self.clock()

    def used(self, rt: SessionRuntime, encoded_bytes: int) -> None:
        """:meth:`touch` and :meth:`grow` in one lookup (a folded event)."""
        key = (rt.partition, rt.session_id)
        lru = self._lru
        if lru.get(key) is rt:
            lru.move_to_end(key)
            rt.last_used = self.clock()
            extra = int(BYTES_FACTOR * encoded_bytes)
            rt.held_bytes += extra
            self.bytes += extra

    def grow(self, rt: SessionRuntime, encoded_bytes: int) -> None:
        """A folded event of ``encoded_bytes`` added to the session."""
        if self._lru.get((rt.partition, rt.session_id)) is rt:
            extra = int(BYTES_FACTOR * encoded_bytes)
            rt.held_bytes += extra
            self.bytes += extra

    def remove(self, rt: SessionRuntime) -> None:
        key = (rt.partition, rt.session_id)
        if self._lru.get(key) is rt:
            del self._lru[key]
            self.bytes -= rt.held_bytes

    def oldest(self) -> Iterator[SessionRuntime]:
        """Least recently used first; safe to remove while iterating."""
        return iter(list(self._lru.values()))
