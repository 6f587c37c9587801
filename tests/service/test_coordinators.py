"""Where a coordinator is (``kafka/coordinators.py``) and how a transaction
coordinator's trouble is kept (``ClientProblems``): the stuck probe's inputs."""

from __future__ import annotations

from types import SimpleNamespace

from confluent_kafka import KafkaError

from processor.kafka.client_errors import TXN_TROUBLE_GAP_S, ClientProblems
from processor.kafka.coordinators import (
    TXN_STATE_TOPIC,
    coordinator_address,
    coordinator_partition,
    java_hash,
)


def test_java_string_hash_code() -> None:
    assert java_hash("") == 0
    assert java_hash("hello") == 99162322
    assert java_hash("polygenelubricants") == -(1 << 31)  # Integer.MIN_VALUE
    assert java_hash("é€") == 233 * 31 + 0x20AC  # UTF-16 code units


def test_coordinator_partition_as_kafka_places_it() -> None:
    assert coordinator_partition("polygenelubricants", 50) == 0  # abs(MIN_VALUE) is 0
    assert coordinator_partition("hello", 50) == 99162322 % 50
    assert coordinator_partition("group-a", 50) == abs(java_hash("group-a")) % 50


def _metadata(leader: int, *, error: object = None, brokers: tuple[int, ...] = (1, 2)) -> object:
    partitions = {p: SimpleNamespace(id=p, leader=leader) for p in range(50)}
    return SimpleNamespace(
        brokers={b: SimpleNamespace(id=b, host=f"b{b}", port=9092) for b in brokers},
        topics={TXN_STATE_TOPIC: SimpleNamespace(error=error, partitions=partitions)},
    )


def test_coordinator_address_names_the_leader_as_librdkafka_names_brokers() -> None:
    assert coordinator_address(_metadata(2), TXN_STATE_TOPIC, "g-m1") == "b2:9092"


def test_coordinator_address_is_none_when_the_metadata_does_not_say() -> None:
    denied = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    assert coordinator_address(_metadata(2, error=denied), TXN_STATE_TOPIC, "g-m1") is None
    assert coordinator_address(_metadata(-1), TXN_STATE_TOPIC, "g-m1") is None
    assert coordinator_address(_metadata(3), TXN_STATE_TOPIC, "g-m1") is None  # not listed
    empty = SimpleNamespace(brokers={}, topics={})
    assert coordinator_address(empty, TXN_STATE_TOPIC, "g-m1") is None


def test_a_transaction_coordinator_trouble_keeps_its_start_and_the_broker_named() -> None:
    problems = ClientProblems()
    problems.error_cb(KafkaError(KafkaError._TRANSPORT, "TxnCoordinator: b1:9092: Connect failed"))
    first = problems.txn_coordinator_trouble_since
    assert first > 0 and problems.txn_coordinator_lost == "b1:9092"
    problems.error_cb(KafkaError(KafkaError._TRANSPORT, "TxnCoordinator: b2:9092: Disconnected"))
    assert problems.txn_coordinator_trouble_since == first  # the same trouble
    assert problems.txn_coordinator_lost == "b2:9092"
    assert problems.txn_coordinator_trouble_at is not None
    problems.txn_coordinator_trouble_at -= TXN_TROUBLE_GAP_S + 1  # a quiet spell
    problems.error_cb(KafkaError(KafkaError._TRANSPORT, "TxnCoordinator: b2:9092: refused"))
    assert problems.txn_coordinator_trouble_since > first  # a new one
    # another connection's trouble is not the transaction coordinator's
    problems.error_cb(KafkaError(KafkaError._TRANSPORT, "b3:9092/3: Connect failed"))
    assert problems.txn_coordinator_lost == "b2:9092"
