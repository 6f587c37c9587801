"""Operator commands on their own topic, ``<prefix>.control``.

Commands never ride in the events topic: anyone allowed to write events
could otherwise forge them (lift any quarantine, make an event vanish).
The control topic is co-partitioned with the events (key = session id, the
same murmur2 partitioner), only operators get WRITE on it, and the member
that owns events partition ``p`` reads control partition ``p`` with a
group-less consumer; the control offsets are committed in the same
transaction as the events offsets, so each command is applied once.

A command is a small JSON object, addressed to a session *and a seq*::

    {"v": 1, "command": "redrive", "sessionId": "s-1", "seq": 41}

``redrive`` at seq N lifts a quarantine taken at seq N (the ``seq`` of the
session's ``status`` view).  Because it names the seq, ordering against the
events does not matter: a command read before the processor reaches that
quarantine (a restore replaying the tail) is kept in the session's
checkpoint and lifts the quarantine when it happens — even before the
session's first event was read (a replay re-reads the commands from the
start); a command for a seq the session has moved past is a counted no-op.
Applying a command twice changes nothing more than applying it once.  A
command that is not valid JSON, has unknown fields, names an unknown
command, or sits in a partition its key does not hash to (murmur2, as the
writers partition events) is dead-lettered (rule ``CONTROL``).
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import (
    OFFSET_BEGINNING,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from processor.engine.commands import (  # re-exported: the writer and tools build commands
    COMMANDS,
    MAX_COMMAND_BYTES,
    Command,
    CommandError,
    apply_command,
    misrouted,
    parse_command,
    partition_of,
    redrive,
)
from processor.kafka.client_errors import message_error
from processor.kafka.reads import records
from processor.kafka.transport import Msg, Reader
from processor.protocol import CONTROL_VERSION

__all__ = [
    "COMMANDS",
    "CONTROL_VERSION",
    "MAX_COMMAND_BYTES",
    "Command",
    "CommandError",
    "ControlChannel",
    "apply_command",
    "parse_command",
    "partition_of",
    "redrive",
]

log = logging.getLogger(__name__)


class ControlChannel:
    """Reads the control partitions matching the owned events partitions."""

    def __init__(self, consumer: Reader, topic: str, group: str) -> None:
        self.consumer = consumer
        self.topic = topic
        self.group = group
        self.partitions: set[int] = set()
        self.partition_count = 0
        self._drained: dict[int, float] = {}
        #: partitions whose end was reported (``enable.partition.eof``) after their
        #: last record: fetched to their end, as a ``--max-idle-s`` run asks (idle.py)
        self._at_end: set[int] = set()

    def assign(self, group_consumer: Reader, numbers: list[int]) -> None:
        """Start reading ``numbers`` at the group's committed control offsets."""
        if not numbers:
            return
        if not self.partition_count:
            meta = self.consumer.list_topics(self.topic, timeout=30).topics.get(self.topic)
            self.partition_count = len(meta.partitions) if meta is not None else 0
        committed = group_consumer.committed(
            [TopicPartition(self.topic, p) for p in numbers], timeout=30
        )
        self.consumer.incremental_assign(
            [
                TopicPartition(
                    self.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
                )
                for tp in committed
            ]
        )
        self.partitions.update(numbers)
        self._at_end.difference_update(numbers)

    def check_route(self, command: Command, partition: int) -> None:
        """A command must sit where its session's events do (CommandError otherwise)."""
        problem = misrouted(command, partition, self.partition_count)
        if problem is not None:
            raise CommandError(problem)

    def unassign(self, numbers: set[int]) -> None:
        mine = sorted(numbers & self.partitions)
        if mine:
            self.consumer.incremental_unassign([TopicPartition(self.topic, p) for p in mine])
            self.partitions.difference_update(mine)
            self._at_end.difference_update(mine)

    def rewind(self, group_consumer: Reader, numbers: set[int]) -> None:
        """After an abort: back to the committed offsets (the commands refold)."""
        mine = sorted(numbers & self.partitions)
        if mine:
            # unassign + assign, not seek: a seek fails on a partition whose
            # fetch has not started yet
            self.unassign(set(mine))
            self.assign(group_consumer, mine)

    def poll(self, max_records: int = 500, timeout: float = 0) -> list[Msg]:
        """Ready control records (non-blocking); consume errors that mean no READ raise."""
        if not self.partitions:
            return []
        out = []
        msgs = self.consumer.consume(num_messages=max_records, timeout=timeout)
        for msg in records(msgs, on_end=self._ended, on_error=self._failed):
            self._at_end.discard(msg.partition() or 0)
            if (msg.partition() or 0) in self.partitions:
                out.append(msg)
        return out

    def _ended(self, msg: Msg) -> None:
        self._at_end.add(msg.partition() or 0)

    def _failed(self, msg: Msg, err: KafkaError) -> None:
        fatal = message_error(err, self.topic, self.group)
        if fatal is not None:
            raise fatal

    def behind(self) -> list[int]:
        """The read partitions not fetched to their end yet (idle.py)."""
        return sorted(self.partitions - self._at_end)

    def drain(self, partition: int, timeout: float = 5.0) -> list[Msg]:
        """Every command of ``partition`` committed so far (blocking, bounded).

        Used when a quarantined session receives the event right after its
        quarantine: a redrive acknowledged before that event was produced is
        then always applied first, whichever fetch returned first.
        """
        if partition not in self.partitions:
            return []
        now = time.monotonic()
        if now - self._drained.get(partition, -1e9) < 1.0:
            return []  # bounded: a flood of such events costs one drain a second
        self._drained[partition] = now
        tp = TopicPartition(self.topic, partition)
        try:
            high = self.consumer.get_watermark_offsets(tp, timeout=timeout, cached=False)[1]
        except KafkaException as exc:
            log.warning("control drain of %s[%d]: %s", self.topic, partition, exc)
            return []
        out: list[Msg] = []
        deadline = now + timeout
        while time.monotonic() < deadline:
            position = self.consumer.position([tp])[0].offset
            if position >= high or high <= 0:
                break
            out.extend(self.poll(timeout=0.05))
            if out and (out[-1].offset() or 0) >= high - 1:
                break
        return out

    def close(self) -> None:
        self.consumer.close()
