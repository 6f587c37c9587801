"""Calls into the run loop's thread from other threads (the HTTP query endpoint).

The engine and the local store belong to the loop's thread (neither is
thread-safe, and a session may have to be loaded from the store).  A reader
on another thread queues a function; the loop runs the queued functions
between batches and hands each result back.  Bounded: a full queue refuses
at once (:class:`Busy`), a caller waits at most its timeout.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from processor.core.errors import Unavailable

T = TypeVar("T")

#: Calls waiting for the loop; more are refused (the caller answers 429/503).
MAX_QUEUED = 64


class Busy(Unavailable):
    """The loop did not take or answer the call in time."""


class LoopCalls:
    def __init__(self, max_queued: int = MAX_QUEUED) -> None:
        self._queue: queue.Queue[tuple[Callable[[], Any], Future[Any]]] = queue.Queue(max_queued)

    def call(self, fn: Callable[[], T], timeout_s: float) -> T:
        """Run ``fn`` on the loop's thread and return its result (any thread)."""
        future: Future[T] = Future()
        try:
            self._queue.put_nowait((fn, future))
        except queue.Full:
            raise Busy(f"{self._queue.maxsize} calls already wait for the loop") from None
        try:
            return future.result(timeout_s)
        except FutureTimeout:
            future.cancel()
            raise Busy(f"the loop did not answer within {timeout_s:g}s") from None

    def serve(self) -> int:
        """Run every queued call (the loop's thread, between batches); how many ran."""
        ran = 0
        while True:
            try:
                fn, future = self._queue.get_nowait()
            except queue.Empty:
                return ran
            ran += 1
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except Exception as exc:  # the caller's to handle
                future.set_exception(exc)
