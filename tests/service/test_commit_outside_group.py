"""A member that is no longer in its group commits nothing (``kafka/group_metadata.py``).

A classic group coordinator takes a transactional offset commit that names
no generation and no member from anyone, and librdkafka hands out exactly
that metadata after its membership is gone (an ``ILLEGAL_GENERATION``, then a
session timeout) until the application serves the lost partitions.  The
fault suite saw what follows when faults overlapped: a member kept
committing partitions another member owned, and a committed view went back.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from confluent_kafka import Consumer, KafkaError

from processor.codec import default_codec
from processor.config import ServiceConfig
from processor.core.events import Event
from processor.kafka.group_metadata import Membership, membership, serialised
from processor.service.loop.runner import Processor
from processor.telemetry.metrics import Metrics
from processor.testing.memory import MemoryBroker, MemoryConsumer, MemoryTransport
from tests.engine.kit import session_log
from tests.service.running import RunningProcessor, until

CODEC = default_codec()
CONFIG = ServiceConfig(partitions=1, topic_prefix="outside", commit_interval_ms=20)


def _consumer(**settings: str) -> Consumer:
    # no broker needed: the metadata is the client's own state
    return Consumer({"bootstrap.servers": "127.0.0.1:9", "group.id": "g1", **settings})


def test_librdkafkas_metadata_of_a_consumer_outside_its_group_names_no_member() -> None:
    consumer = _consumer()
    try:
        named = membership(consumer.consumer_group_metadata())
    finally:
        consumer.close()
    assert named == Membership("g1", -1, "", None)
    assert not named.in_group  # what the classic coordinator does not check


def test_a_static_members_metadata_is_always_checked() -> None:
    consumer = _consumer(**{"group.instance.id": "p-0"})
    try:
        named = membership(consumer.consumer_group_metadata())
    finally:
        consumer.close()
    assert named == Membership("g1", -1, "", "p-0")
    assert named.in_group


def test_the_serialisation_reads_back_and_other_forms_are_not_read() -> None:
    for named in (
        Membership("g", 7, "m-1", None),
        Membership("g", 0, "", "i"),
        Membership("", -1, "", None),
    ):
        assert (
            membership(
                serialised(named.generation, named.group_id, named.member_id, named.instance_id)
            )
            == named
        )
    whole = serialised(3, "group", "member", "instance")
    for cut in range(len(whole)):
        assert membership(whole[:cut]) is None, cut
    assert membership(("g",)) is None
    assert membership(b"CGMDv9:....") is None


def test_a_member_whose_membership_is_gone_does_not_commit_until_it_is_back() -> None:
    broker = MemoryBroker()
    broker.create_topics(CONFIG)
    proc = Processor(CONFIG, metrics=Metrics(), transport=MemoryTransport(broker, CONFIG))
    log = session_log(40, seed=5)
    key = (CONFIG.group_id, CONFIG.topics.events, 0)

    def produce(events: Sequence[Event]) -> None:
        for event in events:
            broker.produce(CONFIG.topics.events, b"s", CODEC.encode_parsed_event("s", event))

    produce(log[:10])
    running = RunningProcessor(proc)
    errors = running.errors
    try:
        until(lambda: broker.group_offsets.get(key) == 10, errors, "the first events commit")
        consumer = proc.clients.consumer
        assert isinstance(consumer, MemoryConsumer)
        generation, member = consumer.generation, consumer.member_id
        consumer.forget_membership()
        produce(log[10:])
        refused = proc.metrics.commits_outside_group
        aborts = proc.metrics.aborts
        until(lambda: aborts._value.get() >= 2 <= refused._value.get(), errors, "refused")
        assert broker.group_offsets[key] == 10  # nothing committed outside the group
        consumer.generation, consumer.member_id = generation, member  # back in the group
        until(lambda: broker.group_offsets.get(key) == len(log), errors, "the rest commits")
    finally:
        running.stop()
    assert not errors, errors


class _Waits(threading.Event):
    """The committer's stop event, recording each back-off it is asked to wait."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        return super().wait(timeout)


def _backoffs_after(error: KafkaError) -> list[float | None]:
    """The back-offs the committer waited after one batch's offsets failed with ``error``."""
    broker = MemoryBroker()
    broker.create_topics(CONFIG)
    proc = Processor(CONFIG, metrics=Metrics(), transport=MemoryTransport(broker, CONFIG))
    waits = _Waits()
    proc.txn._stop = waits
    broker.fail("send_offsets_to_transaction", error)
    for event in session_log(10, seed=6):
        broker.produce(CONFIG.topics.events, b"s", CODEC.encode_parsed_event("s", event))
    running = RunningProcessor(proc)
    key = (CONFIG.group_id, CONFIG.topics.events, 0)
    try:
        until(lambda: broker.group_offsets.get(key) == 10, running.errors, "the batch commits")
    finally:
        running.stop()
    assert not running.errors, running.errors
    assert proc.metrics.aborts._value.get() == 1
    return waits.waits


def test_a_batch_failed_by_a_group_change_is_refolded_without_a_back_off() -> None:
    """Under KIP-848 every group change fails each member's transaction in
    flight (its epoch moved); the rebalance is served at the next poll, and a
    back-off would only hold every partition of the member (they double
    while changes come in a row)."""
    for code in (KafkaError.ILLEGAL_GENERATION, KafkaError.STALE_MEMBER_EPOCH):
        assert _backoffs_after(KafkaError(code, "the group changed")) == [], code
    # any other failed transaction backs off
    assert _backoffs_after(KafkaError(KafkaError._MSG_TIMED_OUT, "slow")) == [0.1]
