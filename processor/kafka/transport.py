"""The seam between the processor loop and a Kafka cluster (issue 11).

The loop (``runner.py``), the restore (``restore.py``) and the control
channel (``control.py``) use a small part of confluent-kafka's client
surface; these protocols name exactly that part, in confluent-kafka's own
vocabulary (``TopicPartition``, ``KafkaError``, ``KafkaException``), so the
loop's error model stays the one documented for that client.  Two
implementations:

- :class:`KafkaTransport`: the confluent-kafka clients of ``clients.py``,
  what the service runs on;
- :class:`processor.testing.memory.MemoryTransport`: topics, transactions
  and a one-member group in memory, so the same loop runs the contract
  scenarios without a broker (``tests/service/test_contract.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol, cast

from confluent_kafka import KafkaError, KafkaException, TopicCollection, TopicPartition

from processor.config import ServiceConfig
from processor.kafka import clients, preflight
from processor.kafka.client_errors import ClientProblems
from processor.kafka.fencing import ZombieFence
from processor.kafka.owners import partitions_held
from processor.telemetry.metrics import Metrics

log = logging.getLogger(__name__)


class Msg(Protocol):
    """A consumed record, or an error in its place (``error()`` not None)."""

    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...
    def timestamp(self) -> tuple[int, int]: ...
    def error(self) -> KafkaError | None: ...


class Reader(Protocol):
    """A consumer the loop assigns partitions to itself (restore, control)."""

    def consume(self, num_messages: int = 1, timeout: float = -1) -> Sequence[Msg]: ...
    def assign(self, partitions: list[TopicPartition]) -> None: ...
    def unassign(self) -> None: ...
    def incremental_assign(self, partitions: list[TopicPartition]) -> None: ...
    def incremental_unassign(self, partitions: list[TopicPartition]) -> None: ...
    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]: ...
    def seek(self, partition: TopicPartition) -> None: ...
    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]: ...
    def committed(
        self, partitions: list[TopicPartition], timeout: float = -1
    ) -> list[TopicPartition]: ...
    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any: ...
    def close(self) -> None: ...


class GroupConsumer(Reader, Protocol):
    """The group member: subscription with rebalance callbacks, group offsets."""

    def subscribe(
        self,
        topics: list[str],
        on_assign: Callable[[Any, list[TopicPartition]], None] | None = None,
        on_revoke: Callable[[Any, list[TopicPartition]], None] | None = None,
        on_lost: Callable[[Any, list[TopicPartition]], None] | None = None,
    ) -> None: ...
    def consumer_group_metadata(self) -> Any: ...
    def pause(self, partitions: list[TopicPartition]) -> None: ...
    def resume(self, partitions: list[TopicPartition]) -> None: ...
    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: Literal[False]
    ) -> list[TopicPartition]: ...


class TxnProducer(clients.Producing, Protocol):
    """The output producer: transactions, and offsets committed inside them."""

    def flush(self, timeout: float = -1) -> int: ...
    def init_transactions(self, timeout: float = -1) -> None: ...
    def begin_transaction(self) -> None: ...
    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], group_metadata: Any, timeout: float = -1
    ) -> None: ...
    def commit_transaction(self, timeout: float = -1) -> None: ...
    def abort_transaction(self, timeout: float = -1) -> None: ...


class OffsetsAdmin(Protocol):
    """What the restore asks an admin client: the end offsets at an isolation level,
    the topic's metadata first, and its queued log lines served."""

    def list_offsets(
        self, topic_partition_offsets: dict[TopicPartition, Any], **kwargs: Any
    ) -> dict[TopicPartition, Any]: ...  # futures of ``ListOffsetsResultInfo``
    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any: ...
    def poll(self, timeout: float) -> int: ...


class Transport(Protocol):
    """Where the loop's clients come from."""

    def group_consumer(self, instance_id: str, problems: ClientProblems) -> GroupConsumer: ...
    def plain_consumer(self, purpose: str, problems: ClientProblems, group: str) -> Reader: ...
    def output_producer(self, instance_id: str, problems: ClientProblems) -> TxnProducer: ...
    def admin(self) -> OffsetsAdmin: ...
    def topic_id(self, topic: str) -> str:
        """The topic's id ("" when unknown): a recreated topic has a new one."""
        ...

    def require_permissions(self, problems: ClientProblems, metrics: Metrics) -> None: ...


