"""The in-memory cluster's broker: topics of partition logs, transactions, groups' offsets.

The clients that talk to it (consumer, producer, admin) and the transport
the loop runs on are in ``memory.py``; what the cluster keeps of Kafka and
what it leaves out is told there.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Literal

from confluent_kafka import (
    KafkaError,
    KafkaException,
    TopicPartition,
)

from processor.config import ServiceConfig
from processor.engine.commands import partition_of

Status = Literal["open", "committed", "aborted", "marker"]
Callback = Callable[[Any, list[TopicPartition]], None]


@dataclass
class LogEntry:
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    status: Status


@dataclass
class PartitionLog:
    entries: list[LogEntry] = field(default_factory=list)
    open: set[int] = field(default_factory=set)  # offsets of open transactions' records

    @property
    def high(self) -> int:
        return len(self.entries)

    @property
    def stable(self) -> int:
        """The last stable offset: the first record of a still open transaction."""
        return min(self.open) if self.open else self.high


@dataclass
class OpenTxn:
    entries: list[tuple[str, int, LogEntry]] = field(default_factory=list)
    touched: set[tuple[str, int]] = field(default_factory=set)
    offsets: dict[tuple[str, str, int], int] = field(default_factory=dict)


class MemoryMessage:
    """A consumed record (or a partition-EOF event), shaped like confluent's ``Message``."""

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None = None,
        value: bytes | None = None,
        timestamp: int = 0,
        error: KafkaError | None = None,
    ) -> None:
        self._topic, self._partition, self._offset = topic, partition, offset
        self._key, self._value, self._ts, self._error = key, value, timestamp, error

    def topic(self) -> str | None:
        return self._topic

    def partition(self) -> int | None:
        return self._partition

    def offset(self) -> int | None:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return (1, self._ts)  # TIMESTAMP_CREATE_TIME

    def error(self) -> KafkaError | None:
        return self._error


def state_error(what: str) -> KafkaException:
    return KafkaException(KafkaError(KafkaError._STATE, what))


