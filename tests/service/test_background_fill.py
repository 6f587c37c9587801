"""A fresh host fills its store in the background (issue 13): broker-less.

The ``Processor`` loop on the in-memory cluster.  A large checkpoints backlog
sits on one partition; its fill is held at a gate (``BackgroundFill.step``
does nothing while only that partition is left) so the order is proven by
what was committed at that point, never by time.  Every scenario ends with
the views equal to the offline fold.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from processor.config import ServiceConfig
from processor.service.partitions.background_fill import BackgroundFill
from processor.service.store import mirror_fill
from processor.service.store.checkpoint_store import CheckpointStore, Filled
from processor.testing.memory import MemoryBroker, MemoryConsumer, MemoryTransport
from tests.service.test_memory_transport import Loop, _committed, _wait
from tests.service.test_state_store import _assert_folded, _config, _produce

BIG = 1  # the partition with the checkpoints backlog
BACKLOG = 3_000


class Gate:
    """Holds the fill of ``BIG`` once it is the only fill left, until opened."""

    def __init__(self) -> None:
        self.open = False
        self.held = 0  # steps that found only BIG left (the loop kept running)

    def step(self, fill: BackgroundFill, real: Any) -> dict[int, Filled]:
        if not self.open and set(fill.jobs) == {BIG}:
            self.held += 1
            return {}
        result: dict[int, Filled] = real(fill)
        return result


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    g = Gate()
    real = BackgroundFill.step
    monkeypatch.setattr(BackgroundFill, "step", lambda self: g.step(self, real))
    monkeypatch.setattr(mirror_fill, "FILL_SLICE", 200)  # many slices
    yield g


def _backlog(broker: MemoryBroker, config: ServiceConfig) -> None:
    """Tombstones of sessions that never were: read and applied, change nothing."""
    for i in range(BACKLOG):
        broker.append(config.topics.checkpoints, BIG, f"gone-{i}".encode(), None, "committed")


def _group_offset(broker: MemoryBroker, config: ServiceConfig, p: int) -> int:
    return broker.group_offsets.get((config.group_id, config.topics.events, p), 0)


def _high(broker: MemoryBroker, config: ServiceConfig, p: int) -> int:
    return broker.log(config.topics.events, p).high


def _fresh_host(
    tmp_path: Path, gate: Gate | None = None
) -> tuple[MemoryBroker, ServiceConfig, ServiceConfig]:
    """A first member folded events 0..6; the fresh host has an empty state directory."""
    if gate is not None:
        gate.open = True  # the first member fills freely
    broker = MemoryBroker()
    first = _config(tmp_path / "a")
    broker.create_topics(first)
    _backlog(broker, first)
    _produce(broker, first, 0, 6)
    loop = Loop(broker, first)
    _wait(lambda: _committed(broker, first), loop, "first member committed")
    loop.stop()
    assert not loop.errors, loop.errors
    _produce(broker, first, 6, 12)
    if gate is not None:
        gate.open = False
    return broker, first, _config(tmp_path / "b")


def test_a_filling_partition_does_not_hold_back_its_neighbour(tmp_path: Path, gate: Gate) -> None:
    broker, _, config = _fresh_host(tmp_path, gate)
    small = 1 - BIG
    assert _high(broker, config, small) > _group_offset(broker, config, small)
    held_at = _group_offset(broker, config, BIG)
    loop = Loop(broker, config)
    # the neighbour folds and commits everything while BIG is still filling
    _wait(
        lambda: _group_offset(broker, config, small) >= _high(broker, config, small),
        loop,
        "neighbour committed",
    )
    assert gate.held > 0 and not gate.open
    assert loop.sample("processor_partitions_filling") == 1
    assert loop.metrics.health.readiness() == (200, b"ready; filling 1 partitions\n")
    # nothing of the filling partition was folded: it is paused
    assert _group_offset(broker, config, BIG) == held_at < _high(broker, config, BIG)
    gate.open = True
    _wait(lambda: _committed(broker, config), loop, "all committed")
    assert loop.sample("processor_partitions_filling") == 0
    assert loop.metrics.health.readiness() == (200, b"ready\n")
    loop.stop()
    assert not loop.errors, loop.errors
    assert loop.sample("processor_store_records_read_total") >= BACKLOG
    _assert_folded(broker, config, 12)


def test_a_revoke_during_a_fill_cancels_it_and_the_next_one_catches_up(
    tmp_path: Path, gate: Gate
) -> None:
    broker, _, config = _fresh_host(tmp_path, gate)
    small = 1 - BIG
    before = len(broker.committed_records(config.topics.checkpoints))
    loop = Loop(broker, config)
    _wait(
        lambda: (
            gate.held > 0 and _group_offset(broker, config, small) >= _high(broker, config, small)
        ),
        loop,
        "BIG held, the neighbour committed",
    )
    partial = loop.sample("processor_store_records_read_total")
    loop.stop()  # the close revokes every partition, BIG mid-fill
    assert not loop.errors, loop.errors
    assert loop.sample("processor_partitions_filling") == 0
    revokes = loop.metrics.registry.get_sample_value(
        "processor_rebalances_total", {"kind": "revoke"}
    )
    assert revokes == 1
    assert _group_offset(broker, config, BIG) < _high(broker, config, BIG)
    # the store kept the applied slices: the next member reads only the rest
    gate.open = True
    again = Loop(broker, config)
    _wait(lambda: _committed(broker, config), again, "all committed")
    again.stop()
    assert not again.errors, again.errors
    assert 0 < partial < BACKLOG
    read_again = again.sample("processor_store_records_read_total")
    # every record of the topic was read exactly once across the two fills
    assert read_again + partial == before
    _assert_folded(broker, config, 12)


class FlakyConsumer(MemoryConsumer):
    """The fill's consumer: its first ``failures`` reads fail (a broker refusing)."""

    failures = 0

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        if FlakyConsumer.failures > 0:
            FlakyConsumer.failures -= 1
            raise KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "refused"))
        return super().consume(num_messages, timeout)


