"""The in-memory transport keeps the Kafka semantics the loop relies on (no broker).

First its own rules (read_committed visibility, markers, offsets committed
with a transaction, fencing, the group's hand-over), then the ``Processor``
loop on it through what the contract suite does not reach: a restart that
restores from checkpoints, and the transaction error model (a retriable
commit retried, an abortable one aborted and refolded, a fenced producer
ending the run).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from processor.client.views_reader import (
    _Materializer,
    offline_equivalent,
    session_fold_equivalent,
)
from processor.codec import default_codec
from processor.config import ServiceConfig
from processor.kafka.client_errors import KafkaFatal
from processor.offline import fold_events, session_output
from processor.service.loop.runner import Processor
from processor.telemetry.metrics import Metrics
from processor.testing.memory import MemoryBroker, MemoryConsumer, MemoryProducer, MemoryTransport
from tests.engine.kit import session_log
from tests.service.conftest import as_json
from tests.service.running import RunningProcessor

CODEC = default_codec()
CONFIG = ServiceConfig(partitions=2, topic_prefix="mem")
T = "t"


def _broker(partitions: int = 1) -> MemoryBroker:
    broker = MemoryBroker()
    broker.create_topic(T, partitions)
    return broker


def _read(consumer: MemoryConsumer, n: int = 100) -> list[tuple[int | None, bytes | None]]:
    """(offset, value) of the records ready now; ``None`` value: a partition EOF."""
    return [
        (m.offset(), m.value() if m.error() is None else None)
        for m in consumer.consume(n, timeout=0)
    ]


def _txn_producer(broker: MemoryBroker, txn_id: str = "x") -> MemoryProducer:
    producer = MemoryProducer(broker, txn_id)
    producer.init_transactions()
    return producer


def test_open_transaction_is_invisible_and_holds_the_stable_offset() -> None:
    broker = _broker()
    broker.produce(T, b"k", b"before")
    producer = _txn_producer(broker)
    producer.begin_transaction()
    producer.produce(T, b"open", b"k", partition=0)
    broker.produce(T, b"k", b"after")  # behind the open transaction
    reader = MemoryConsumer(broker, "g", eof=True)
    reader.assign([TopicPartition(T, 0, OFFSET_BEGINNING)])
    assert _read(reader) == [(0, b"before"), (1, None)]
    assert reader.get_watermark_offsets(TopicPartition(T, 0)) == (0, 1)
    producer.commit_transaction()  # the marker takes offset 3
    assert _read(reader) == [(1, b"open"), (2, b"after"), (4, None)]
    assert reader.get_watermark_offsets(TopicPartition(T, 0)) == (0, 4)


def test_a_members_position_and_cached_watermark_are_unknown_until_fetched() -> None:
    """As librdkafka: ``position()`` is unknown after an assignment until a fetch
    moves it; the cached high watermark is the last fetch's (idle.py reads both)."""
    broker = _broker()
    broker.produce(T, b"k", b"a")
    member = MemoryConsumer(broker, "g", eof=False)
    member.subscribe([T])
    tp = TopicPartition(T, 0)
    member.incremental_assign([tp])
    assert member.position([tp])[0].offset < 0
    assert member.get_watermark_offsets(tp, cached=True) == (OFFSET_INVALID, OFFSET_INVALID)
    assert _read(member) == [(0, b"a")]
    broker.produce(T, b"k", b"b")  # not fetched yet: the cache keeps the last answer
    assert member.position([tp])[0].offset == 1
    assert member.get_watermark_offsets(tp, cached=True) == (0, 1)
    assert member.get_watermark_offsets(tp) == (0, 2)


def test_aborted_records_are_skipped_but_keep_their_offsets() -> None:
    broker = _broker()
    producer = _txn_producer(broker)
    producer.begin_transaction()
    producer.produce(T, b"gone", b"k", partition=0)
    producer.abort_transaction()
    broker.produce(T, b"k", b"kept")
    reader = MemoryConsumer(broker, "g", eof=False)
    reader.assign([TopicPartition(T, 0, OFFSET_BEGINNING)])
    assert _read(reader) == [(2, b"kept")]
    assert reader.position([TopicPartition(T, 0)])[0].offset == 3


