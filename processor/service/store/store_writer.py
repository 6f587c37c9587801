"""The local store's writes, off the loop thread (issue 13).

After a commit the loop hands the transaction's checkpoint records to this
writer and goes on folding; the writer thread applies them to SQLite in
commit order.  What keeps that correct:

- the store's position moves in the same SQLite transaction as the records
  (``LocalStore.apply``): a crash with writes still queued leaves the store
  behind the topic, which the next assignment catches up — never ahead;
- a session whose records are still queued is never read from the store
  stale: ``pending`` says so and the reader waits for the queue (``flush``)
  before it loads the session (an evicted session reloaded within a commit);
- the queue is bounded (``store_write_queue`` commits): when full the loop
  waits (back-pressure, counted in
  ``processor_store_write_queue_full_total`` and logged), records are never dropped;
- revoke, assign and close wait for the queue within a deadline (``flush``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable

from processor.service.store.local_store import StoredRecord

log = logging.getLogger(__name__)

Apply = Callable[[int, list[StoredRecord], int], None]


class StoreWriter:
    """One thread applying committed checkpoint records; see the module docstring."""

    def __init__(
        self,
        apply: Apply,
        session_key: Callable[[bytes], bytes],
        depth: int,
        on_full: Callable[[], None] | None = None,
    ) -> None:
        self._apply = apply
        #: called each time the loop finds the queue full (the metric)
        self._on_full = on_full
        self._session_key = session_key
        self.depth = max(1, depth)
        self._items: deque[tuple[int, list[StoredRecord], int, list[tuple[int, bytes]]]] = deque()
        self._pending: Counter[tuple[int, bytes]] = Counter()
        self._cond = threading.Condition()
        self._busy = False  # an item taken off the queue, not yet applied
        self._closed = False
        #: times the loop waited on a full queue (the bound was hit)
        self.full = 0
        self._thread = threading.Thread(target=self._run, name="store-writer", daemon=True)
        self._thread.start()

    def put(self, partition: int, records: list[StoredRecord], next_offset: int) -> None:
        """Queue a committed transaction's records of one partition (waits when full)."""
        keys = list({(partition, self._session_key(r.key)) for r in records})
        with self._cond:
            if len(self._items) >= self.depth:
                self.full += 1
                if self._on_full is not None:
                    self._on_full()
                log.warning(
                    "local store writer: queue full (%d commits); the loop waits for it",
                    self.depth,
                )
                while len(self._items) >= self.depth and not self._closed:
                    self._cond.wait(1.0)
            if self._closed:  # after close: the store is behind, caught up on assign
                return
            self._pending.update(keys)
            self._items.append((partition, records, next_offset, keys))
            self._cond.notify_all()

    def pending(self, partition: int, session: bytes) -> bool:
        """Records of this session are queued, not yet in the store."""
        with self._cond:
            return (partition, session) in self._pending

    def flush(self, timeout_s: float) -> bool:
        """Wait until every queued write is applied (False: the deadline passed)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._items or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout_s: float) -> bool:
        """Flush within ``timeout_s``, then stop the thread; False: writes left behind."""
        done = self.flush(timeout_s)
        with self._cond:
            self._closed = True
            left = len(self._items)
            self._items.clear()
            self._pending.clear()
            self._cond.notify_all()
        if left:
            log.warning("local store writer: %d commits not written (caught up on assign)", left)
        self._thread.join(max(0.1, timeout_s))
        return done

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._items and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                partition, records, next_offset, keys = self._items.popleft()
                self._busy = True
            try:
                self._apply(partition, records, next_offset)
            except Exception:
                log.exception("local store writer: applying partition %d failed", partition)
            finally:
                with self._cond:
                    self._pending.subtract(keys)
                    for key in keys:
                        if self._pending[key] <= 0:
                            del self._pending[key]
                    self._busy = False
                    self._cond.notify_all()