def _flaky(monkeypatch: pytest.MonkeyPatch, failures: int) -> None:
    real = MemoryTransport.plain_consumer

    def plain(self: MemoryTransport, purpose: str, problems: Any, group: str) -> MemoryConsumer:
        if purpose == "fill":
            return FlakyConsumer(self.broker, group, eof=True)
        return real(self, purpose, problems, group)

    FlakyConsumer.failures = failures
    monkeypatch.setattr(MemoryTransport, "plain_consumer", plain)


def test_a_failing_fill_is_reported_and_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker, _, config = _fresh_host(tmp_path)
    _flaky(monkeypatch, mirror_fill.MAX_ATTEMPTS - 1)
    loop = Loop(broker, config)
    _wait(lambda: _committed(broker, config), loop, "all committed")
    loop.stop()
    assert not loop.errors, loop.errors
    # one failed read fails both partitions' fills, each retried from its store position
    failed = loop.sample("processor_fill_failures_total")
    assert failed == config.partitions * (mirror_fill.MAX_ATTEMPTS - 1)
    _assert_folded(broker, config, 12)


def test_a_fill_failing_past_its_bound_ends_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker, _, config = _fresh_host(tmp_path)
    _flaky(monkeypatch, 100)
    loop = Loop(broker, config)
    loop.thread.join(60)
    assert not loop.thread.is_alive()
    assert len(loop.errors) == 1 and "failed 3 times" in str(loop.errors[0]), loop.errors
    # nothing was folded on a partition whose store could not be filled
    assert all(_group_offset(broker, config, p) < _high(broker, config, p) for p in range(2))


def test_an_abort_while_a_partition_fills_rewinds_only_the_folded_ones(
    tmp_path: Path, gate: Gate
) -> None:
    """The neighbour's transaction aborts while BIG is still filling: the rewind
    restores and seeks the neighbour only; BIG stays paused (nothing of it was
    folded, nothing resumed), its fill goes on and ends in its own resume."""
    broker, _, config = _fresh_host(tmp_path, gate)
    small = 1 - BIG
    held_at = _group_offset(broker, config, BIG)
    broker.fail(
        "commit_transaction",
        KafkaError(KafkaError._TIMED_OUT, "commit lost", txn_requires_abort=True),
    )
    loop = Loop(broker, config)
    _wait(
        lambda: (
            gate.held > 0 and _group_offset(broker, config, small) >= _high(broker, config, small)
        ),
        loop,
        "the neighbour committed after its abort",
    )
    assert loop.sample("processor_transaction_aborts_total") == 1
    consumer = loop.proc._consumer
    assert isinstance(consumer, MemoryConsumer)
    events = config.topics.events
    # still filling, still paused, nothing of it folded or committed
    assert loop.proc.rebalance.fill.filling == {BIG}
    assert (events, BIG) in consumer.paused and (events, small) not in consumer.paused
    assert BIG not in loop.proc.engine.partitions
    assert _group_offset(broker, config, BIG) == held_at
    gate.open = True
    _wait(lambda: _committed(broker, config), loop, "all committed")
    assert not consumer.paused  # resumed once filled, never left paused
    loop.stop()
    assert not loop.errors, loop.errors
    _assert_folded(broker, config, 12)