#: The group watch's description: its request's own timeout, and how long a
#: call waits for it (:meth:`KafkaTransport.group_members`).
DESCRIBE_TIMEOUT_S = 600.0
DESCRIBE_WAIT_S = 15.0


class KafkaTransport:
    """The confluent-kafka clients (``clients.py``): what the service runs on."""

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        #: a description not answered in time, and its admin client: kept until
        #: its request returns (see :meth:`group_members`)
        self._describing: tuple[Any, Any] | None = None

    def group_consumer(self, instance_id: str, problems: ClientProblems) -> GroupConsumer:
        # a RejoiningConsumer answers what it does not override from its consumer
        return cast(GroupConsumer, clients.group_consumer(self.config, instance_id, problems))

    def plain_consumer(self, purpose: str, problems: ClientProblems, group: str) -> Reader:
        return clients.plain_consumer(self.config, purpose, problems, group=group)

    def output_producer(self, instance_id: str, problems: ClientProblems) -> TxnProducer:
        return clients.output_producer(self.config, instance_id, problems)

    def admin(self) -> OffsetsAdmin:
        return clients.admin(self.config)

    def group_members(self) -> list[tuple[str, tuple[int, ...]]]:
        """Each member's client id and the events partitions it holds (group_watch.py).

        Not part of :class:`Transport`: a transport without it has no watch.
        An admin client per call, released in the calling thread once its
        answer is served: one kept across calls aborted a member in the fault
        suite (librdkafka's ``rd_kafka_enq_once_del_source_return`` assertion,
        a coordinator request failing as its connection drops; librdkafka
        issue 4605).  The watch makes no call while no broker answers
        (``GroupWatch.paused``), so an outage creates no clients."""
        pending = self._describing
        if pending is not None and not pending[1].done():
            raise TimeoutError("the previous description of the group has not returned")
        self._describing = None
        group, topic = self.config.group_id, self.config.topics.events
        admin = clients.admin(self.config)
        # librdkafka aborts the process when an admin request's own timeout
        # fires while its request to the group coordinator is pending, and the
        # coordinator's broker then comes back or is replaced (the coordinator
        # request's callback runs after the request was destroyed, eonce->refcnt
        # > 0; members died so after the group coordinator's broker was
        # SIGKILLed, issue 37).  So the request's own timeout is longer than any
        # failover; this call waits DESCRIBE_WAIT_S, and a description still
        # pending then keeps its client until it returns (one at a time).
        future = admin.describe_consumer_groups([group], request_timeout=DESCRIBE_TIMEOUT_S)[group]
        try:
            desc = future.result(timeout=DESCRIBE_WAIT_S)
        except TimeoutError:
            self._describing = (admin, future)
            raise
        finally:
            admin.poll(0)  # serves its queued log lines
        return partitions_held(desc, topic)

    def zombie_fence(self, instance_id: str, metrics: Metrics) -> ZombieFence:
        """Fences dead members' transactions on assignment (fencing.py); not part
        of :class:`Transport`: a transport without it waits for the broker."""
        return ZombieFence(
            self.config,
            instance_id,
            counted=lambda outcome: metrics.zombie_fences.labels(outcome).inc(),
        )

    def topic_id(self, topic: str) -> str:
        """From DescribeTopics; "" when the broker does not say (the local store
        then relies on its last-record digest to notice a recreated topic)."""
        # a client per call, released in this thread
        # once its answer is served: one collected later (by the cyclic GC, in
        # another client's callback) with an event unserved aborts the process
        # (confluent-kafka's CallState assertion, seen in test_revoke)
        admin = clients.admin(self.config)
        try:
            futures = admin.describe_topics(TopicCollection([topic]))
            return str(futures[topic].result(timeout=30).topic_id)
        except (KafkaException, TimeoutError, ValueError) as exc:
            log.warning("topic id of %s unknown (%s)", topic, exc)
            return ""

    def require_permissions(self, problems: ClientProblems, metrics: Metrics) -> None:
        preflight.require_permissions(self.config, problems, metrics)