class MemoryBroker:
    """The cluster: logs, group offsets, transactional ids, group membership."""

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.RLock())
        self.topics: dict[str, list[PartitionLog]] = {}
        self.group_offsets: dict[tuple[str, str, int], int] = {}
        self.epochs: dict[str, int] = {}
        self.open_txns: dict[str, OpenTxn] = {}
        #: each group's members, the MemoryConsumers of memory.py (who joins first owns all)
        self.members: dict[str, list[Any]] = {}
        self._faults: dict[str, list[KafkaError]] = {}
        self._holds: dict[str, tuple[threading.Event, threading.Event]] = {}
        #: (topic, partition) -> seeks left before a stalled fetch resumes (None: never)
        self.stalls: dict[tuple[str, int], int | None] = {}
        #: (topic, partition) whose group-less readers' fetches deliver nothing
        self.reader_stalls: set[tuple[str, int]] = set()
        self.cluster_id = uuid.uuid4().hex
        self.topic_ids: dict[str, str] = {}

    # ------------------------------------------------------------ admin

    def create_topic(self, name: str, partitions: int) -> None:
        with self.cond:
            if name not in self.topics:
                self.topic_ids[name] = uuid.uuid4().hex
            self.topics.setdefault(name, [PartitionLog() for _ in range(partitions)])

    def create_topics(self, config: ServiceConfig) -> None:
        t = config.topics
        for name in (t.events, t.views, t.checkpoints, t.dlq, t.control):
            self.create_topic(name, config.partitions)

    def log(self, topic: str, partition: int) -> PartitionLog:
        logs = self.topics.get(topic)
        if logs is None or not 0 <= partition < len(logs):
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION, f"{topic}[{partition}]"))
        return logs[partition]

    def fail(self, step: str, error: KafkaError, times: int = 1) -> None:
        """Make the next ``times`` calls of a producer's ``step`` fail with ``error``."""
        with self.cond:
            self._faults.setdefault(step, []).extend([error] * times)

    def hold(self, step: str) -> tuple[threading.Event, threading.Event]:
        """Make the next call of a producer's ``step`` wait, outside the broker's
        lock, until ``release`` is set; ``entered`` is set when it starts waiting
        (a test folds more records while a commit is in flight)."""
        gate = (threading.Event(), threading.Event())
        with self.cond:
            self._holds[step] = gate
        return gate

    def _hold(self, step: str) -> None:
        with self.cond:
            gate = self._holds.pop(step, None)
        if gate is not None:
            gate[0].set()
            gate[1].wait(60)

    def stall(
        self, topic: str, partition: int, seeks: int | None = None, *, readers: bool = False
    ) -> None:
        """Make group members' fetches of a partition deliver nothing, as a client
        whose fetch lost its position (the fault suite's stall after a rewind),
        until ``seeks`` seeks of it (None: until :meth:`unstall`).  ``readers``:
        the group-less readers' fetches instead (a slow control fetch), until
        :meth:`unstall`."""
        with self.cond:
            if readers:
                self.reader_stalls.add((topic, partition))
            else:
                self.stalls[(topic, partition)] = seeks

    def unstall(self, topic: str, partition: int) -> None:
        with self.cond:
            self.stalls.pop((topic, partition), None)
            self.reader_stalls.discard((topic, partition))
            self.cond.notify_all()

    def _sought(self, key: tuple[str, int]) -> None:
        """A group member sought ``key``: one seek less before a stall ends."""
        if key not in self.stalls:
            return
        left = self.stalls[key]
        if left is not None and left <= 1:
            del self.stalls[key]
        elif left is not None:
            self.stalls[key] = left - 1

    def _fault(self, step: str) -> None:
        with self.cond:
            queued = self._faults.get(step)
            if queued:
                raise KafkaException(queued.pop(0))

    # ------------------------------------------------------------ writing

    def append(
        self, topic: str, partition: int, key: bytes | None, value: bytes | None, status: Status
    ) -> LogEntry:
        with self.cond:
            log = self.log(topic, partition)
            entry = LogEntry(log.high, key, value, int(time.time() * 1000), status)
            log.entries.append(entry)
            if status == "open":
                log.open.add(entry.offset)
            self.cond.notify_all()
            return entry

    def produce(self, topic: str, key: bytes | None, value: bytes | None) -> int:
        """A non-transactional write, partitioned by key as the writers do (murmur2)."""
        with self.cond:
            n = len(self.topics[topic])
            partition = partition_of(key, n) if key is not None else 0
            return self.append(topic, partition, key, value, "committed").offset

    def end_txn(self, txn: OpenTxn, commit: bool) -> None:
        with self.cond:
            for topic, partition, e in txn.entries:
                e.status = "committed" if commit else "aborted"
                self.log(topic, partition).open.discard(e.offset)
            for topic, partition in sorted(txn.touched):
                self.append(topic, partition, None, None, "marker")
            if commit:
                self.group_offsets.update(txn.offsets)
            self.cond.notify_all()

    # ------------------------------------------------------------ reading

    def committed_records(self, topic: str) -> list[tuple[int, MemoryMessage]]:
        """Every committed record of ``topic`` as (partition, message), in log order."""
        with self.cond:
            return [
                (p, MemoryMessage(topic, p, e.offset, e.key, e.value, e.timestamp))
                for p, log in enumerate(self.topics[topic])
                for e in log.entries
                if e.status == "committed"
            ]

    def metadata(self, topic: str | None) -> Any:
        with self.cond:
            names = [topic] if topic is not None else list(self.topics)
            return SimpleNamespace(
                cluster_id=self.cluster_id,
                topics={
                    n: SimpleNamespace(
                        topic=n,
                        partitions={p: SimpleNamespace(id=p) for p in range(len(self.topics[n]))},
                    )
                    for n in names
                    if n in self.topics
                },
            )
