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
from dataclasses import dataclass
from typing import Any, Final, Protocol

import orjson
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from processor.service.kafka_errors import message_error

log = logging.getLogger("processor.control")

CONTROL_VERSION: Final = 1
COMMANDS: Final = frozenset({"redrive"})
MAX_COMMAND_BYTES: Final = 4096
_FIELDS: Final = frozenset({"v", "command", "sessionId", "seq"})
_SAFE_INT: Final = 2**53 - 1


def _murmur2(data: bytes) -> int:
    """Kafka's murmur2 (the Java client's default partitioner, librdkafka's
    ``murmur2_random`` for non-null keys)."""
    m, r, mask = 0x5BD1E995, 24, 0xFFFFFFFF
    length = len(data)
    h = (0x9747B28C ^ length) & mask
    end = length - length % 4
    for i in range(0, end, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * m) & mask
        k ^= k >> r
        k = (k * m) & mask
        h = (h * m) & mask
        h ^= k
    tail = length % 4
    if tail >= 3:
        h ^= data[end + 2] << 16
    if tail >= 2:
        h ^= data[end + 1] << 8
    if tail >= 1:
        h ^= data[end]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h


def partition_of(key: bytes, partitions: int) -> int:
    """The partition the Java partitioner (and ours) gives a key."""
    return (_murmur2(key) & 0x7FFFFFFF) % partitions


class CommandError(ValueError):
    """A control record that is not a valid command (dead-lettered, rule CONTROL)."""


@dataclass(frozen=True)
class Command:
    name: str
    session_id: str
    seq: int

    def encode(self) -> bytes:
        return orjson.dumps({"v": CONTROL_VERSION, "command": self.name,
                             "sessionId": self.session_id, "seq": self.seq})


def redrive(session_id: str, seq: int) -> Command:
    return Command("redrive", session_id, seq)


def parse_command(key: bytes | None, value: bytes | None) -> Command:
    """Validate a control record, bounded before it is interpreted."""
    if value is None:
        raise CommandError("control record has no value")
    if len(value) > MAX_COMMAND_BYTES:
        raise CommandError(f"control record of {len(value)} bytes (limit {MAX_COMMAND_BYTES})")
    try:
        raw: Any = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise CommandError(f"control record is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise CommandError("control record must be a JSON object")
    extra = sorted(set(raw) - _FIELDS)
    if extra:
        raise CommandError(f"unknown field(s) {', '.join(extra)}")
    if raw.get("v") != CONTROL_VERSION:
        raise CommandError(f"unsupported version {raw.get('v')!r} (expected {CONTROL_VERSION})")
    name, sid, seq = raw.get("command"), raw.get("sessionId"), raw.get("seq")
    if not isinstance(name, str) or name not in COMMANDS:
        raise CommandError(f"unknown command {name!r} (known: {', '.join(sorted(COMMANDS))})")
    if not isinstance(sid, str) or not sid:
        raise CommandError("sessionId must be a non-empty string")
    if type(seq) is not int or not 0 <= seq <= _SAFE_INT:
        raise CommandError(f"seq must be an integer in [0, 2^53-1], got {seq!r}")
    if key is None or key != sid.encode():
        raise CommandError(f"record key {key!r} does not match sessionId {sid!r} (the key "
                           "routes the command to the session's partition)")
    return Command(name, sid, seq)


class _Target(Protocol):
    """What a command acts on (``state.SessionRuntime``)."""

    session_id: str
    quarantine: Any
    redrive_at: int | None

    @property
    def last_seq(self) -> int: ...


def apply_command(rt: _Target, command: Command) -> str:
    """Apply a redrive to a session: ``"lifted"``, ``"pending"`` or ``"noop"``."""
    q = rt.quarantine
    if q is not None and q.seq == command.seq:
        log.info("re-driving session %s (quarantined at seq %d)", rt.session_id, q.seq)
        rt.quarantine = None
        return "lifted"
    if rt.last_seq <= command.seq and (q is None or q.seq < command.seq):
        # not there yet (a restore or replay is behind): lift it when it happens
        rt.redrive_at = command.seq
        return "pending"
    log.info("redrive of %s at seq %d: nothing to do (last seq %d, %s)", rt.session_id,
             command.seq, rt.last_seq, f"quarantined at {q.seq}" if q else "not quarantined")
    return "noop"


class ControlChannel:
    """Reads the control partitions matching the owned events partitions."""

    def __init__(self, consumer: Consumer, topic: str, group: str) -> None:
        self.consumer = consumer
        self.topic = topic
        self.group = group
        self.partitions: set[int] = set()
        self.partition_count = 0
        self._drained: dict[int, float] = {}

    def assign(self, group_consumer: Consumer, numbers: list[int]) -> None:
        """Start reading ``numbers`` at the group's committed control offsets."""
        if not numbers:
            return
        if not self.partition_count:
            meta = self.consumer.list_topics(self.topic, timeout=30).topics.get(self.topic)
            self.partition_count = len(meta.partitions) if meta is not None else 0
        committed = group_consumer.committed([TopicPartition(self.topic, p) for p in numbers],
                                             timeout=30)
        self.consumer.incremental_assign([
            TopicPartition(self.topic, tp.partition,
                           tp.offset if tp.offset >= 0 else OFFSET_BEGINNING)
            for tp in committed])
        self.partitions.update(numbers)

    def check_route(self, command: Command, partition: int) -> None:
        """A command must sit where its session's events do (CommandError otherwise)."""
        if self.partition_count:
            want = partition_of(command.session_id.encode(), self.partition_count)
            if want != partition:
                raise CommandError(f"command for {command.session_id!r} in control partition "
                                   f"{partition}, but its key hashes to {want} (produce "
                                   "commands with the murmur2 partitioner)")

    def unassign(self, numbers: set[int]) -> None:
        mine = sorted(numbers & self.partitions)
        if mine:
            self.consumer.incremental_unassign([TopicPartition(self.topic, p) for p in mine])
            self.partitions.difference_update(mine)

    def rewind(self, group_consumer: Consumer, numbers: set[int]) -> None:
        """After an abort: back to the committed offsets (the commands refold)."""
        mine = sorted(numbers & self.partitions)
        if mine:
            # unassign + assign, not seek: a seek fails on a partition whose
            # fetch has not started yet
            self.unassign(set(mine))
            self.assign(group_consumer, mine)

    def poll(self, max_records: int = 500, timeout: float = 0) -> list[Message]:
        """Ready control records (non-blocking); consume errors that mean no READ raise."""
        if not self.partitions:
            return []
        out = []
        for msg in self.consumer.consume(num_messages=max_records, timeout=timeout):
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                fatal = message_error(err, self.topic, self.group)
                if fatal is not None:
                    raise fatal
                continue
            if (msg.partition() or 0) in self.partitions:
                out.append(msg)
        return out

    def drain(self, partition: int, timeout: float = 5.0) -> list[Message]:
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
        out: list[Message] = []
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
