"""Checkpoints that read committed before their offsets do are waited for, not fatal.

Past the wait's bound the member goes on after the newest checkpoint's
anchor (a CI chaos run: the offsets never showed).

A transaction's checkpoints and offsets commit together, but the commit
markers reach the checkpoints partition and ``__consumer_offsets`` one by
one: in a chaos run (seed 3, long form) the group coordinator's broker
restarted between them, the committed offset answered the older value for
16 s and more, and every member restoring then failed the anchor check
("checkpoints reach offset 14445 ... committed offset is 14440") and exited.
Here the group's offsets lag one record behind the checkpoints until the
restore has read them once; the member waits, reads them again and folds.
The wait blocks the loop: ``/readyz`` names it while it lasts and
``processor_restore_committed_behind_waits_total`` counts it by outcome.
Broker-less (the in-memory cluster).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, cast

import pytest
from confluent_kafka import TopicPartition

from processor.kafka.retry import observing
from processor.kafka.transport import Reader
from processor.service.partitions.restore import committed_behind
from processor.telemetry.metrics import Metrics
from processor.testing.memory import MemoryBroker, MemoryConsumer, MemoryTransport
from tests.service.test_memory_transport import Loop, _committed, _wait
from tests.service.test_state_store import LOGS, _assert_folded, _config, _produce, _run


class Lagging(MemoryConsumer):
    """A group consumer whose first ``committed()`` answers the offsets before the
    last commit (its marker not written yet); the marker lands after it."""

    real: ClassVar[dict[tuple[str, str, int], int]] = {}
    asked = 0

    def committed(
        self, partitions: list[TopicPartition], timeout: float = -1
    ) -> list[TopicPartition]:
        Lagging.asked += 1
        if Lagging.asked == 2:
            with self.broker.cond:
                self.broker.group_offsets.update(Lagging.real)
        return super().committed(partitions, timeout)


@pytest.fixture
def lagging(monkeypatch: pytest.MonkeyPatch) -> type[Lagging]:
    def group(self: MemoryTransport, instance_id: str, problems: Any) -> MemoryConsumer:
        return Lagging(self.broker, self.config.group_id, eof=False)

    Lagging.real, Lagging.asked = {}, 0
    monkeypatch.setattr(MemoryTransport, "group_consumer", group)
    return Lagging


def test_a_restore_waits_for_offsets_that_lag_their_checkpoints(
    tmp_path: Path, lagging: type[Lagging]
) -> None:
    broker = MemoryBroker()
    config = _config(tmp_path)
    broker.create_topics(config)
    _run(broker, config, 0, 6)
    lagging.real = dict(broker.group_offsets)
    assert lagging.real
    # the last commit's offsets not visible yet: one behind the checkpoints' anchors
    broker.group_offsets.update({k: v - 1 for k, v in lagging.real.items()})
    lagging.asked = 0
    _produce(broker, config, 6, 9)
    loop = Loop(broker, config)
    _wait(lambda: _committed(broker, config), loop, "committed")
    loop.stop()
    assert not loop.errors, loop.errors
    assert lagging.asked >= 2  # read again after the first answer
    _assert_folded(broker, config, 9)
    waits = loop.metrics.registry.get_sample_value(
        "processor_restore_committed_behind_waits_total", {"outcome": "caught_up"}
    )
    assert waits == 1


def test_offsets_that_never_show_are_gone_on_from_after_the_anchor(tmp_path: Path) -> None:
    """A CI chaos run: a committed transaction's checkpoints read committed but
    its offsets never showed (minutes later still the older value), and every
    member that took the partition exited on the anchor check.  Past the
    bound the member goes on after the newest anchor instead: the records up
    to it are in committed output, so none is read, folded or published again."""
    broker = MemoryBroker()
    config = _config(tmp_path, restore_stable_wait_ms=300)
    broker.create_topics(config)
    _run(broker, config, 0, 6)
    events = config.topics.events
    before = {k: v for k, v in broker.group_offsets.items() if k[1] == events}
    assert len(before) == config.partitions
    views_before = len(list(broker.committed_records(config.topics.views)))
    broker.group_offsets.update({k: v - 3 for k, v in before.items()})  # lost, for good
    _produce(broker, config, 6, 9)
    loop = Loop(broker, config)
    _wait(lambda: _committed(broker, config), loop, "committed")
    loop.stop()
    assert not loop.errors, loop.errors
    _assert_folded(broker, config, 9)
    # only the new events were read: the three records behind each anchor were not
    assert loop.sample("processor_records_consumed_total") == 3 * len(LOGS)
    assert list(broker.committed_records(config.topics.dlq)) == []
    views_after = len(list(broker.committed_records(config.topics.views)))
    assert views_after > views_before
    outcomes = _outcomes(loop.metrics)
    assert outcomes["expired"] >= 1 and outcomes["caught_up"] == 0, outcomes


class Behind:
    """A group consumer whose committed offset of partition 0 reaches ``caught_up``
    on its ``answers``-th query; records what /readyz and the gauge said each time."""

    def __init__(self, metrics: Metrics, answers: int) -> None:
        self.metrics = metrics
        self.answers = answers
        self.seen: list[tuple[int, bytes, float]] = []

    def committed(
        self, partitions: list[TopicPartition], timeout: float = -1
    ) -> list[TopicPartition]:
        status, body = self.metrics.health.readiness()
        gauge = self.metrics.registry.get_sample_value("processor_restore_committed_behind_seconds")
        self.seen.append((status, body, gauge or 0.0))
        offset = 10 if len(self.seen) < self.answers else 13
        return [TopicPartition(tp.topic, tp.partition, offset) for tp in partitions]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 2.0
        return self.now


def _outcomes(metrics: Metrics) -> dict[str, float]:
    name = "processor_restore_committed_behind_waits_total"
    return {
        o: metrics.registry.get_sample_value(name, {"outcome": o}) or 0.0
        for o in ("caught_up", "expired", "failed")
    }


def test_a_committed_behind_wait_is_named_on_readyz_and_counted() -> None:
    """The wait blocks the loop (inside a rebalance or the poll loop's fill step):
    /readyz, read by another thread, names it from its start, the gauge says how
    long it has lasted, and the counter has its outcome once it ends."""
    metrics = Metrics()
    metrics.health.ready = True
    metrics.retries.clock = Clock()  # two seconds per read
    consumer = Behind(metrics, answers=3)
    counted = metrics.committed_behind
    with observing(metrics.retries):
        committed, after = committed_behind(
            cast(Reader, consumer),
            "ev",
            {0: 12},  # the newest checkpoint's anchor
            {0: 10},  # the committed offset: behind it
            bound_s=600.0,
            poll_s=0.0,
            counted=lambda outcome: counted.labels(outcome).inc(),
        )
    assert committed == {0: 13}
    assert after == {}  # caught up: nothing goes on after its anchor
    assert len(consumer.seen) == 3
    for status, body, gauge in consumer.seen:
        assert status == 503, body
        assert body.startswith(b"not ready: waiting "), body
        assert b"for the group's committed offsets of ev[0] to pass their checkpoints" in body
        assert gauge > 0
    assert metrics.health.readiness() == (200, b"ready\n")  # nothing waits any more
    assert metrics.registry.get_sample_value("processor_restore_committed_behind_seconds") == 0
    assert _outcomes(metrics) == {"caught_up": 1, "expired": 0, "failed": 0}


def test_a_committed_behind_wait_past_its_bound_is_counted_as_expired() -> None:
    metrics = Metrics()
    counted = metrics.committed_behind
    with observing(metrics.retries):
        committed, after = committed_behind(
            cast(Reader, Behind(metrics, answers=99)),
            "ev",
            {0: 12},
            {0: 10},
            bound_s=0.0,
            counted=lambda outcome: counted.labels(outcome).inc(),
        )
    assert committed == {0: 10}
    assert after == {0: 13}  # goes on after the anchor
    assert _outcomes(metrics) == {"caught_up": 0, "expired": 1, "failed": 0}
