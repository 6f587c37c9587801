"""What ``/healthz`` and ``/readyz`` report, kept apart from the Prometheus metrics.

Health is a report, never a channel: the run loop decides with its own
state and *tells* health what it found (restored, fatal, degraded,
unreachable); nothing reads a health field to decide what to do next.

* ``/healthz`` (liveness): the loop ticked within ``liveness_s`` and nothing
  fatal happened — a restart helps only then.
* ``/readyz`` (readiness): assigned partitions restored, nothing fatal,
  transactions not failing past their bound (``failures.py``) and a broker
  answering (``broker_watch.py``), the group taking this member (a join
  refused: ``join_refusal.py``) and no other application's consumer holding events
  partitions (``group_watch.py``), the local store usable (``checkpoint_store.py``),
  no partition stalled with lag past its re-seeks (``stall_watch.py``), no
  Kafka call being retried for ``RETRY_REPORT_S`` (``retry.py``: a restore
  waiting out a broker restart inside a rebalance callback) and the loop
  ticking (a loop blocked in a call past ``liveness_s`` moves nothing).

The 503 body names every current cause, the most severe first, one a line:
``not ready: <first>`` (what probes and alerts match), then ``also: <next>``,
at most ``MAX_CAUSES`` lines and ``and N more causes``.  One cause used to
hide the others: a restore's call being retried hid the partitions put off
before it, and an operator saw one problem while there were two.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: A call retried this long is named by /readyz (shorter: a leader moving).
RETRY_REPORT_S = 5.0
#: Causes the /readyz body names (a put-off per partition could be hundreds).
MAX_CAUSES = 8


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
        #: why the group coordinator refuses this member's join (another
        #: application's consumers in the group), until it is assigned (join_refusal.py)
        self.group: str | None = None
        #: another application's consumers holding events partitions (group_watch.py)
        self.foreign: str | None = None
        #: why the local state store cannot be opened or written (checkpoint_store.py)
        self.store: str | None = None
        #: partitions whose store fill is still running (background_fill.py)
        self.filling = 0
        #: why fills failed or were put off, while they are retried (one per partition)
        self.fill_problems: tuple[str, ...] = ()
        #: a partition with lag whose position did not move past its bound (stall_watch.py)
        self.stalled: str | None = None
        #: (seconds failing, line) of the oldest Kafka call being retried (retry.py)
        self.retrying: Callable[[], tuple[float, str] | None] = lambda: None
        #: (seconds waited, what for) of each wait blocking the loop (retry.waiting)
        self.waiting: Callable[[], list[tuple[float, str]]] = lambda: []

    @property
    def fill_problem(self) -> str | None:
        """The first of :attr:`fill_problems` (None: every fill is going well)."""
        return self.fill_problems[0] if self.fill_problems else None

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
        causes = self.causes(liveness_s)
        if self.ready and not causes:
            # serving: the filling partitions only wait, the others fold
            if self.filling:
                return 200, f"ready; filling {self.filling} partitions\n".encode()
            return 200, b"ready\n"
        causes = causes or ["restoring"]
        lines = [f"not ready: {causes[0]}"] + [f"also: {c}" for c in causes[1:MAX_CAUSES]]
        if len(causes) > MAX_CAUSES:
            lines.append(f"and {len(causes) - MAX_CAUSES} more causes")
        return 503, "".join(f"{line}\n" for line in lines).encode()

    def causes(self, liveness_s: float = 60.0) -> list[str]:
        """Every reason not to be ready now, the most severe first."""
        idle = time.monotonic() - self.last_tick
        oldest = self.retrying()
        return [
            c
            for c in (
                self.fatal,
                self.degraded,
                self.unreachable,
                self.group,
                self.foreign,
                self.store,
                f"waiting {oldest[0]:.0f}s for the broker: {oldest[1]}"
                if oldest is not None and oldest[0] >= RETRY_REPORT_S
                else None,
                *(f"waiting {s:.0f}s for {line}" for s, line in self.waiting()),
                *self.fill_problems,
                self.stalled,
                f"the loop has not ticked for {idle:.0f}s" if idle >= liveness_s else None,
            )
            if c
        ]