def test_offsets_sent_to_a_transaction_are_committed_with_it() -> None:
    broker = _broker()
    member = MemoryConsumer(broker, "g", eof=False)
    tp = [TopicPartition(T, 0)]
    producer = _txn_producer(broker)
    for commit, expected in ((False, -1001), (True, 7)):
        producer.begin_transaction()
        producer.send_offsets_to_transaction(
            [TopicPartition(T, 0, 7)], member.consumer_group_metadata()
        )
        assert member.committed(tp)[0].offset == -1001  # not before the commit
        producer.commit_transaction() if commit else producer.abort_transaction()
        assert member.committed(tp)[0].offset == expected


def test_a_new_producer_with_the_same_id_fences_the_old_one() -> None:
    broker = _broker()
    old = _txn_producer(broker)
    old.begin_transaction()
    old.produce(T, b"zombie", b"k", partition=0)
    _txn_producer(broker)  # the restarted instance
    reader = MemoryConsumer(broker, "g", eof=False)
    reader.assign([TopicPartition(T, 0, OFFSET_BEGINNING)])
    assert _read(reader) == []  # its open transaction was aborted
    with pytest.raises(KafkaException) as raised:
        old.commit_transaction()
    err = raised.value.args[0]
    assert err.code() == KafkaError._FENCED and err.fatal()


def test_admin_end_offsets_by_isolation_level() -> None:
    broker = _broker()
    broker.produce(T, b"k", b"v")
    producer = _txn_producer(broker)
    producer.begin_transaction()
    producer.produce(T, b"open", b"k", partition=0)
    admin = MemoryTransport(broker, CONFIG).admin()
    tp = TopicPartition(T, 0)
    ends = {
        level: admin.list_offsets({tp: None}, isolation_level=level)[tp].result().offset
        for level in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED)
    }
    assert ends == {IsolationLevel.READ_COMMITTED: 1, IsolationLevel.READ_UNCOMMITTED: 2}


def test_the_group_hands_partitions_over_when_a_member_leaves() -> None:
    broker = _broker(partitions=2)
    calls: list[tuple[str, str, list[int]]] = []

    def member(name: str) -> MemoryConsumer:
        consumer = MemoryConsumer(broker, "g", eof=False)

        def callback(kind: str) -> Callable[[Any, list[TopicPartition]], None]:
            def cb(c: Any, tps: list[TopicPartition]) -> None:
                calls.append((name, kind, [tp.partition for tp in tps]))
                if kind == "assign":
                    c.incremental_assign(tps)

            return cb

        consumer.subscribe([T], on_assign=callback("assign"), on_revoke=callback("revoke"))
        return consumer

    first, second = member("first"), member("second")
    broker.produce(T, b"a", b"1")
    assert [m.value() for m in first.consume(10, timeout=0)] == [b"1"]
    first.commit(offsets=[TopicPartition(T, p, 1) for p in range(2)], asynchronous=False)
    assert second.consume(10, timeout=0) == []  # one active member: the second waits
    broker.produce(T, b"a", b"2")
    first.close()
    assert [m.value() for m in second.consume(10, timeout=0)] == [b"2"]  # from the commit on
    assert calls == [
        ("first", "assign", [0, 1]),
        ("first", "revoke", [0, 1]),
        ("second", "assign", [0, 1]),
    ]


# ------------------------------------------------------------------ the loop on it


class Loop(RunningProcessor):
    """A ``Processor`` thread on one in-memory cluster."""

    def __init__(self, broker: MemoryBroker, config: ServiceConfig = CONFIG) -> None:
        self.metrics = Metrics()
        super().__init__(
            Processor(config, metrics=self.metrics, transport=MemoryTransport(broker, config))
        )

    def stop(self, timeout: float = 60) -> None:
        super().stop(timeout)
        assert not self.thread.is_alive()

    def sample(self, name: str) -> float:
        return self.metrics.registry.get_sample_value(name) or 0.0


def _wait(done: Callable[[], bool], loop: RunningProcessor, what: str) -> None:
    deadline = time.monotonic() + 60
    while not done():
        assert not loop.errors, loop.errors
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _committed(broker: MemoryBroker, config: ServiceConfig = CONFIG) -> bool:
    events = config.topics.events
    return all(
        broker.group_offsets.get((config.group_id, events, p), 0) >= broker.log(events, p).high
        for p in range(config.partitions)
    )


