"""The local store's byte budget, ``store_bytes`` (checkpoint_store.py
``keep_under_budget``): copies of partitions the member does not own are
dropped, least recently written first, until it fits; owned partitions are
never dropped, and alone past it they are reported on ``/readyz``."""

from __future__ import annotations

import threading
from pathlib import Path

from processor.codec import default_codec
from processor.config import ServiceConfig
from processor.service.store.checkpoint_store import CheckpointStore
from processor.service.store.local_store import StoredRecord

TOPIC_ID = "t1"


def _store(tmp_path: Path, budget: int, partitions: int = 3) -> CheckpointStore:
    config = ServiceConfig(partitions=partitions, topic_prefix="b", state_dir=str(tmp_path))
    store = CheckpointStore(config.with_overrides(store_bytes=budget), default_codec())
    store.open("c1", TOPIC_ID)
    return store


def _fill(store: CheckpointStore, partition: int, at: float, sessions: int = 60) -> None:
    """~sessions x 4 KiB of records, written at wall clock ``at``."""
    assert store.store is not None
    store.store._clock = lambda: at
    records = [
        StoredRecord(i, f"s{partition}-{i}".encode(), bytes([65 + partition]) * 4096)
        for i in range(sessions)
    ]
    store.store.apply(store.topic, partition, TOPIC_ID, records, sessions)


def _stored(store: CheckpointStore) -> list[int]:
    assert store.store is not None
    return sorted(p for p, _ in store.store.stored(store.topic))


def test_under_the_budget_nothing_is_dropped_and_the_size_is_reported(tmp_path: Path) -> None:
    store = _store(tmp_path, budget=1 << 30)
    for p in range(3):
        _fill(store, p, at=100.0 + p)
    assert store.keep_under_budget([1, 2]) == []
    assert _stored(store) == [0, 1, 2]
    assert store.budget.gauge._value.get() > 3 * 60 * 4096
    assert store.problem is None
    store.close()


def test_past_the_budget_the_oldest_copies_of_unowned_partitions_go_first(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path, budget=1 << 30)
    _fill(store, 0, at=300.0)  # owned
    _fill(store, 1, at=200.0)  # a copy, written last at 200
    _fill(store, 2, at=100.0)  # a copy, the oldest
    assert store.store is not None
    full = store.store.live_bytes()
    store.budget.limit = full - 30 * 4096  # half a partition too many
    assert store.keep_under_budget([1, 2]) == [2]
    assert _stored(store) == [0, 1]
    assert store.store.live_bytes() <= store.budget.limit
    assert store.problem is None  # what is owned fits
    store.close()


def test_owned_partitions_past_the_budget_are_reported_never_dropped(tmp_path: Path) -> None:
    store = _store(tmp_path, budget=1 << 30)
    _fill(store, 0, at=100.0)
    _fill(store, 1, at=200.0)
    store.budget.limit = 64 * 1024
    assert store.keep_under_budget([1]) == [1]  # the copy goes, still too big
    assert _stored(store) == [0]
    problem = store.problem
    assert problem is not None and "store_bytes" in problem and "owned" in problem
    store.budget.limit = 1 << 30  # raised (a restart with a larger store_bytes)
    assert store.keep_under_budget([]) == [] and store.problem is None
    store.close()


def test_a_copy_with_a_queued_write_is_written_before_it_is_dropped(tmp_path: Path) -> None:
    """A write still queued for a dropped copy would recreate the partition from
    that write alone, its position claiming everything before it: the drop
    waits for the writer first."""
    store = _store(tmp_path, budget=1 << 30)
    _fill(store, 0, at=100.0)
    _fill(store, 1, at=200.0)
    assert store.writer is not None and store.store is not None
    gate = threading.Event()
    write = store.writer._apply

    def gated(writes: list[tuple[int, list[StoredRecord], int]]) -> None:
        gate.wait(60)
        write(writes)

    store.writer._apply = gated
    store.writer.put((1, [StoredRecord(60, b"s1-late", b"x" * 100)], 61))
    store.budget.limit = store.store.live_bytes() - 30 * 4096
    threading.Timer(0.2, gate.set).start()
    assert store.keep_under_budget([1]) == [1]
    assert store.flush(60)
    assert _stored(store) == [0]  # the late write landed before the drop, not after
    store.close()


def test_the_processor_reports_the_store_size_and_the_drops(tmp_path: Path) -> None:
    """Wired: the gauge and the counter of the member's metrics; the rebalance's
    check skips owned and filling partitions and the standby does not refill a
    dropped copy until the assignment changes."""
    from processor.service.loop.runner import Processor
    from processor.telemetry.metrics import Metrics
    from processor.testing.memory import MemoryBroker, MemoryTransport

    config = ServiceConfig(partitions=3, topic_prefix="sb", state_dir=str(tmp_path))
    config = config.with_overrides(standby_s=5.0)
    broker = MemoryBroker()
    broker.create_topics(config)
    metrics = Metrics()
    proc = Processor(config, metrics=metrics, transport=MemoryTransport(broker, config))
    store = proc.store
    store.open("cluster", TOPIC_ID)
    for p in range(3):
        _fill(store, p, at=100.0 + p)
    rebalance = proc.rebalance
    rebalance.partition_count = 3
    assert store.store is not None
    store.budget.limit = store.store.live_bytes() - 30 * 4096
    rebalance.keep_store_under_budget(now=1000.0)
    assert _stored(store) == [1, 2]  # partition 0's copy was the oldest
    dropped = metrics.registry.get_sample_value("processor_store_copies_dropped_total")
    assert dropped == 1
    size = metrics.registry.get_sample_value("processor_store_bytes")
    assert size is not None and 0 < size <= store.budget.limit
    assert rebalance._kept_warm() == [1, 2]  # not refilled by the standby
    rebalance.keep_store_under_budget(now=1001.0)  # within BUDGET_EVERY_S: not measured
    store.close(10)
