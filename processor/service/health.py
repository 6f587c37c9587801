"""What ``/healthz`` and ``/readyz`` report, kept apart from the Prometheus metrics.

Health is a report, never a channel: the run loop decides with its own
state and *tells* health what it found (restored, fatal, degraded,
unreachable); nothing reads a health field to decide what to do next.

* ``/healthz`` (liveness): the loop ticked within ``liveness_s`` and nothing
  fatal happened — a restart helps only then.
* ``/readyz`` (readiness): assigned partitions restored, nothing fatal,
  transactions not failing past their bound (``failures.py``) and a broker
  answering (``broker_watch.py``), the local store usable (``state.py``),
  no partition stalled with lag past its re-seeks (``progress.py``), no
  Kafka call being retried for ``RETRY_REPORT_S`` (``retry.py``: a restore
  waiting out a broker restart inside a rebalance callback) and the loop
  ticking (a loop blocked in a call past ``liveness_s`` moves nothing); the
  body names the first cause.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: A call retried this long is named by /readyz (shorter: a leader moving).
RETRY_REPORT_S = 5.0


class Health:
    def __init__(self, on_degraded: Callable[[float], object] | None = None) -> None:
        #: called with 1 while degraded or unreachable, else 0 (the metric)
        self._on_degraded = on_degraded
        self.last_tick = time.monotonic()
        self.ready = False
        self.fatal: str | None = None
        #: cause of a repeating failure past its bound
        self.degraded: str | None = None
        #: set while no broker has answered past a bound
        self.unreachable: str | None = None
        #: why the local state store cannot be opened or written (state.py)
        self.store: str | None = None
        #: partitions whose store fill is still running (background_fill.py)
        self.filling = 0
        #: why a fill failed, while it is retried within its bound
        self.fill_problem: str | None = None
        #: a partition with lag whose position did not move past its bound (progress.py)
        self.stalled: str | None = None
        #: (seconds failing, line) of the oldest Kafka call being retried (retry.py)
        self.retrying: Callable[[], tuple[float, str] | None] = lambda: None

    def tick(self) -> None:
        self.last_tick = time.monotonic()

    def set_degraded(self, cause: str | None) -> None:
        self.degraded = cause
        self._report()

    def set_unreachable(self, cause: str | None) -> None:
        self.unreachable = cause
        self._report()

    def set_store(self, cause: str | None) -> None:
        self.store = cause
        self._report()

    def _report(self) -> None:
        if self._on_degraded is not None:
            ok = self.degraded is None and self.unreachable is None and self.store is None
            self._on_degraded(0 if ok else 1)

    def liveness(self, liveness_s: float = 60.0) -> tuple[int, bytes]:
        alive = self.fatal is None and time.monotonic() - self.last_tick < liveness_s
        return (200, b"ok\n") if alive else (503, b"stalled\n")

    def readiness(self, liveness_s: float = 60.0) -> tuple[int, bytes]:
        """``liveness_s``: a loop that has not ticked for that long is not ready
        either (blocked in a call: nothing moves, whatever the report says)."""
        idle = time.monotonic() - self.last_tick
        cause = (
            self.fatal
            or self.degraded
            or self.unreachable
            or self.store
            or self._retrying()
            or self.fill_problem
            or self.stalled
            or (f"the loop has not ticked for {idle:.0f}s" if idle >= liveness_s else None)
        )
        if self.ready and cause is None:
            # serving: the filling partitions only wait, the others fold
            if self.filling:
                return 200, f"ready; filling {self.filling} partitions\n".encode()
            return 200, b"ready\n"
        cause = cause or "restoring"
        return 503, f"not ready: {cause}\n".encode()

    def _retrying(self) -> str | None:
        oldest = self.retrying()
        if oldest is None or oldest[0] < RETRY_REPORT_S:
            return None
        return f"waiting {oldest[0]:.0f}s for the broker: {oldest[1]}"