def _views(broker: MemoryBroker, config: ServiceConfig = CONFIG) -> dict[str, Any]:
    reader = _Materializer(CODEC, None, None)
    for _, msg in broker.committed_records(config.topics.views):
        reader.apply(msg.key(), msg.value())
    return reader.views


LOG = session_log(20, seed=5)


def _produce(broker: MemoryBroker, sid: str, start: int, end: int) -> None:
    for event in LOG[start:end]:
        broker.produce(CONFIG.topics.events, sid.encode(), CODEC.encode_parsed_event(sid, event))


def _expect(views: dict[str, Any], sid: str, n: int) -> None:
    expected = as_json(offline_equivalent(session_output(fold_events(LOG[:n]))))
    assert as_json(session_fold_equivalent(views[sid])) == expected, sid


def test_a_restarted_loop_restores_from_its_checkpoints() -> None:
    broker = MemoryBroker()
    broker.create_topics(CONFIG)
    _produce(broker, "s", 0, 10)
    first = Loop(broker)
    _wait(lambda: _committed(broker), first, "first run commits")
    first.stop()
    _produce(broker, "s", 10, 20)
    second = Loop(broker)
    _wait(lambda: _committed(broker), second, "second run commits")
    second.stop()
    assert not first.errors and not second.errors
    assert second.sample("processor_restored_checkpoints_total") == 1
    assert second.sample("processor_records_consumed_total") == 10  # only the tail
    _expect(_views(broker), "s", 20)


@pytest.mark.parametrize(
    ("error", "aborts"),
    [
        (KafkaError(KafkaError.COORDINATOR_NOT_AVAILABLE, "moving", retriable=True), 0),
        (KafkaError(KafkaError._TIMED_OUT, "commit lost", txn_requires_abort=True), 1),
    ],
    ids=["retriable-retried", "abortable-aborted-and-refolded"],
)
def test_commit_errors_follow_the_transaction_model(error: KafkaError, aborts: int) -> None:
    broker = MemoryBroker()
    broker.create_topics(CONFIG)
    broker.fail("commit_transaction", error)
    _produce(broker, "s", 0, 12)
    loop = Loop(broker)
    _wait(lambda: _committed(broker), loop, "the batch commits in the end")
    loop.stop()
    assert not loop.errors
    assert loop.sample("processor_transaction_aborts_total") == aborts
    _expect(_views(broker), "s", 12)  # an aborted batch is refolded, never half-published
    # decisions count once, when committed: the aborted batch's are not counted
    applied = loop.metrics.registry.get_sample_value(
        "processor_events_total", {"outcome": "applied"}
    )
    assert applied == 12


def _view_history(broker: MemoryBroker) -> dict[tuple[str, str], list[int]]:
    """asOfSeq per (session, view) in committed order."""
    history: dict[tuple[str, str], list[int]] = {}
    for _, msg in broker.committed_records(CONFIG.topics.views):
        value = msg.value()
        if value is not None:
            v = CODEC.decode_view(value)
            if v.part == 0:
                history.setdefault((v.session_id, v.view), []).append(v.as_of_seq)
    return history


def test_a_commit_failing_while_the_next_batch_is_folded_rewinds_both() -> None:
    """commit_transaction overlaps the next batch's fold: when it fails, the
    batch folded on top of it is dropped too, and both are refolded from the
    checkpoints — nothing lost, nothing published twice, counted once."""
    broker = MemoryBroker()
    broker.create_topics(CONFIG)
    entered, release = broker.hold("commit_transaction")
    broker.fail(
        "commit_transaction",
        KafkaError(KafkaError._TIMED_OUT, "commit lost", txn_requires_abort=True),
    )
    _produce(broker, "s", 0, 8)
    loop = Loop(broker)
    try:
        _wait(entered.is_set, loop, "the first commit is in flight")
        _produce(broker, "s", 8, 20)  # folded on top of the batch being committed
        _produce(broker, "u", 0, 20)
        _wait(
            lambda: loop.sample("processor_records_consumed_total") >= 40,
            loop,
            "the next batch is folded while the commit is held",
        )
        assert loop.sample("processor_commits_total") == 0
    finally:
        release.set()
    _wait(lambda: _committed(broker), loop, "both batches commit in the end")
    loop.stop()
    assert not loop.errors
    assert loop.sample("processor_transaction_aborts_total") == 1
    assert loop.sample("processor_records_consumed_total") > 40  # refolded
    _expect(_views(broker), "s", 20)
    _expect(_views(broker), "u", 20)
    for (sid, view), seqs in _view_history(broker).items():
        assert seqs == sorted(set(seqs)), f"{sid}/{view} published twice or backwards: {seqs}"
    applied = loop.metrics.registry.get_sample_value(
        "processor_events_total", {"outcome": "applied"}
    )
    assert applied == 40


