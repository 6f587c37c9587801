"""Another application's consumer joining the processor's group, on a real broker.

It speaks the processor's assignor (``cooperative-sticky``), so the group
takes it and gives it events partitions: nothing fails, and without the
watch every member would report ready while those partitions are not
folded.  ``/readyz`` must name it (client id and partitions) and the gauge
count it while it holds them, and turn ready again once it has left.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer

from processor.service.loop.runner import Processor
from processor.service.ops import group_watch
from processor.telemetry.metrics import Metrics
from tests.service.conftest import Stack, sessions, wait_until
from tests.service.running import RunningProcessor

pytestmark = pytest.mark.kafka

GAUGE = "processor_group_foreign_members"


def test_readyz_names_another_applications_consumer_in_the_group(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(group_watch, "WATCH_EVERY_S", 0.5)
    cfg = stack.config
    for sid, log in sessions(6, 4, seed=3).items():
        stack.produce(sid, log)
    metrics = Metrics()
    running = RunningProcessor(Processor(cfg, metrics=metrics))
    other = Consumer(
        {
            **cfg.common(),
            "group.id": cfg.group_id,
            "client.id": "etl-7",
            "partition.assignment.strategy": "cooperative-sticky",
            "enable.auto.commit": False,
        }
    )
    try:
        wait_until(lambda: metrics.health.readiness()[0] == 200, "the member to be ready", 90)
        assert metrics.registry.get_sample_value(GAUGE) == 0
        other.subscribe([cfg.topics.events])

        def other_named() -> bool:
            other.poll(0.1)  # the other application's loop: it must poll to stay in
            return b"etl-7 holds events partitions" in metrics.health.readiness()[1]

        wait_until(other_named, "/readyz to name the other application's consumer", 90)
        status, body = metrics.health.readiness()
        assert status == 503, body
        assert body.startswith(b"not ready: group '" + cfg.group_id.encode()), body
        assert metrics.registry.get_sample_value(GAUGE) == 1
    finally:
        other.close()
    try:
        wait_until(lambda: metrics.health.readiness()[0] == 200, "/readyz ready again", 90)
        assert metrics.registry.get_sample_value(GAUGE) == 0
        assert running.thread.is_alive()
    finally:
        running.stop()
    assert not running.errors, running.errors
