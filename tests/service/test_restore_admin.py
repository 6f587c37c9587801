"""A restore's clients answer its first request at once (issue 37).

- A new librdkafka admin client's first ListOffsets took 3 s in one call of
  six: its query for the partitions' leaders went to a bootstrap broker that
  the client decommissions once it knows the cluster's brokers, and the lost
  query is asked again by a 3 s timer (a rolling restart's loop waited 3 s,
  bench/lab history 11).  A stability wait's client now asks for the topic's
  metadata first; it is still new for each wait (one kept across restores
  sent a restore's ListOffsets to the leader it had cached, a broker killed
  11 s before, and waited out the request timeout) and after a failed call.
- The restore consumer's first request waited ~0.5 s (a new client's
  reconnect back-off) in a restarted member's first restore; it is made
  while the member starts.

Broker-less: the in-memory cluster, counting factories and consumers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition

from processor.config import ServiceConfig
from processor.kafka.client_errors import ClientProblems
from processor.service.loop.member_clients import MemberClients
from processor.service.partitions.restore import FreshAdmin, wait_stable
from processor.telemetry.metrics import Metrics
from processor.testing.memory import MemoryAdmin, MemoryBroker, MemoryConsumer, MemoryTransport
from tests.service.test_background_fill import _fresh_host
from tests.service.test_memory_transport import Loop, _committed, _wait


class _Admin(MemoryAdmin):
    """The in-memory admin, failing its next ``fail`` calls like a restarting broker."""

    fail = 0
    polled = 0
    asked: ClassVar[list[str]] = []  # list_topics, then "offsets" per ListOffsets

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        _Admin.asked.append(f"topics {topic}")
        return None

    def list_offsets(
        self, topic_partition_offsets: dict[TopicPartition, Any], **kwargs: Any
    ) -> dict[TopicPartition, Any]:
        _Admin.asked.append("offsets")
        if _Admin.fail > 0:
            _Admin.fail -= 1
            raise KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION, "stale leader"))
        return super().list_offsets(topic_partition_offsets, **kwargs)

    def poll(self, timeout: float) -> int:
        _Admin.polled += 1
        return 0


def test_a_stability_waits_client_asks_for_the_metadata_first_and_is_new_after_a_failure() -> None:
    broker = MemoryBroker()
    broker.create_topic("t.checkpoints", 2)
    made: list[_Admin] = []

    def factory() -> _Admin:
        made.append(_Admin(broker))
        return made[-1]

    _Admin.fail = _Admin.polled = 0
    _Admin.asked = []
    assert wait_stable(factory, "t.checkpoints", [0, 1], 30.0) == []
    # the topic's metadata first (a new client's leader lookup could wait 3 s),
    # then the two ends; the client released (its log lines served) at the end
    assert _Admin.asked == ["topics t.checkpoints", "offsets", "offsets"]
    assert len(made) == 1 and _Admin.polled == 1
    _Admin.fail, _Admin.asked = 1, []
    assert wait_stable(factory, "t.checkpoints", [0], 30.0) == []  # retried: a new client
    assert len(made) == 3 and _Admin.polled == 3
    assert (
        _Admin.asked
        == ["topics t.checkpoints", "offsets", "topics t.checkpoints"] + ["offsets"] * 2
    )
    admin = FreshAdmin(factory)  # as the wait uses it
    ends = admin.list_offsets(
        {TopicPartition("t.checkpoints", 0): None}, IsolationLevel.READ_COMMITTED
    )
    assert ends == {0: 0}


def test_every_restore_of_a_member_asks_a_new_client_for_the_metadata_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker, _, config = _fresh_host(tmp_path)
    made: list[_Admin] = []

    def admin(self: MemoryTransport) -> MemoryAdmin:
        made.append(_Admin(self.broker))
        return made[-1]

    monkeypatch.setattr(MemoryTransport, "admin", admin)
    _Admin.fail = _Admin.polled = 0
    _Admin.asked = []
    # the first commit is lost: its abort restores the partitions again (a rewind)
    broker.fail(
        "commit_transaction",
        KafkaError(KafkaError._TIMED_OUT, "commit lost", txn_requires_abort=True),
    )
    loop = Loop(broker, config)
    _wait(lambda: _committed(broker, config), loop, "all committed")
    loop.stop()
    assert not loop.errors, loop.errors
    assert config.exactly_once and loop.sample("processor_transaction_aborts_total") == 1
    assert len(made) >= 2  # the assignment's restore and the rewind's
    topics = [a for a in _Admin.asked if a.startswith("topics")]
    assert len(topics) == len(made) and _Admin.asked[0].startswith("topics"), _Admin.asked


class _Reader(MemoryConsumer):
    asked: ClassVar[list[str | None]] = []

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        _Reader.asked.append(topic)
        return super().list_topics(topic, timeout)


def test_the_restore_consumer_makes_its_first_request_while_the_member_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A new client's first request waits ~0.5 s (its reconnect back-off): the
    restore consumer makes it beside the producer's init, not in the first
    restore, while the member's partitions wait."""
    config = ServiceConfig(partitions=2, topic_prefix="warm")
    broker = MemoryBroker()
    broker.create_topics(config)
    real = MemoryTransport.plain_consumer

    def plain(self: MemoryTransport, purpose: str, problems: Any, group: str) -> MemoryConsumer:
        if purpose == "restore":
            return _Reader(self.broker, group, eof=True)
        return real(self, purpose, problems, group)

    monkeypatch.setattr(MemoryTransport, "plain_consumer", plain)
    _Reader.asked = []
    metrics = Metrics()
    clients = MemberClients(
        config, MemoryTransport(broker, config), ClientProblems(), metrics, instance_id="a"
    )
    clients.open()
    assert _Reader.asked == []
    clients.start(lambda: None)
    assert _Reader.asked == [config.topics.checkpoints]
