"""Another application's consumers in the processor's group: ``/readyz`` names it.

A consumer of another application configured with the processor's group id
and the ``range`` assignor makes every join of the processor fail
(INCONSISTENT_GROUP_PROTOCOL).  The member got no partition and ``/readyz``
said ``not ready: restoring`` for as long as the other consumer ran (and a
warning a second went to the log).  Now ``/readyz`` names the refusal; once
the other consumer leaves, the member joins, turns ready and folds.
"""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import Consumer

from processor.service.loop.runner import Processor
from processor.telemetry.metrics import Metrics
from tests.service.conftest import Stack, wait_until
from tests.service.running import RunningProcessor

pytestmark = pytest.mark.kafka


def test_a_join_refused_by_another_apps_consumers_is_named_until_they_leave(
    stack: Stack,
) -> None:
    # the classic protocol's refusal: under KIP-848 the broker assigns, and a
    # classic consumer joining a KIP-848 group is migrated, not refused
    cfg = stack.config.with_overrides(group_protocol="classic")
    joined = threading.Event()
    leave = threading.Event()

    def other_app() -> None:
        consumer = Consumer(
            {**cfg.common(), "group.id": cfg.group_id, "partition.assignment.strategy": "range"}
        )
        consumer.subscribe([cfg.topics.dlq], on_assign=lambda c, parts: joined.set())
        try:
            while not leave.is_set():
                consumer.poll(0.1)
        finally:
            consumer.close()

    thread = threading.Thread(target=other_app, daemon=True)
    thread.start()
    metrics = Metrics()
    running: RunningProcessor | None = None
    try:
        assert joined.wait(60), "the other application's consumer never joined"
        running = RunningProcessor(Processor(cfg, metrics=metrics))
        refused = f"not ready: group '{cfg.group_id}' refuses this member: ".encode()
        wait_until(lambda: refused in metrics.health.readiness()[1], "/readyz to name it", 60)
        assert b"INCONSISTENT_GROUP_PROTOCOL" in metrics.health.readiness()[1]
        leave.set()
        thread.join(30)
        wait_until(lambda: metrics.health.readiness()[0] == 200, "/readyz to turn ready", 90)
        stack.produce_and_wait_folded(seed=31)
        assert not running.errors, running.errors
    finally:
        leave.set()
        if running is not None:
            running.stop()
    assert running is not None and not running.errors, running.errors
