"""A Kafka cluster in memory: the transport the contract suite runs the loop on.

Not a mock: a small implementation of the semantics the processor relies
on, so the same :class:`~processor.service.loop.runner.Processor` loop runs the
contract scenarios without a broker (issue 11).  What it keeps of Kafka:

- topics of partitions, each an append-only log with offsets from 0;
- transactions: records of an open transaction are invisible to
  ``read_committed`` readers and hold back the last stable offset (LSO);
  commit and abort each append a control marker (it takes an offset, as in
  Kafka, and is never delivered); aborted records are skipped; offsets sent
  to a transaction become the group's committed offsets at its commit;
  ``init_transactions`` with a transactional id in use fences the older
  producer (its next call fails fatally) and aborts its open transaction;
- a consumer group: the first member to poll is assigned every partition of
  its subscription (``on_assign``); ``close`` revokes them (``on_revoke``)
  and the next member gets them;
- ``enable.partition.eof`` for the group-less readers (the restore's stop
  signal), watermarks (the high one is the LSO for ``read_committed``; the
  cached ones are the last fetch's, unknown before it, as librdkafka's) and a
  group member's ``position()``, unknown after an assignment or a seek until
  a fetch moves it.

What it leaves out: compaction and retention (logs only grow), more than
one active member per group (a second member waits for the first to leave),
lost partitions, broker faults unless injected (:meth:`MemoryBroker.fail`),
ACLs (no authorizer: nothing to check) and headers; a delivery report is
served at once, inside ``produce``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any, Literal

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from processor.config import ServiceConfig
from processor.engine.commands import partition_of
from processor.kafka.client_errors import ClientProblems
from processor.kafka.group_metadata import membership, serialised
from processor.telemetry.metrics import Metrics
from processor.testing.memory_broker import Callback, OpenTxn, state_error
from processor.testing.memory_broker import MemoryBroker as MemoryBroker
from processor.testing.memory_broker import MemoryMessage as MemoryMessage


class MemoryConsumer:
    """A ``read_committed`` consumer; a group member once it subscribes."""

    def __init__(self, broker: MemoryBroker, group: str, *, eof: bool) -> None:
        self.broker = broker
        self.group = group
        self.eof = eof
        self.positions: dict[tuple[str, int], int] = {}
        self._eof_at: dict[tuple[str, int], int] = {}
        self._topics: list[str] = []
        self._callbacks: dict[str, Callback | None] = {}
        self._owned: list[TopicPartition] = []
        self._closed = False
        self.paused: set[tuple[str, int]] = set()
        #: a group member's partitions assigned or sought and not read since: as
        #: librdkafka, ``position()`` is unknown until a fetch moves it
        self._unread: set[tuple[str, int]] = set()
        #: the high watermark of each partition's last fetch, as librdkafka caches
        #: it (``get_watermark_offsets(cached=True)``; unknown before the first)
        self._highs: dict[tuple[str, int], int] = {}
        #: what :meth:`consumer_group_metadata` names (a member once subscribed)
        self.generation = -1
        self.member_id = ""

    # ------------------------------------------------------------ group

    def subscribe(
        self,
        topics: list[str],
        on_assign: Callback | None = None,
        on_revoke: Callback | None = None,
        on_lost: Callback | None = None,
    ) -> None:
        self._topics = list(topics)
        self._callbacks = {"assign": on_assign, "revoke": on_revoke, "lost": on_lost}
        with self.broker.cond:
            self.broker.members.setdefault(self.group, []).append(self)
            self.generation, self.member_id = 1, f"member-{id(self):x}"

    def forget_membership(self) -> None:
        """As librdkafka after an ``ILLEGAL_GENERATION`` and a session timeout,
        before the application served its lost partitions: the metadata names
        no generation and no member (``kafka/group_metadata.py``)."""
        self.generation, self.member_id = -1, ""

    def _rebalance(self) -> None:
        """Take the subscription's partitions once this member leads the group."""
        if not self._topics or self._owned:
            return
        with self.broker.cond:
            if self.broker.members.get(self.group, [None])[0] is not self:
                return
            self._owned = [
                TopicPartition(t, p)
                for t in self._topics
                for p in range(len(self.broker.topics[t]))
            ]
        on_assign = self._callbacks.get("assign")
        if on_assign is not None:
            on_assign(self, list(self._owned))
        else:
            self.incremental_assign(list(self._owned))

    def consumer_group_metadata(self) -> Any:
        return serialised(self.generation, self.group, self.member_id, None)

    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: Literal[False]
    ) -> list[TopicPartition]:
        with self.broker.cond:
            for tp in offsets:
                self.broker.group_offsets[(self.group, tp.topic, tp.partition)] = tp.offset
        return offsets

    def committed(
        self, partitions: list[TopicPartition], timeout: float = -1
    ) -> list[TopicPartition]:
        with self.broker.cond:
            return [
                TopicPartition(
                    tp.topic,
                    tp.partition,
                    self.broker.group_offsets.get(
                        (self.group, tp.topic, tp.partition), OFFSET_INVALID
                    ),
                )
                for tp in partitions
            ]

    # ------------------------------------------------------------ assignment

    def _start(self, tp: TopicPartition) -> int:
        log = self.broker.log(tp.topic, tp.partition)
        if tp.offset == OFFSET_BEGINNING:
            return 0
        if tp.offset == OFFSET_END:
            return log.high
        if tp.offset >= 0:
            return tp.offset
        # no explicit offset: the group's committed one, else auto.offset.reset=earliest
        committed = self.broker.group_offsets.get((self.group, tp.topic, tp.partition))
        return committed if committed is not None else 0

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        with self.broker.cond:
            for tp in partitions:
                self.positions[(tp.topic, tp.partition)] = self._start(tp)
                self._eof_at.pop((tp.topic, tp.partition), None)
                if self._topics:
                    self._unread.add((tp.topic, tp.partition))

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        with self.broker.cond:
            for tp in partitions:
                if (tp.topic, tp.partition) not in self.positions:
                    # as the real client: only what is assigned can be unassigned
                    raise KafkaException(
                        KafkaError(
                            KafkaError._INVALID_ARG,
                            f"{tp.topic} [{tp.partition}] can't be unassigned since it is "
                            "not in the current assignment",
                        )
                    )
            for tp in partitions:
                self.positions.pop((tp.topic, tp.partition), None)
                self.paused.discard((tp.topic, tp.partition))
                self._highs.pop((tp.topic, tp.partition), None)

    def pause(self, partitions: list[TopicPartition]) -> None:
        with self.broker.cond:
            self.paused.update((tp.topic, tp.partition) for tp in partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        with self.broker.cond:
            self.paused.difference_update((tp.topic, tp.partition) for tp in partitions)
            self.broker.cond.notify_all()

    def assign(self, partitions: list[TopicPartition]) -> None:
        with self.broker.cond:
            self.positions.clear()
            self._eof_at.clear()
            self.paused.clear()
            self._highs.clear()
            self.incremental_assign(partitions)

    def unassign(self) -> None:
        with self.broker.cond:
            self.positions.clear()

    def seek(self, partition: TopicPartition) -> None:
        key = (partition.topic, partition.partition)
        with self.broker.cond:
            if key not in self.positions:
                raise state_error(f"seek: {key} is not assigned")
            self.positions[key] = self._start(partition)
            self._eof_at.pop(key, None)
            if self._topics:
                self.broker._sought(key)
                self._unread.add(key)

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        with self.broker.cond:
            return [
                TopicPartition(
                    tp.topic,
                    tp.partition,
                    OFFSET_INVALID
                    if (tp.topic, tp.partition) in self._unread
                    else self.positions.get((tp.topic, tp.partition), OFFSET_INVALID),
                )
                for tp in partitions
            ]

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        """Fresh: the log start and the last stable offset (what the restore
        asks).  ``cached``: as librdkafka, the high watermark of this consumer's
        last fetch of the partition (records of open transactions included),
        unknown before its first."""
        with self.broker.cond:
            log = self.broker.log(partition.topic, partition.partition)
            if not cached:
                return 0, log.stable
            high = self._highs.get((partition.topic, partition.partition))
            return (0, high) if high is not None else (OFFSET_INVALID, OFFSET_INVALID)

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        return self.broker.metadata(topic)

    # ------------------------------------------------------------ reading

    def _ready(self, limit: int) -> list[MemoryMessage]:
        out: list[MemoryMessage] = []
        for (topic, partition), pos in list(self.positions.items()):
            if (topic, partition) in self.paused:
                continue
            log = self.broker.log(topic, partition)
            self._highs[(topic, partition)] = log.high  # a stalled fetch answers it too
            stalls = self.broker.stalls if self._topics else self.broker.reader_stalls
            if (topic, partition) in stalls:
                continue  # a stalled fetch (MemoryBroker.stall)
            stable = log.stable
            while pos < stable and len(out) < limit:
                e = log.entries[pos]
                pos += 1
                if e.status == "committed":
                    out.append(
                        MemoryMessage(topic, partition, e.offset, e.key, e.value, e.timestamp)
                    )
            if pos != self.positions[(topic, partition)]:
                self._unread.discard((topic, partition))
            self.positions[(topic, partition)] = pos
            at_end = pos >= stable
            if (
                self.eof
                and at_end
                and self._eof_at.get((topic, partition)) != pos
                and len(out) < limit
            ):
                self._eof_at[(topic, partition)] = pos
                out.append(
                    MemoryMessage(
                        topic, partition, pos, error=KafkaError(KafkaError._PARTITION_EOF)
                    )
                )
        return out

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[MemoryMessage]:
        if self._closed:
            raise state_error("consumer closed")
        self._rebalance()
        deadline = time.monotonic() + max(timeout, 0)
        with self.broker.cond:
            while True:
                out = self._ready(num_messages)
                left = deadline - time.monotonic()
                if out or left <= 0:
                    return out
                self.broker.cond.wait(left)

    def close(self) -> None:
        if self._closed:
            return
        if self._owned:
            on_revoke = self._callbacks.get("revoke")
            if on_revoke is not None:
                on_revoke(self, list(self._owned))
            self._owned = []
        with self.broker.cond:
            members = self.broker.members.get(self.group, [])
            if self in members:
                members.remove(self)
            self.positions.clear()
            self._closed = True
            self.broker.cond.notify_all()


class MemoryProducer:
    """An idempotent producer; transactional when given a transactional id."""

    def __init__(
        self,
        broker: MemoryBroker,
        transactional_id: str | None,
        error_cb: Callable[[KafkaError], None] | None = None,
    ) -> None:
        self.broker = broker
        self.txn_id = transactional_id
        self.epoch = -1
        self.txn: OpenTxn | None = None
        self._error_cb = error_cb
        self._errors: list[KafkaError] = []

    def report(self, err: KafkaError) -> None:
        """A client-level error (a coordinator's connection refused): as
        librdkafka does, handed to ``error_cb`` only at the next ``poll``."""
        self._errors.append(err)

    def _check(self, step: str) -> None:
        self.broker._fault(step)
        if self.txn_id is not None and self.broker.epochs.get(self.txn_id) != self.epoch:
            raise KafkaException(
                KafkaError(KafkaError._FENCED, "producer fenced by a newer instance", fatal=True)
            )

    def produce(
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int = -1,
        *,
        on_delivery: Any = None,  # called at once: a write here cannot fail
        headers: Any = None,  # the processor writes none
    ) -> None:
        k = key.encode() if isinstance(key, str) else key
        v = value.encode() if isinstance(value, str) else value
        with self.broker.cond:
            self._check("produce")
            if partition < 0:
                partition = partition_of(k, len(self.broker.topics[topic])) if k is not None else 0
            if self.txn_id is None:
                entry = self.broker.append(topic, partition, k, v, "committed")
            else:
                if self.txn is None:
                    raise state_error("produce outside a transaction")
                entry = self.broker.append(topic, partition, k, v, "open")
                self.txn.entries.append((topic, partition, entry))
                self.txn.touched.add((topic, partition))
        if on_delivery is not None:  # the offset the record got, as a delivery report
            on_delivery(None, MemoryMessage(topic, partition, entry.offset, k, v, entry.timestamp))

    def poll(self, timeout: float = -1) -> int:
        errors, self._errors = self._errors, []
        for err in errors:
            if self._error_cb is not None:
                self._error_cb(err)
        return 0

    def flush(self, timeout: float = -1) -> int:
        return 0  # every record is written when produced

    def init_transactions(self, timeout: float = -1) -> None:
        assert self.txn_id is not None, "init_transactions needs a transactional id"
        with self.broker.cond:
            self.broker._fault("init_transactions")
            zombie = self.broker.open_txns.pop(self.txn_id, None)
            if zombie is not None:
                self.broker.end_txn(zombie, commit=False)
            self.epoch = self.broker.epochs[self.txn_id] = (
                self.broker.epochs.get(self.txn_id, -1) + 1
            )

    def begin_transaction(self) -> None:
        with self.broker.cond:
            self._check("begin_transaction")
            if self.txn is not None:
                raise state_error("a transaction is already open")
            self.txn = self.broker.open_txns[self.txn_id or ""] = OpenTxn()

    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], group_metadata: Any, timeout: float = -1
    ) -> None:
        self.broker._hold("send_offsets_to_transaction")
        with self.broker.cond:
            self._check("send_offsets_to_transaction")
            if self.txn is None:
                raise state_error("send_offsets_to_transaction outside a transaction")
            named = membership(group_metadata)
            if named is None:
                raise state_error("send_offsets_to_transaction without group metadata")
            group = named.group_id
            for tp in positions:
                self.txn.offsets[(group, tp.topic, tp.partition)] = tp.offset

    def commit_transaction(self, timeout: float = -1) -> None:
        self._end("commit_transaction", commit=True)

    def abort_transaction(self, timeout: float = -1) -> None:
        self._end("abort_transaction", commit=False)

    def _end(self, step: str, *, commit: bool) -> None:
        self.broker._hold(step)
        with self.broker.cond:
            self._check(step)
            txn, self.txn = self.txn, None
            if txn is None:
                if commit:
                    raise state_error("commit_transaction outside a transaction")
                return
            self.broker.open_txns.pop(self.txn_id or "", None)
            self.broker.end_txn(txn, commit)


