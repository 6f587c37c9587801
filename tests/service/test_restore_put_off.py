"""A restore that cannot read the broker within the retry deadline is put off, not fatal.

Chaos runs saw a member exit when its restore's watermark query failed for
longer than the 120 s retry deadline after a broker restart.  Now the
partitions stay assigned and paused, ``/readyz`` names the partition and the
broker's error, and the restore is tried again after a back-off with a new
restore consumer; once the broker answers the partitions fold as if nothing
happened.  Broker-less (the in-memory cluster); the retry deadline and the
back-off run on a clock that moves 30 s each time it is read (no wall time).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from processor.config import ServiceConfig
from processor.service.loop.runner import Processor
from processor.telemetry.metrics import Metrics
from processor.testing.memory import MemoryBroker, MemoryConsumer, MemoryTransport
from tests.service.running import RunningProcessor
from tests.service.test_memory_transport import _committed, _wait
from tests.service.test_state_store import _assert_folded, _config, _produce


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 30.0
        return self.now


class Down(MemoryConsumer):
    """A restore consumer whose watermark queries fail while ``down`` (a broker
    restarting: librdkafka answers ``_TRANSPORT``)."""

    down = False
    made = 0

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        if Down.down:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker restarting"))
        return super().get_watermark_offsets(partition, timeout, cached)


@pytest.fixture
def down(monkeypatch: pytest.MonkeyPatch) -> type[Down]:
    real = MemoryTransport.plain_consumer

    def plain(self: MemoryTransport, purpose: str, problems: Any, group: str) -> MemoryConsumer:
        if purpose == "restore":
            Down.made += 1
            return Down(self.broker, group, eof=True)
        return real(self, purpose, problems, group)

    Down.down, Down.made = False, 0
    monkeypatch.setattr(MemoryTransport, "plain_consumer", plain)
    return Down


class Run(RunningProcessor):
    def __init__(self, broker: MemoryBroker, config: ServiceConfig) -> None:
        self.metrics = Metrics()
        clock = Clock()
        self.metrics.retries.clock = clock  # the retry deadline's clock
        proc = Processor(config, metrics=self.metrics, transport=MemoryTransport(broker, config))
        proc.rebalance.fill.clock = clock  # the put-off restores' back-off
        super().__init__(proc)

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float:
        return self.metrics.registry.get_sample_value(name, labels or {}) or 0.0


def _setup(tmp_path: Path) -> tuple[MemoryBroker, ServiceConfig]:
    broker = MemoryBroker()
    config = _config(tmp_path)
    broker.create_topics(config)
    _produce(broker, config, 0, 6)
    return broker, config


def test_an_assignment_whose_restore_outlasts_the_deadline_waits_and_then_folds(
    tmp_path: Path, down: type[Down]
) -> None:
    broker, config = _setup(tmp_path)
    down.down = True
    run = Run(broker, config)
    # every partition put off twice: tried again after its back-off, still down
    _wait(
        lambda: run.sample("processor_restore_waits_total") >= 2 * config.partitions,
        run,
        "restores put off",
    )
    assert run.thread.is_alive() and not run.errors, run.errors
    # /readyz names every cause: while a try's retries last (the loop keeps
    # trying) the call being retried first, and the partitions put off before
    # it too (one cause used to hide the other)
    put_off = f"restore of {config.topics.checkpoints}["
    seen: list[str] = []

    def both() -> bool:
        seen.append(run.metrics.health.readiness()[1].decode())
        lines = seen[-1].splitlines()
        return (
            lines[0].startswith("not ready: waiting ")
            and "for the broker: watermarks of" in lines[0]
            and any(line.startswith(f"also: {put_off}") for line in lines[1:])
        )

    _wait(both, run, "/readyz names the retried call and the put-off")
    assert "_TRANSPORT: broker restarting" in seen[-1], seen[-1]
    status, body = run.metrics.health.readiness()
    assert status == 503, body
    assert down.made >= 3  # a new restore consumer for each try
    retried = run.sample(
        "processor_kafka_retries_total",
        {"call": f"watermarks of {config.topics.checkpoints}", "code": "_TRANSPORT"},
    )
    assert retried > 0
    assert _committed(broker, config) is False  # nothing folded while put off
    down.down = False
    _wait(lambda: _committed(broker, config), run, "all committed")
    assert run.metrics.health.readiness() == (200, b"ready\n")
    run.stop()
    assert not run.errors, run.errors
    _assert_folded(broker, config, 6)


def test_a_rewind_whose_restore_outlasts_the_deadline_waits_and_refolds_from_the_commit(
    tmp_path: Path, down: type[Down]
) -> None:
    """An abort's rewind restores synchronously; put off, its partitions are paused
    and, once restored, sought back to the committed offset (the aborted batch is
    folded again, nothing lost, nothing twice)."""
    broker, config = _setup(tmp_path)
    run = Run(broker, config)
    _wait(lambda: _committed(broker, config), run, "first batch committed")
    down.down = True
    broker.fail(
        "commit_transaction",
        KafkaError(KafkaError._TIMED_OUT, "commit lost", txn_requires_abort=True),
    )
    _produce(broker, config, 6, 12)
    _wait(
        lambda: run.sample("processor_restore_waits_total") > 0,
        run,
        "the rewind's restore put off",
    )
    assert run.thread.is_alive() and not run.errors, run.errors
    assert run.metrics.health.readiness()[0] == 503
    down.down = False
    _wait(lambda: _committed(broker, config), run, "all committed")
    run.stop()
    assert not run.errors, run.errors
    assert run.sample("processor_transaction_aborts_total") >= 1
    _assert_folded(broker, config, 12)
