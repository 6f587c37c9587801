"""``run(max_idle_s=...)`` ends only once every partition is fetched to its end (idle.py).

The run used to count idle time from the assignment: a first fetch slower
than the window (a loaded box) ended a batch run having folded nothing.  In
memory, a delayed first fetch is a stalled partition (``MemoryBroker.stall``)
that a timer releases; the Kafka test is in ``test_processor.py``.
"""

from __future__ import annotations

import logging
import threading

import pytest
from confluent_kafka import OFFSET_INVALID, TopicPartition

from processor.codec import default_codec
from processor.config import ServiceConfig
from processor.engine import PartitionState
from processor.engine.commands import partition_of, redrive
from processor.service.loop.idle import IdleClock, behind_end, default_max_wait_s
from processor.service.loop.runner import Processor
from processor.telemetry.metrics import Metrics
from processor.testing.memory import MemoryBroker, MemoryConsumer, MemoryProducer, MemoryTransport
from tests.engine.kit import session_log

CODEC = default_codec()
CONFIG = ServiceConfig(partitions=2, topic_prefix="idle", commit_interval_ms=20)
EVENTS = CONFIG.topics.events
LOG = session_log(12, seed=5)


def _sid(partition: int) -> str:
    """A session id whose events land in ``partition``."""
    sids = (f"s{i}" for i in range(1000))
    return next(s for s in sids if partition_of(s.encode(), CONFIG.partitions) == partition)


def _broker() -> MemoryBroker:
    broker = MemoryBroker()
    broker.create_topics(CONFIG)
    return broker


def _produce(broker: MemoryBroker, partition: int) -> int:
    sid = _sid(partition)
    for event in LOG:
        broker.produce(EVENTS, sid.encode(), CODEC.encode_parsed_event(sid, event))
    return len(LOG)


def _run(broker: MemoryBroker, **kwargs: float) -> Processor:
    """One run on its own thread (a hang fails the test instead of the suite)."""
    proc = Processor(CONFIG, metrics=Metrics(), transport=MemoryTransport(broker, CONFIG))
    errors: list[BaseException] = []

    def run() -> None:
        try:
            proc.run(**kwargs)  # type: ignore[arg-type]
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    if thread.is_alive():
        proc.stop()
        thread.join(60)
        pytest.fail("the run did not end by itself")
    assert not errors, errors
    return proc


def _consumed(proc: Processor) -> float:
    return proc.metrics.registry.get_sample_value("processor_records_consumed_total") or 0.0


def test_a_first_fetch_slower_than_the_window_still_folds_everything() -> None:
    broker = _broker()
    total = _produce(broker, 0) + _produce(broker, 1)
    broker.stall(EVENTS, 0)  # partition 0's fetches deliver nothing ...
    timer = threading.Timer(0.5, broker.unstall, (EVENTS, 0))  # ... for ten windows
    timer.start()
    try:
        proc = _run(broker, max_idle_s=0.05)
    finally:
        timer.cancel()
    assert _consumed(proc) == total
    committed = {p: broker.group_offsets.get((CONFIG.group_id, EVENTS, p)) for p in (0, 1)}
    assert committed == {0: len(LOG), 1: len(LOG)}
    # a restart at the committed end reads nothing: its positions stay unknown,
    # where it resumed is the end
    again = _run(broker, max_idle_s=0.05, max_wait_s=600)  # a wait would outlast the join
    assert _consumed(again) == 0


def test_a_command_whose_first_fetch_is_slower_than_the_window_is_read() -> None:
    """The control partitions count too: a redrive waiting there is taken."""
    broker = _broker()
    _produce(broker, 0)
    sid, control = _sid(0), CONFIG.topics.control
    broker.produce(control, sid.encode(), redrive(sid, 1).encode())  # partition 0 too
    broker.stall(control, 0, readers=True)
    timer = threading.Timer(0.5, broker.unstall, (control, 0))
    timer.start()
    try:
        _run(broker, max_idle_s=0.05)
    finally:
        timer.cancel()
    assert broker.group_offsets.get((CONFIG.group_id, control, 0)) == 1  # read and committed


