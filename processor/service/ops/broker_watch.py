"""``/readyz`` must not stay green while no broker answers.

With every broker down the loop keeps ticking (``consume`` just returns
nothing), so liveness holds and, on an idle partition, no transaction fails
either: without this watch the process would report ready while nothing can
move.  librdkafka says ``_ALL_BROKERS_DOWN`` through ``error_cb`` but never
says when a broker is back, so once it has said it, the watch probes the
cluster (a metadata request, bounded) every ``every_s`` until one answers;
past ``bound_s`` without an answer the process is not ready, naming the
cause, and ready again at the first answer.  Pure apart from the injected
probe and clock, so it is tested without a broker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import KafkaException

from processor.kafka.client_errors import ClientProblems
from processor.telemetry.metrics import Metrics

log = logging.getLogger(__name__)


class BrokerWatch:
    def __init__(
        self,
        problems: ClientProblems,
        metrics: Metrics,
        probe: Callable[[], object],
        *,
        bound_s: float = 30.0,
        every_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.problems = problems
        self.metrics = metrics
        self.probe = probe
        self.bound_s = bound_s
        self.every_s = every_s
        self.clock = clock
        self._probed_at = float("-inf")

    def tick(self) -> None:
        """Called from the run loop; costs nothing while no broker went down."""
        down_at = self.problems.brokers_down_at
        if down_at is None:
            return
        now = self.clock()
        if now - self._probed_at < self.every_s:
            return
        self._probed_at = now
        try:
            self.probe()
        except KafkaException:
            if now - down_at >= self.bound_s and self.metrics.health.unreachable is None:
                line = (
                    f"no broker answers for {now - down_at:.0f} s "
                    f"(last: {self.problems.last_error or 'all brokers down'})"
                )
                log.error("%s; /readyz reports it until one answers", line)
                self.metrics.health.set_unreachable(line)
            return
        if self.metrics.health.unreachable is not None:
            log.info("a broker answers again after %.0f s", now - down_at)
        self.problems.brokers_down_at = None
        self.metrics.health.set_unreachable(None)
