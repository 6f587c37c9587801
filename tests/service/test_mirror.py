"""The mirror of a compacted topic (store/mirror_*.py): its contract, apart from
the two mirrors that use it (the checkpoint store, the query cache).

Pure: the writer thread, the SQLite file and its budget against a temp file,
the fill against the in-memory cluster.  Kafka: the fill against the shared
broker, a real consumer reading a real partition to its end.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from prometheus_client import CollectorRegistry, Gauge

from processor.kafka.transport import Msg, Reader
from processor.service.store import mirror_db, mirror_fill
from processor.service.store.mirror_fill import FillJob, MirrorFill
from processor.service.store.mirror_writer import MirrorWriter
from processor.testing.memory import MemoryBroker, MemoryConsumer, MemoryMessage

TOPIC = "mirror-topic"

# ------------------------------------------------------------ the writer


def test_the_writer_applies_in_order_in_batches_and_says_what_is_pending() -> None:
    gate = threading.Event()
    applied: list[list[int]] = []

    def apply(items: list[int]) -> None:
        gate.wait(60)
        applied.append(items)

    writer: MirrorWriter[int] = MirrorWriter("w", apply, depth=10, batch=3, keys=lambda i: [i % 2])
    for i in range(7):
        writer.put(i)
    assert writer.pending(0) and writer.pending(1) and not writer.pending(2)
    gate.set()
    assert writer.flush(60)
    assert [i for batch in applied for i in batch] == list(range(7))  # commit order
    assert all(len(batch) <= 3 for batch in applied)
    assert not writer.pending(0) and not writer.pending(1)
    assert writer.close(10)


def test_a_full_writer_queue_holds_the_putter_and_is_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = threading.Event()
    applied: list[int] = []
    full: list[int] = []

    taken = threading.Event()

    def apply(items: list[int]) -> None:
        taken.set()
        gate.wait(60)
        applied.extend(items)

    writer: MirrorWriter[int] = MirrorWriter("w", apply, depth=1, on_full=lambda: full.append(1))
    writer.put(0)
    assert taken.wait(60)  # taken by the thread, held at the gate
    writer.put(1)  # queued: full
    with caplog.at_level(logging.WARNING):
        third = threading.Thread(target=writer.put, args=(2,))
        third.start()
        third.join(0.5)
        assert third.is_alive()  # back-pressure: it waits for room
        gate.set()
        third.join(60)
    assert writer.flush(60) and applied == [0, 1, 2]  # nothing dropped
    assert full == [1] and writer.full == 1  # the bound's hit reported (the metric)
    assert "w: write queue full (1 commits)" in caplog.text  # and logged
    writer.close(10)


def test_a_failing_apply_is_the_mirrors_to_judge_and_the_writer_goes_on() -> None:
    errors: list[str] = []
    applied: list[int] = []

    def apply(items: list[int]) -> None:
        if items == [1]:
            raise sqlite3.OperationalError("database or disk is full")
        applied.extend(items)

    writer: MirrorWriter[int] = MirrorWriter(
        "w", apply, depth=10, on_error=lambda exc: errors.append(str(exc))
    )
    for i in range(3):
        writer.put(i)
    assert writer.flush(60)
    assert applied == [0, 2] and errors == ["database or disk is full"]
    writer.close(10)


def test_a_close_within_its_deadline_says_what_was_left_and_takes_no_more() -> None:
    gate = threading.Event()

    def apply(items: list[int]) -> None:
        gate.wait(60)

    writer: MirrorWriter[int] = MirrorWriter("w", apply, depth=10)
    writer.put(0)
    writer.put(1)
    assert writer.close(0.1) is False  # the store is behind: caught up on assign
    gate.set()
    writer.put(2)  # after close: returns at once, nothing queued
    assert not writer.pending(2)


# ------------------------------------------------------------ the file and its budget


def test_a_transaction_is_all_or_nothing(tmp_path: Path) -> None:
    db = mirror_db.connect(tmp_path / "m.sqlite", cache_kib=1024, durable=False, autocommit=True)
    db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY)")
    with mirror_db.transaction(db):
        db.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(sqlite3.IntegrityError), mirror_db.transaction(db):
        db.execute("INSERT INTO t VALUES (2)")
        db.execute("INSERT INTO t VALUES (1)")
    assert db.execute("SELECT k FROM t").fetchall() == [(1,)]
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()
    mirror_db.remove_files(tmp_path / "m.sqlite")
    assert list(tmp_path.iterdir()) == []


def test_the_byte_budget_measures_live_bytes_reports_them_and_says_when_passed(
    tmp_path: Path,
) -> None:
    gauge = Gauge("mirror_test_bytes", "live bytes", registry=CollectorRegistry())
    db = mirror_db.connect(tmp_path / "b.sqlite", cache_kib=1024, durable=True)
    db.execute("CREATE TABLE t (v BLOB)")
    budget = mirror_db.ByteBudget(64 * 1024, gauge)
    assert not budget.passed(db)
    with db:
        db.executemany("INSERT INTO t VALUES (?)", [(b"x" * 1000,)] * 200)
    assert budget.passed(db)
    assert gauge._value.get() == mirror_db.live_bytes(db) > 64 * 1024  # reported
    with db:
        db.execute("DELETE FROM t")
    assert not budget.passed(db)  # freed pages are not live
    db.close()


# ------------------------------------------------------------ the fill


class DictFill(MirrorFill):
    """A mirror in a dict: the latest value of each key, with what was counted."""

    def __init__(self, reader: Any, clock: Any = None, stall_s: float = 120.0) -> None:
        if clock is None:
            super().__init__(TOPIC, reader, stall_s=stall_s)
        else:
            super().__init__(TOPIC, reader, clock, stall_s)
        self.rows: dict[bytes, bytes | None] = {}
        self.positions: dict[int, int] = {}
        self.waits = self.failures = self.read = 0
        self.gone: list[str] = []

    def _write(self, job: FillJob, batch: list[Msg], next_offset: int) -> bool:
        for m in batch:
            self.rows[m.key() or b""] = m.value()
        self.positions[job.partition] = next_offset
        return True

    def _counted_waits(self, count: int) -> None:
        self.waits += count

    def _counted_failure(self) -> None:
        self.failures += 1

    def _counted_read(self, count: int) -> None:
        self.read += count

    def _failed_for_good(self, partition: int, why: str) -> None:
        self.gone.append(why)
        super()._failed_for_good(partition, why)


def _broker(records: int, keys: int = 10) -> MemoryBroker:
    broker = MemoryBroker()
    broker.create_topic(TOPIC, 2)
    for i in range(records):
        broker.append(TOPIC, 0, f"k{i % keys}".encode(), f"v{i}".encode(), "committed")
    return broker


def _drive(fill: MirrorFill, steps: int = 1000) -> dict[int, FillJob]:
    for _ in range(steps):
        done = fill.step()
        if done:
            return done
    raise AssertionError("the fill never ended")


def test_the_fill_reads_from_the_position_to_the_end_in_bounded_slices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(mirror_fill, "FILL_SLICE", 40)
    broker = _broker(300)
    fill = DictFill(lambda: MemoryConsumer(broker, "g", eof=True))
    slices: list[int] = []
    fill.on_slice = lambda read: slices.append(read[0])
    fill.open([FillJob(0, 100, 300, 100)])  # the mirror holds the first 100 already
    done = _drive(fill)
    assert set(done) == {0} and done[0].read == 200 and fill.read == 200
    assert max(slices) <= 40 and sum(slices) == 200  # bounded slices
    assert fill.positions[0] == 300 and fill.jobs == {}
    assert fill.rows == {f"k{k}".encode(): f"v{290 + k}".encode() for k in range(10)}
    assert fill._reader is None  # the consumer lives while it reads something


class Failing(MemoryConsumer):
    """Raises ``error`` on every read (a broker away, or a refusal)."""

    error = KafkaError(KafkaError._TRANSPORT, "broker away")

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        raise KafkaException(self.error)


def test_a_transient_read_error_puts_the_fill_off_and_a_new_consumer_resumes_it() -> None:
    broker = _broker(50)
    now = [0.0]
    made: list[MemoryConsumer] = []

    def reader() -> Reader:
        made.append(
            Failing(broker, "g", eof=True) if not made else MemoryConsumer(broker, "g", eof=True)
        )
        return made[-1]

    fill = DictFill(reader, clock=lambda: now[0])
    fill.open([FillJob(0, 0, 50, None)])
    assert fill.step() == {}
    job = fill.jobs[0]
    assert job.retry_at == mirror_fill.WAIT_FIRST_S and fill.waits == 1
    assert job.problem is not None and "broker away" in job.problem  # named
    assert fill.due() == []
    now[0] = mirror_fill.WAIT_FIRST_S
    assert fill.due() == [0]
    fill.open([FillJob(0, 0, 50, None)])  # the driver opens it again
    assert fill.jobs[0].waits == 1  # its back-off goes on until it progresses
    done = _drive(fill)
    assert done[0].read == 50 and len(made) == 2  # a new consumer, never the stuck one


def test_a_fill_without_progress_is_put_off_after_the_stall_bound() -> None:
    broker = _broker(0)
    now = [0.0]
    fill = DictFill(lambda: MemoryConsumer(broker, "g", eof=False), lambda: now[0], stall_s=10)
    fill.open([FillJob(0, 0, 5, None)])  # an end the partition never reaches here
    assert fill.step() == {}
    now[0] = 11.0
    assert fill.step() == {}
    assert fill.jobs[0].retry_at is not None and fill.waits == 1
    assert "stalled: no progress for 10 s" in (fill.jobs[0].problem or "")


def test_a_permanent_read_error_ends_the_fill_after_its_attempts() -> None:
    broker = _broker(20)

    class Refused(Failing):
        error = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied")

    fill = DictFill(lambda: Refused(broker, "g", eof=True))
    fill.open([FillJob(0, 0, 20, None)])
    for _ in range(mirror_fill.MAX_ATTEMPTS):
        assert fill.step() == {}
    assert fill.failures == mirror_fill.MAX_ATTEMPTS and len(fill.gone) == 1
    assert f"failed {mirror_fill.MAX_ATTEMPTS} times" in fill.gone[0]
    assert fill.jobs == {}  # the default: the job is dropped (a mirror may raise instead)


def test_a_cancelled_fill_applies_nothing_of_what_its_consumer_prefetched() -> None:
    broker = _broker(100)
    fill = DictFill(lambda: MemoryConsumer(broker, "g", eof=True))
    fill.open([FillJob(0, 0, 100, None)])
    fill.cancel([0])
    assert fill.step() == {} and fill.rows == {} and fill._reader is None


def test_an_end_below_the_end_read_before_is_not_the_end() -> None:
    broker = _broker(30)

    class StaleEnd(MemoryConsumer):
        reads = 0

        def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
            self.reads += 1
            if self.reads == 1:  # a lagging leader's end at the position
                eof = KafkaError(KafkaError._PARTITION_EOF)
                return [MemoryMessage(TOPIC, 0, 0, error=eof)]
            return super().consume(num_messages, timeout)

    fill = DictFill(lambda: StaleEnd(broker, "g", eof=True))
    fill.open([FillJob(0, 0, 30, None)])
    done = _drive(fill)
    assert done[0].read == 30 and len(fill.rows) == 10  # nothing skipped


# ------------------------------------------------------------ against the broker


@pytest.mark.kafka
def test_the_fill_reads_a_real_partition_to_its_end(kafka_bootstrap: str) -> None:
    import os
    import time

    from processor.config import ServiceConfig
    from processor.kafka import clients
    from processor.kafka.reads import watermarks
    from processor.kafka.topic_admin import create_topics

    prefix = f"mirror{os.getpid()}x{int(time.time() * 1000) % 100000}"
    config = ServiceConfig(
        bootstrap_servers=kafka_bootstrap, topic_prefix=prefix, group_id=f"{prefix}-g", partitions=2
    )
    create_topics(clients.admin(config), config)
    topic = config.topics.views
    producer = clients.event_producer(config)
    for i in range(1_000):
        producer.produce(topic, key=f"k{i % 37}".encode(), value=f"v{i}".encode(), partition=1)
        producer.poll(0)
    assert producer.flush(60) == 0
    meta = clients.plain_consumer(config, "mirror-test")
    _, high = watermarks(meta, topic, 1)
    meta.close()

    class RealFill(DictFill):
        def __init__(self) -> None:
            super().__init__(lambda: clients.plain_consumer(config, "mirror-test"))
            self.topic = topic

    fill = RealFill()
    fill.open([FillJob(1, 0, high, None)])
    done: dict[int, FillJob] = {}
    for _ in range(3_000):  # slices of at most SLICE_S; bounded, no time asserted
        done = fill.step()
        if done:
            break
    assert set(done) == {1} and done[1].read == 1_000
    assert fill.rows == {
        f"k{k}".encode(): f"v{max(i for i in range(1_000) if i % 37 == k)}".encode()
        for k in range(37)
    }
    fill.close()
