"""A failure that repeats is reported, never retried forever in silence.

The processor aborts and refolds a batch whose transaction failed; if the
cause persists (a record that cannot be written, a broker refusing), that
is a loop.  :class:`FailureTracker` backs off exponentially between
attempts and, once ``bound`` failures come in a row, marks the process
degraded: ``/readyz`` answers 503 with the cause and ``processor_degraded``
is 1 until a transaction commits again.
"""

from __future__ import annotations

import logging

from processor.telemetry.metrics import Metrics

log = logging.getLogger(__name__)


class FailureTracker:
    def __init__(
        self, metrics: Metrics, *, bound: int = 5, base_s: float = 0.1, max_s: float = 5.0
    ) -> None:
        self.metrics = metrics
        self.bound = bound
        self.base_s = base_s
        self.max_s = max_s
        self.in_a_row = 0
        self.cause: str | None = None

    def failed(self, cause: str) -> float:
        """Record one failure; returns the back-off (seconds) before the next attempt."""
        self.in_a_row += 1
        self.cause = cause
        self.metrics.consecutive_failures.set(self.in_a_row)
        if self.in_a_row >= self.bound:
            line = f"{self.in_a_row} transactions failed in a row: {cause}"
            if self.metrics.health.degraded is None:
                log.error("%s; /readyz reports it until a transaction commits", line)
            self.metrics.health.set_degraded(line)
        return float(min(self.max_s, self.base_s * 2.0 ** (self.in_a_row - 1)))

    def succeeded(self) -> None:
        if self.in_a_row:
            if self.metrics.health.degraded is not None:
                log.info("transactions commit again after %d failures", self.in_a_row)
            self.in_a_row = 0
            self.cause = None
            self.metrics.consecutive_failures.set(0)
            self.metrics.health.set_degraded(None)