def _one_partition(tmp_path: Path) -> tuple[MemoryBroker, CheckpointStore]:
    """500 checkpoint records of 20 keys on partition 0, and an open empty store."""
    from processor.codec import default_codec

    config = _config(tmp_path)
    broker = MemoryBroker()
    broker.create_topics(config)
    for i in range(500):
        key = f"k{i % 20}".encode()
        broker.append(config.topics.checkpoints, 0, key, f"v{i}".encode(), "committed")
    store = CheckpointStore(config, default_codec())
    store.open("c", "t")
    return broker, store


def test_a_partition_revoked_and_assigned_again_mid_fill_reads_each_record_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same member's fill consumer: cancel (revoke) after some slices, then a
    second assignment of the same partition resumes at the store's position; the
    store ends with the last value of every key (nothing applied out of order)."""
    from processor.telemetry.metrics import Metrics

    monkeypatch.setattr(mirror_fill, "FILL_SLICE", 50)
    broker, store = _one_partition(tmp_path)
    topic = store.topic
    metrics = Metrics()
    fill = BackgroundFill(store, metrics, lambda: MemoryConsumer(broker, "g", eof=True))
    verify = MemoryConsumer(broker, "g", eof=True)
    fill.start(verify, [0])
    for _ in range(3):
        assert fill.step() == {}
    fill.cancel([0])  # revoked mid-fill
    partial = metrics.registry.get_sample_value("processor_store_records_read_total")
    assert partial is not None and 0 < partial < 500
    assert metrics.registry.get_sample_value("processor_partitions_filling") == 0
    fill.start(verify, [0])  # assigned again
    assert fill.jobs[0].kept_from == partial  # verified: the applied slices are kept
    done: dict[int, Filled] = {}
    for _ in range(100):
        done = fill.step()
        if done:
            break
    assert set(done) == {0} and done[0].records_read == 500 - partial
    assert metrics.registry.get_sample_value("processor_store_records_read_total") == 500
    db = store.store
    assert db is not None
    for k in range(20):
        last = max(i for i in range(500) if i % 20 == k)
        assert db.session_records(topic, 0, f"k{k}") == [(f"k{k}".encode(), f"v{last}".encode())]
    fill.close()
    store.close()


def test_a_full_disk_while_filling_moves_the_partition_to_memory_and_refills_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store file cannot grow (SQLITE_FULL) while a fresh host fills: the
    run goes on (a restart would fail the same way: a crash loop), the filling
    partition is held in memory, filled again from zero, reported on /readyz and
    in processor_fill_failures_total, and the views equal the offline fold."""
    from processor.service.partitions import background_fill
    from processor.service.store.local_store import LocalStore

    broker, _, config = _fresh_host(tmp_path)
    for i in range(50):  # records that take room while filling, then deleted
        key = f"junk-{i}".encode()
        broker.append(config.topics.checkpoints, BIG, key, b"x" * 10_000, "committed")
        broker.append(config.topics.checkpoints, BIG, key, None, "committed")
    real = LocalStore.__init__

    def small_disk(self: LocalStore, *args: Any) -> None:
        real(self, *args)
        if self.path is not None and "/b/" in str(self.path):
            # the disk has room for the new file (its schema), no more
            pages = self._db.execute("PRAGMA page_count").fetchone()[0]
            self._db.execute(f"PRAGMA max_page_count={pages}")

    monkeypatch.setattr(LocalStore, "__init__", small_disk)
    # every record written, the junk too (a slice applies each key's newest only)
    monkeypatch.setattr(background_fill, "newest", lambda batch: batch)
    loop = Loop(broker, config)
    _wait(lambda: _committed(broker, config), loop, "all committed")
    store = loop.proc.store
    moved = set(store.in_memory)
    assert BIG in moved, store.in_memory
    assert "disk is full" in store.in_memory[BIG]
    assert loop.sample("processor_fill_failures_total") >= len(moved)
    status, body = loop.metrics.health.readiness()
    assert status == 503 and b"held in memory" in body
    loop.stop()
    assert not loop.errors, loop.errors
    _assert_folded(broker, config, 12)