def test_a_fenced_producer_ends_the_run_with_one_line() -> None:
    broker = MemoryBroker()
    broker.create_topics(CONFIG)
    broker.fail("commit_transaction", KafkaError(KafkaError._FENCED, "fenced", fatal=True))
    _produce(broker, "s", 0, 3)
    loop = Loop(broker)
    loop.thread.join(60)
    assert len(loop.errors) == 1 and isinstance(loop.errors[0], KafkaFatal)
    assert "\n" not in str(loop.errors[0])
    assert broker.committed_records(CONFIG.topics.views) == []


def test_a_fence_right_after_an_overrun_transaction_gets_a_new_producer() -> None:
    """A member stopped (SIGSTOP, a stalled host) with a transaction open past
    the transaction timeout finds it aborted by the coordinator, whose epoch
    bump fences the next transaction at once.  That is not another member
    with our instance id (the fault suite saw the member exit for it): the
    producer is replaced and the batch refolded."""
    config = CONFIG.with_overrides(transaction_timeout_ms=1_000)
    broker = MemoryBroker()
    broker.create_topics(config)
    entered, release = broker.hold("commit_transaction")
    broker.fail(
        "commit_transaction",
        KafkaError(KafkaError._TIMED_OUT, "coordinator gone", txn_requires_abort=True),
    )
    broker.fail("commit_transaction", KafkaError(KafkaError._FENCED, "epoch bumped", fatal=True))
    _produce(broker, "s", 0, 20)
    loop = Loop(broker, config)
    try:
        _wait(entered.is_set, loop, "the first commit is in flight")
        time.sleep(1.2)  # the stop: the transaction outlives its timeout
    finally:
        release.set()
    _wait(lambda: _committed(broker, config), loop, "the batch commits on a new producer")
    loop.stop()
    assert not loop.errors
    assert loop.sample("processor_transaction_aborts_total") == 2
    _expect(_views(broker, config), "s", 20)


@pytest.mark.parametrize("window", [256, 2])
def test_at_least_once_restores_checkpoints_ahead_of_the_committed_offset(window: int) -> None:
    """Without transactions a member that dies after its checkpoints were
    delivered but before its offsets were committed leaves checkpoints ahead
    of the group: the next member folds the tail again (the gate drops what
    the checkpoint holds) instead of refusing the partition's anchor.  With a
    window smaller than the re-read tail the gate proves the older events
    judged by their offsets: no "unprovable" dead letter (S-1)."""
    config = CONFIG.with_overrides(exactly_once=False, duplicate_window=window)
    broker = MemoryBroker()
    broker.create_topics(config)
    _produce(broker, "s", 0, 10)
    first = Loop(broker, config)
    _wait(lambda: _committed(broker, config), first, "first run commits")
    first.stop()
    events = config.topics.events
    rewound = [
        key for key in broker.group_offsets if key[1] == events and broker.group_offsets[key] > 4
    ]
    assert rewound
    for key in rewound:  # the crash: offsets behind what the checkpoints reached
        broker.group_offsets[key] = 4
    _produce(broker, "s", 10, 20)
    second = Loop(broker, config)
    _wait(lambda: _committed(broker, config), second, "second run commits")
    second.stop()
    assert not first.errors and not second.errors
    assert second.sample("processor_restored_checkpoints_total") == 1
    _expect(_views(broker), "s", 20)
    assert list(broker.committed_records(config.topics.dlq)) == []