def test_a_partition_that_never_reaches_its_end_ends_the_run_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker = _broker()
    _produce(broker, 0)
    other = _produce(broker, 1)
    broker.stall(EVENTS, 0)  # never released: a partition the broker cannot serve
    with caplog.at_level(logging.WARNING, "processor.service.loop"):
        proc = _run(broker, max_idle_s=0.05, max_wait_s=0.3)
    assert _consumed(proc) == other  # the servable partition was folded
    warned = [r.getMessage() for r in caplog.records if "never reached its end" in r.getMessage()]
    assert len(warned) == 1 and f"{EVENTS}[0] never" in warned[0], warned
    assert f"{EVENTS}[1]" not in warned[0]


def test_a_committed_transaction_marker_and_an_empty_partition_count_as_at_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker = _broker()
    producer = MemoryProducer(broker, "writer")
    producer.init_transactions()
    producer.begin_transaction()
    sid = _sid(0)
    for event in LOG:
        producer.produce(EVENTS, CODEC.encode_parsed_event(sid, event), sid.encode())
    producer.commit_transaction()  # the log ends with the commit marker; partition 1 is empty
    with caplog.at_level(logging.WARNING, "processor.service.loop"):
        first = _run(broker, max_idle_s=0.05, max_wait_s=600)  # a wait would outlast the join
        # a restart resumes at the marker (the offset after the last record): its
        # fetch steps over it without a record, as librdkafka's does
        second = _run(broker, max_idle_s=0.05, max_wait_s=600)
    assert _consumed(first) == len(LOG) and _consumed(second) == 0
    assert broker.group_offsets[(CONFIG.group_id, EVENTS, 0)] == len(LOG)  # the marker's offset
    assert not [r for r in caplog.records if "never reached" in r.getMessage()]


# ---------------------------------------------------------------- the pieces


def test_behind_end_reads_the_cached_watermark_and_the_resume_offset() -> None:
    broker = _broker()
    _produce(broker, 0)
    member = MemoryConsumer(broker, CONFIG.group_id, eof=False)
    member.subscribe([EVENTS])
    member.incremental_assign([TopicPartition(EVENTS, 0), TopicPartition(EVENTS, 1)])
    parts = {0: PartitionState(0), 1: PartitionState(1)}
    # before the first fetch neither watermark is known: both short of their end
    unknown = (OFFSET_INVALID, OFFSET_INVALID)
    assert behind_end(member, EVENTS, parts) == {f"{EVENTS}[0]": unknown, f"{EVENTS}[1]": unknown}
    broker.stall(EVENTS, 0)
    assert member.consume(100, 0) == []  # the fetch answers the watermarks, no records
    assert behind_end(member, EVENTS, parts) == {f"{EVENTS}[0]": (0, len(LOG))}  # 1 is empty
    parts[0].resumed_at = len(LOG)  # the group had committed its end
    assert behind_end(member, EVENTS, parts) == {}


def test_the_idle_clock_counts_only_at_the_end_and_bounds_the_wait() -> None:
    clock = IdleClock(1.0, None, now=0.0)
    assert clock.max_wait_s == default_max_wait_s(1.0) == 60.0
    stuck, moved = {"t[0]": (3, 9)}, {"t[0]": (5, 9)}
    assert not clock.over(0.5, stuck)
    assert not clock.over(50.0, moved)  # it moved: the wait starts again
    assert not clock.over(100.0, moved)
    assert not clock.over(100.5, {})  # at its end: idle counts from 100.0
    assert clock.over(101.5, {})
    clock.busy(200.0)
    assert not clock.over(201.0, {})
    assert not clock.over(202.0, stuck)
    assert clock.over(262.5, stuck)  # no movement for longer than the bound