class MemoryAdmin:
    """The end offsets of partitions, at an isolation level (restore's stability wait)."""

    def __init__(self, broker: MemoryBroker) -> None:
        self.broker = broker

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        return self.broker.metadata(topic)

    def poll(self, timeout: float) -> int:
        return 0  # no log lines queue here

    def list_offsets(
        self, topic_partition_offsets: dict[TopicPartition, Any], **kwargs: Any
    ) -> dict[TopicPartition, Any]:
        committed = kwargs.get("isolation_level") == IsolationLevel.READ_COMMITTED
        out: dict[TopicPartition, Any] = {}
        with self.broker.cond:
            for tp in topic_partition_offsets:
                log = self.broker.log(tp.topic, tp.partition)
                future: Future[Any] = Future()
                future.set_result(SimpleNamespace(offset=log.stable if committed else log.high))
                out[tp] = future
        return out


class MemoryTransport:
    """The loop's clients on a :class:`MemoryBroker` (one per processor)."""

    def __init__(self, broker: MemoryBroker, config: ServiceConfig) -> None:
        self.broker = broker
        self.config = config

    def group_consumer(self, instance_id: str, problems: ClientProblems) -> MemoryConsumer:
        return MemoryConsumer(self.broker, self.config.group_id, eof=False)

    def plain_consumer(self, purpose: str, problems: ClientProblems, group: str) -> MemoryConsumer:
        return MemoryConsumer(self.broker, group, eof=True)

    def output_producer(self, instance_id: str, problems: ClientProblems) -> MemoryProducer:
        txn_id = f"{self.config.group_id}-{instance_id}" if self.config.exactly_once else None
        return MemoryProducer(self.broker, txn_id, problems.error_cb)

    def admin(self) -> MemoryAdmin:
        return MemoryAdmin(self.broker)

    def topic_id(self, topic: str) -> str:
        with self.broker.cond:
            return self.broker.topic_ids.get(topic, "")

    def require_permissions(self, problems: ClientProblems, metrics: Metrics) -> None:
        """No authorizer in memory: nothing to check (as a broker without one)."""