def test_a_fill_slice_never_reads_more_than_its_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FILL_SLICE bounds what one slice reads (and holds) across all partitions."""
    monkeypatch.setattr(mirror_fill, "FILL_SLICE", 200)
    monkeypatch.setattr(mirror_fill, "SLICE_S", 60.0)  # only the count bound cuts
    slices: list[int] = []
    real_init = BackgroundFill.__init__

    def init(self: BackgroundFill, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        self.on_slice = lambda read: slices.append(sum(read.values()))

    broker, _, config = _fresh_host(tmp_path)
    monkeypatch.setattr(BackgroundFill, "__init__", init)  # the fresh host's fill only
    loop = Loop(broker, config)
    _wait(lambda: _committed(broker, config), loop, "all committed")
    loop.stop()
    assert not loop.errors, loop.errors
    assert max(slices) == 200 and len(slices) >= BACKLOG // 200
    assert sum(slices) == loop.sample("processor_store_records_read_total")
    _assert_folded(broker, config, 12)


def test_a_rewind_during_a_fill_does_not_reset_the_fills_restore_time(
    tmp_path: Path, gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """processor_restore_seconds of a partition filled in the background runs from
    its assignment, even when a neighbour's abort rewinds (and restores) meanwhile.
    The rebalance module's clock jumps 1000 s at the rewind (no wall time)."""
    import time as real_time

    from processor.service.partitions import rebalance
    from processor.service.partitions.rebalance import Rebalance

    class Clock:
        extra = 0.0

        @staticmethod
        def monotonic() -> float:
            return real_time.monotonic() + Clock.extra

    monkeypatch.setattr(rebalance, "time", Clock)
    real_rewind = Rebalance.rewind

    def rewind(self: Rebalance, numbers: list[int]) -> None:
        Clock.extra += 1000.0
        real_rewind(self, numbers)

    monkeypatch.setattr(Rebalance, "rewind", rewind)
    broker, _, config = _fresh_host(tmp_path, gate)
    small = 1 - BIG
    broker.fail(
        "commit_transaction",
        KafkaError(KafkaError._TIMED_OUT, "commit lost", txn_requires_abort=True),
    )
    loop = Loop(broker, config)
    _wait(
        lambda: (
            gate.held > 0
            and loop.sample("processor_transaction_aborts_total") == 1
            and _group_offset(broker, config, small) >= _high(broker, config, small)
        ),
        loop,
        "the neighbour rewound and committed",
    )
    gate.open = True
    _wait(lambda: _committed(broker, config), loop, "all committed")
    loop.stop()
    assert not loop.errors, loop.errors

    def over(seconds: str) -> float:
        bucket = loop.metrics.registry.get_sample_value(
            "processor_restore_seconds_bucket", {"le": seconds}
        )
        assert bucket is not None
        return bucket

    # three restores: the neighbour's fill, its rewind, BIG's fill; only BIG's
    # spans the clock's jump (it was assigned before the rewind)
    assert over("+Inf") == 3
    assert over("+Inf") - over("30.0") == 1
    _assert_folded(broker, config, 12)


def _fill_to_end(broker: MemoryBroker, store: CheckpointStore) -> None:
    from processor.telemetry.metrics import Metrics

    fill = BackgroundFill(store, Metrics(), lambda: MemoryConsumer(broker, "g", eof=True))
    done = fill.run(MemoryConsumer(broker, "g", eof=True), [0])
    assert set(done) == {0}


def test_a_fill_applies_each_keys_newest_record_and_ends_as_applying_every_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slice applies the newest record of each key only (a busy session's
    checkpoint is rewritten at every commit); the store ends as if every record
    had been applied in order: the same records, tombstones included, and the
    same position and last-record digest."""
    from processor.codec import default_codec
    from processor.service.partitions import background_fill
    from processor.service.store import checkpoint_store

    monkeypatch.setattr(mirror_fill, "FILL_SLICE", 120)  # several slices
    applied: list[int] = []
    real = checkpoint_store.stored_records

    def counted(codec: Any, batch: Any) -> Any:
        for r in real(codec, batch):
            applied.append(r.offset)
            yield r

    monkeypatch.setattr(background_fill, "stored_records", counted)
    stores: list[tuple[dict[int, Any], tuple[int, int, bytes], int]] = []
    for name, dedupe in (("newest", True), ("every", False)):
        if not dedupe:
            monkeypatch.setattr(background_fill, "newest", lambda batch: batch)
        config = _config(tmp_path / name)
        broker = MemoryBroker()
        broker.create_topics(config)
        for i in range(500):  # 20 keys; every 7th record a tombstone
            value = None if i % 7 == 0 else f"v{i}".encode()
            broker.append(config.topics.checkpoints, 0, f"k{i % 20}".encode(), value, "committed")
        store = CheckpointStore(config, default_codec())
        store.open("c", "t")
        applied.clear()
        _fill_to_end(broker, store)
        db = store.store
        assert db is not None
        rows = {k: db.session_records(store.topic, 0, f"k{k}") for k in range(20)}
        pos = db.position(store.topic, 0)
        assert pos is not None
        stores.append((rows, (pos.next_offset, pos.last_offset, pos.last_digest), len(applied)))
        store.close()
    (rows, at, few), (every_rows, every_at, every) = stores
    assert rows == every_rows and at == every_at
    assert every == 500 and few <= 20 * (500 // 120 + 1)
    for k in range(20):  # the newest record of each key, a tombstone removing it
        last = max(i for i in range(500) if i % 20 == k)
        assert rows[k] == ([] if last % 7 == 0 else [(f"k{k}".encode(), f"v{last}".encode())])
