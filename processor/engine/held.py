"""The sessions held in memory, least recently used first, with their estimated size.

The budget (``state_budget_bytes``) is of session state, which Python does
not measure cheaply: a session's size is estimated from what it was built
from — the events folded into it (a count and their encoded bytes) and, for
a session loaded from the local store, the encoded bytes of its checkpoint
— with constants fitted to what held sessions of several shapes leave
allocated (``bench/held_fit.py``).  The estimate only has to rank and bound:
it grows with exactly what makes a session big (events folded, nodes,
transcript, units).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator

from processor.engine.runtime import SessionRuntime

#: A fixed cost per session, per event folded into it, per encoded byte of
#: those events, per event a loaded session's checkpoint had folded, and per
#: encoded byte of that checkpoint.  Fitted to the bytes 100 sessions leave
#: allocated through the engine (tracemalloc, ``python -m bench.held_fit``;
#: figure 9), 20 shapes: the walker's logs of 4-120 events, 30% 10 KB
#: tool results, the scripted agent runs of 12-30 events, each loaded from
#: its checkpoint, loaded and folded further.  Held bytes grow with the event
#: count (~750 B per event fresh or loaded: a restored
#: session's projection rows reuse its surface's frozen blocks, as the fresh
#: fold's cells do; before, ~1,050 B per loaded scripted event and a loaded
#: constant of 1,140), not with the events' bytes: a 10 KB tool result leaves
#: the session with its transcript page.  The estimate is 1.04-1.22 x the
#: traced bytes on fresh sessions and 1.04-1.27 x on loaded ones (pure build;
#: never under).  The resident
#: size adds the allocator's overhead on top (RSS/traced ~1.1 in figure 6).
#: BASE_BYTES was 11,400 before the runtime's goal and tokenUsage units
#: (issue 36: +350 B of cells per session, the estimate fell 0.5% under);
#: 11,750 was still 18 B under on the compiled build's "big results 12"
#: (23,038 vs 23,056 traced), hence 11,850.
#: Before (stop 26, walker shapes only, one per-event constant 780):
#: 0.80 x on the loaded scripted runs of 30-60 events, so a member whose
#: sessions came back from the store held up to 1.25 x its budget of them.
BASE_BYTES = 11_850
EVENT_BYTES = 810
EVENT_FACTOR = 0.3
LOADED_EVENT_BYTES = 800
CHECKPOINT_FACTOR = 0.9


class HeldSessions:
    """Runtimes in least-recently-used order, and the sum of their estimates."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lru: OrderedDict[tuple[int, str], SessionRuntime] = OrderedDict()
        #: bound once: compiled, ``self._lru.move_to_end(key)`` looks the method up
        #: by name per folded event (~0.5k of the ~2.3k instructions of :meth:`used`)
        self._to_end: Callable[[tuple[int, str]], None] = self._lru.move_to_end
        self.clock = clock
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._lru)

    def add(self, rt: SessionRuntime, encoded_bytes: int) -> None:
        """Hold ``rt``, new or loaded from a checkpoint of ``encoded_bytes``."""
        key = (rt.partition, rt.session_id)
        old = self._lru.pop(key, None)
        if old is not None:
            self.bytes -= old.held_bytes
        # a loaded session holds the events its checkpoint folded (a fresh one: none)
        events = rt.last_seq + 1
        rt.held_bytes = (
            BASE_BYTES + LOADED_EVENT_BYTES * events + int(CHECKPOINT_FACTOR * encoded_bytes)
        )
        rt.last_used = self.clock()
        self._lru[key] = rt
        self.bytes += rt.held_bytes

    def touch(self, rt: SessionRuntime) -> None:
        key = (rt.partition, rt.session_id)
        if self._lru.get(key) is rt:
            self._to_end(key)
            rt.last_used = self.clock()

    def used(self, rt: SessionRuntime, encoded_bytes: int) -> None:
        """:meth:`touch` and :meth:`grow` in one lookup (a folded event)."""
        key = (rt.partition, rt.session_id)
        lru = self._lru
        if lru.get(key) is rt:
            self._to_end(key)
            rt.last_used = self.clock()
            extra = EVENT_BYTES + int(EVENT_FACTOR * encoded_bytes)  # inline: per event
            rt.held_bytes += extra
            self.bytes += extra

    def grow(self, rt: SessionRuntime, encoded_bytes: int) -> None:
        """A folded event of ``encoded_bytes`` added to the session."""
        if self._lru.get((rt.partition, rt.session_id)) is rt:
            extra = EVENT_BYTES + int(EVENT_FACTOR * encoded_bytes)
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
