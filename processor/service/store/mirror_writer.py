"""A mirror's writes off the loop thread: one writer thread behind a bounded queue.

Both mirrors of a compacted topic use it: the checkpoint store
(``checkpoint_store.py``) and the query cache (``queries/query_cache.py``).
After a commit the loop hands over the transaction's records of the topic
and goes on folding; the writer thread applies them to SQLite in commit
order.  Why a thread: a SQLite write per commit on the loop thread cost
8.5% of fold + output (measured, ``bench/lab/query_cache.py``); the loop
pays a list, not a write.  What keeps it correct:

- items are applied in the order they were put (commit order), ``batch`` of
  them per call at most (the query cache writes up to 64 commits in one
  SQLite transaction);
- the queue is bounded (``depth`` items): when full the putter waits
  (back-pressure), counted through ``on_full`` (the metric) and logged —
  records are never dropped;
- :meth:`pending` says a key's records are queued, not applied yet (the
  checkpoint store waits for them, :meth:`flush`, before it loads a session
  that was evicted and reloaded within a commit);
- :meth:`flush` waits for the queue within a deadline (revoke, assign,
  close); :meth:`close` flushes, stops the thread and says what was left
  (the store is then behind the topic, caught up on the next assignment).

A failing apply goes to ``on_error`` (default: logged) and the thread goes
on with the next item: what a failure means is the mirror's to say (the
store stops the partition's writes, the cache gives partitions up).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

Item = TypeVar("Item")


def _logged(exc: Exception) -> None:
    log.error("mirror writer: applying queued records failed", exc_info=exc)


class MirrorWriter(Generic[Item]):
    """One thread applying queued items in order; see the module docstring."""

    def __init__(
        self,
        name: str,
        apply: Callable[[list[Item]], None],
        *,
        depth: int,
        batch: int = 1,
        keys: Callable[[Item], Iterable[Hashable]] = lambda item: (),
        on_full: Callable[[], object] | None = None,
        on_error: Callable[[Exception], None] = _logged,
        thread: str = "mirror-writer",
    ) -> None:
        """``name``: what the log lines call it, ``thread`` its thread; ``apply(items)``:
        write items in order (on the writer thread); ``keys(item)``: what
        :meth:`pending` answers for while the item is queued."""
        self.name = name
        self._apply = apply
        self.depth = max(1, depth)
        self.batch = max(1, batch)
        self._keys = keys
        self._on_full = on_full
        self._on_error = on_error
        self._items: deque[tuple[Item, list[Hashable]]] = deque()
        self._pending: Counter[Hashable] = Counter()
        self._cond = threading.Condition()
        self._busy = False  # items taken off the queue, not yet applied
        self._closed = False
        #: times a putter waited on a full queue (the bound was hit)
        self.full = 0
        self._thread = threading.Thread(target=self._run, name=thread, daemon=True)
        self._thread.start()

    def put(self, item: Item) -> None:
        """Queue an item (waits while the queue is full; dropped only after close)."""
        keys = list(dict.fromkeys(self._keys(item)))
        with self._cond:
            if len(self._items) >= self.depth and not self._closed:
                self.full += 1
                if self._on_full is not None:
                    self._on_full()
                log.warning(
                    "%s: write queue full (%d commits); the loop waits for it",
                    self.name,
                    self.depth,
                )
                while len(self._items) >= self.depth and not self._closed:
                    self._cond.wait(1.0)
            if self._closed:  # after close: the mirror is behind (the store catches up)
                return
            self._pending.update(keys)
            self._items.append((item, keys))
            self._cond.notify_all()

    def pending(self, key: Hashable) -> bool:
        """Items with this key are queued, not yet applied."""
        with self._cond:
            return key in self._pending

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every queued item is applied (False: the deadline passed;
        ``None``: no deadline)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while self._items or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout_s: float) -> bool:
        """Flush within ``timeout_s``, then stop the thread; False: items left behind."""
        done = self.flush(timeout_s)
        with self._cond:
            self._closed = True
            left = len(self._items)
            self._items.clear()
            self._pending.clear()
            self._cond.notify_all()
        if left:
            log.warning("%s: %d commits not written (caught up on assign)", self.name, left)
        if self._thread is not threading.current_thread():
            self._thread.join(max(0.1, timeout_s))
        return done

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._items and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                taken = [self._items.popleft() for _ in range(min(self.batch, len(self._items)))]
                self._busy = True
            try:
                self._apply([item for item, _ in taken])
            except Exception as exc:
                self._on_error(exc)
            finally:
                with self._cond:
                    for _, keys in taken:
                        self._pending.subtract(keys)
                        for key in keys:
                            if self._pending[key] <= 0:
                                del self._pending[key]
                    self._busy = False
                    self._cond.notify_all()
