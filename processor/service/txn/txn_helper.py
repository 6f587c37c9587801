"""The commit's helper thread: one daemon thread running submitted steps in order.

Not a ``ThreadPoolExecutor``: its workers are joined at interpreter exit, so
a step stuck inside librdkafka for good (``send_offsets_to_transaction``
waiting for a group coordinator that went away, ``commit.py``) would keep the
process from ever exiting after it was given up.  A given-up helper is left
to its step; a new one takes the next.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future

_Item = tuple[Future[None], Callable[[], None]] | None


class Helper:
    """Runs steps one at a time on a daemon thread; each gets a ``Future``."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, step: Callable[[], None]) -> Future[None]:
        future: Future[None] = Future()
        self._queue.put((future, step))
        return future

    def shutdown(self, *, wait: bool) -> None:
        """End after the steps already submitted (``wait``: until then)."""
        self._queue.put(None)
        if wait:
            self._thread.join()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            future, step = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                step()
            except BaseException as exc:  # handed to whoever waits for it
                future.set_exception(exc)
            else:
                future.set_result(None)
