"""The per-transaction timeline: one DEBUG line per commit with when each step ended.

``--log-level DEBUG`` (bench/latency.py ``BENCH_LATENCY_TIMELINE``,
bench/txn_timeline.py): where a slow transaction spent its time, and
whether its threads were starved by the box (``schedstat``) rather than
slowed by their own work or the broker.
"""

from __future__ import annotations

import itertools
import logging
import time

from processor.service.txn import schedstat

#: the channel bench/txn_timeline.py and bench/svc_split.py read
timeline = logging.getLogger("processor.timeline")

Marks = list[tuple[str, float]]


class Timeline:
    """The loop thread's CPU figures between commits, and the line per commit."""

    def __init__(self) -> None:
        #: the loop thread's (run, wait) ms at the previous commit
        self._sched_at = (0.0, 0.0)

    @staticmethod
    def enabled() -> bool:
        return timeline.isEnabledFor(logging.DEBUG)

    def start(self) -> None:
        self._sched_at = schedstat.thread_ms()  # the loop thread's, as at every commit

    def close_marks(self) -> tuple[Marks, Marks]:
        """``(marks, sched)`` at a batch's close (both empty when not logging)."""
        if not self.enabled():
            return [], []
        return [("close", time.monotonic())], self.loop_waits(close=True)

    def loop_waits(self, *, close: bool = False) -> Marks:
        """The loop thread's CPU figures for the timeline: at the close, its wait
        for a CPU since the previous close (the batch's window); at the offsets
        sent, its ms on a CPU and waiting for one since the close."""
        run, waited = schedstat.thread_ms()
        at = self._sched_at
        if close:
            self._sched_at = (run, waited)
            return [("window_wait", waited - at[1])]
        return [("loop_run", run - at[0]), ("loop_wait", waited - at[1])]


def log_timeline(events: int, marks: Marks, sched: Marks) -> None:
    """One line: each step's end in ms after the previous one (``opened``: the
    batch's first record could have arrived; ``close``: the loop closed it);
    after ``|``, ms runnable but waiting for a CPU: the loop thread during the
    batch's window and from close to the offsets sent (with its ms on a CPU
    then), every thread of the process during ``commit_transaction``."""
    steps = " ".join(
        f"{name}={1000 * (at - before):.1f}"
        for (_, before), (name, at) in itertools.pairwise(marks)
    )
    waits = " ".join(f"{name}={ms:.1f}" for name, ms in sched)
    timeline.debug("txn events=%d %s | sched %s", events, steps, waits)
