"""The local store's writer thread (issue 13): ordered, bounded, never stale."""

from __future__ import annotations

import threading
from pathlib import Path

from processor.codec import default_codec
from processor.config import ServiceConfig
from processor.engine import PartitionState
from processor.service.store.checkpoint_store import CheckpointStore
from processor.service.store.local_store import StoredRecord
from processor.service.store.mirror_writer import MirrorWriter
from processor.testing.memory import MemoryMessage

Write = tuple[int, list[StoredRecord], int]


def _keys(write: Write) -> list[tuple[int, bytes]]:
    return [(write[0], r.key) for r in write[1]]


def test_a_full_queue_makes_the_loop_wait_and_drops_nothing() -> None:
    gate = threading.Event()
    applied: list[int] = []

    def apply(writes: list[Write]) -> None:
        gate.wait(60)
        applied.extend(next_offset for _, _, next_offset in writes)

    writer: MirrorWriter[Write] = MirrorWriter("w", apply, depth=1, keys=_keys)
    writer.put((0, [StoredRecord(0, b"a", b"1")], 1))  # taken by the thread, held at the gate
    writer.put((0, [StoredRecord(1, b"b", b"1")], 2))  # queued: the queue is full now
    assert writer.pending((0, b"a")) and writer.pending((0, b"b"))
    third = threading.Thread(target=writer.put, args=((0, [StoredRecord(2, b"c", b"1")], 3),))
    third.start()
    third.join(0.5)
    assert third.is_alive()  # back-pressure: waits for room
    gate.set()
    third.join(60)
    assert writer.flush(60) and writer.full >= 1  # counted (reported)
    assert applied == [1, 2, 3]  # commit order, nothing dropped
    assert not writer.pending((0, b"c"))
    assert writer.close(10)


def test_a_session_with_queued_records_is_loaded_after_they_are_written(tmp_path: Path) -> None:
    """An evicted session reloaded while its last commit is still queued must
    not be read from the store as it was before that commit."""
    config = ServiceConfig(partitions=1, topic_prefix="w", state_dir=str(tmp_path))
    store = CheckpointStore(config, default_codec())
    store.open("c1", "t1")
    assert store.writer is not None
    gate = threading.Event()
    write = store.writer._apply

    def gated(writes: list[Write]) -> None:
        gate.wait(60)
        write(writes)

    store.writer._apply = gated
    store.produced(0, b"s1", b"not-a-checkpoint")
    store.delivered(None, MemoryMessage(config.topics.checkpoints, 0, 0, b"s1", b"x", 0))
    store.committed({0: PartitionState(0)})
    assert store.writer.pending((0, b"s1"))
    loaded: list[int] = []
    loader = threading.Thread(target=lambda: loaded.append(store.load(0, "s1")[1]))
    loader.start()
    loader.join(0.5)
    assert loader.is_alive() and not loaded  # waits for the writer, does not read stale
    gate.set()
    loader.join(60)
    assert loaded == [len(b"not-a-checkpoint")]  # the record it waited for
    store.close()


def test_a_full_write_queue_is_counted_in_the_metric(tmp_path: Path) -> None:
    """The bound ``store_write_queue`` reports when hit: the processor's metric."""
    from processor.service.loop.runner import Processor
    from processor.telemetry.metrics import Metrics
    from processor.testing.memory import MemoryBroker, MemoryTransport

    config = ServiceConfig(partitions=1, topic_prefix="wq", state_dir=str(tmp_path))
    config = config.with_overrides(store_write_queue=1)
    broker = MemoryBroker()
    broker.create_topics(config)
    metrics = Metrics()
    proc = Processor(config, metrics=metrics, transport=MemoryTransport(broker, config))
    gate = threading.Event()
    real = proc.store._write_all

    def held(writes: list[Write]) -> None:
        gate.wait(60)
        real(writes)

    proc.store._write_all = held  # type: ignore[method-assign]
    proc.store.open("cluster", "topic-id")
    writer = proc.store.writer
    assert writer is not None
    writer.put((0, [StoredRecord(0, b"a", b"1")], 1))  # taken by the thread, held
    writer.put((0, [StoredRecord(1, b"b", b"1")], 2))  # queued: full
    third = threading.Thread(target=writer.put, args=((0, [StoredRecord(2, b"c", b"1")], 3),))
    third.start()
    deadline = threading.Event()
    for _ in range(600):  # the third put found the queue full (no time asserted)
        if writer.full:
            break
        deadline.wait(0.1)
    gate.set()
    third.join(60)
    full = metrics.registry.get_sample_value("processor_store_write_queue_full_total")
    assert full is not None and full == writer.full >= 1
    proc.store.close(10)


def test_a_write_failing_on_the_writer_thread_never_changes_what_the_loop_iterates(
    tmp_path: Path,
) -> None:
    """The writer thread marks a partition broken while the loop walks the broken
    ones (eviction pins their sessions): the walk must not see the dict change
    (``RuntimeError: dictionary changed size during iteration`` ended the run)."""
    import sqlite3

    config = ServiceConfig(partitions=2, topic_prefix="w", state_dir=str(tmp_path))
    store = CheckpointStore(config, default_codec())
    store.open("c1", "t1")
    assert store.writer is not None
    store._break(0, "an earlier write failed")
    walk = iter(store.broken)  # the loop, mid-iteration
    assert next(walk) == 0

    def full(partition: int, records: list[StoredRecord], next_offset: int) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    store._apply = full  # type: ignore[method-assign]
    store.writer.put((1, [StoredRecord(0, b"s1", b"x")], 1))
    assert store.flush(60)
    assert 1 in store.broken and "disk is full" in store.broken[1]
    assert list(walk) == []  # the loop's walk ends as it began
    assert store.problem is not None
    store.close()
