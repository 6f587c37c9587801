"""What goes into the engine and what comes out: plain records, no Kafka types.

The Kafka loop turns each consumed message into a :class:`Record` and
produces each :class:`Out` the engine hands back; the engine never sees a
client, so every decision it makes is testable without a broker.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import Enum

from processor.codec import DeadLetter
from processor.engine.runtime import SessionRuntime

# Record, Out and Outcome are built once per consumed or produced record, so
# they are plain classes with an explicit __init__: in the compiled build that
# __init__ is native (a dataclass's generated one stays interpreted there, a
# frozen one's costs ~3x more again).  Equality and repr are the dataclass
# ones (tests compare them); like a non-frozen dataclass, they are unhashable.
# Nothing mutates them after construction.


class Record:
    """One consumed record (an event or a control command)."""

    __slots__ = ("key", "offset", "partition", "timestamp", "topic", "value")

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,  # ms since the epoch; the loop fills in "now" when the broker gave none
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.key = key
        self.value = value
        self.timestamp = timestamp

    def __eq__(self, other: object) -> bool:
        if type(other) is not Record:
            return NotImplemented
        return (
            self.topic == other.topic
            and self.partition == other.partition
            and self.offset == other.offset
            and self.key == other.key
            and self.value == other.value
            and self.timestamp == other.timestamp
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"Record(topic={self.topic!r}, partition={self.partition!r}, "
            f"offset={self.offset!r}, key={self.key!r}, value={self.value!r}, "
            f"timestamp={self.timestamp!r})"
        )


class Out:
    """One record to produce in the batch's transaction (``value`` None: a tombstone)."""

    __slots__ = ("key", "partition", "topic", "value")

    def __init__(self, topic: str, partition: int, key: bytes | None, value: bytes | None) -> None:
        self.topic = topic
        self.partition = partition
        self.key = key
        self.value = value

    def __eq__(self, other: object) -> bool:
        if type(other) is not Out:
            return NotImplemented
        return (
            self.topic == other.topic
            and self.partition == other.partition
            and self.key == other.key
            and self.value == other.value
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"Out(topic={self.topic!r}, partition={self.partition!r}, "
            f"key={self.key!r}, value={self.value!r})"
        )


class Fate(Enum):
    """What happened to one event record."""

    APPLIED = "applied"  # folded into its session
    DUPLICATE = "duplicate"  # an exact retry of a folded event: dropped, nothing published
    REJECTED = "rejected"  # dead-lettered; its session quarantined (unless held off)
    QUARANTINED = "quarantined"  # dead-lettered because its session already is


class Outcome:
    __slots__ = ("fate", "reason", "rule", "seq", "session_id")

    def __init__(
        self,
        fate: Fate,
        session_id: str | None,
        seq: int | None = None,
        rule: str | None = None,
        reason: str | None = None,
    ) -> None:
        self.fate = fate
        self.session_id = session_id
        self.seq = seq
        self.rule = rule
        self.reason = reason

    def __eq__(self, other: object) -> bool:
        if type(other) is not Outcome:
            return NotImplemented
        return (
            self.fate == other.fate
            and self.session_id == other.session_id
            and self.seq == other.seq
            and self.rule == other.rule
            and self.reason == other.reason
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"Outcome(fate={self.fate!r}, session_id={self.session_id!r}, seq={self.seq!r}, "
            f"rule={self.rule!r}, reason={self.reason!r})"
        )


@dataclass
class Tally:
    """Counts for the metrics, kept by the engine and drained by the loop.

    ``events``: applied / duplicate / rejected / quarantined; ``dlq``: by
    rule; ``control``: applied / noop / rejected commands.
    """

    events: Counter[str] = field(default_factory=Counter)
    dlq: Counter[str] = field(default_factory=Counter)
    dlq_oversized: int = 0
    control: Counter[str] = field(default_factory=Counter)
    views_published: int = 0
    checkpoints_published: int = 0
    loads: int = 0  # sessions loaded from the store (first event since assign or eviction)
    evictions: int = 0  # sessions evicted (memory budget or idle)


@dataclass
class Batch:
    """Work folded since the last commit, by partition: what the next transaction writes."""

    offsets: dict[int, int] = field(default_factory=dict)  # events offsets to commit
    control_offsets: dict[int, int] = field(default_factory=dict)
    dirty: dict[tuple[int, str], SessionRuntime] = field(default_factory=dict)
    dead_letters: list[tuple[int, DeadLetter]] = field(default_factory=list)
    tombstones: list[tuple[str, int, bytes]] = field(default_factory=list)
    events: int = 0
    #: bytes of record values copied into the dead letters (the loop closes the
    #: batch at MAX_BATCH_DEAD_LETTER_BYTES: a poison flood is not held in memory)
    dead_letter_bytes: int = 0
    started: float = 0.0  # monotonic time of the batch's first record (set by the loop)

    def empty(self) -> bool:
        return not (
            self.offsets
            or self.dirty
            or self.dead_letters
            or self.tombstones
            or self.control_offsets
        )

    def partitions(self) -> set[int]:
        return (
            set(self.offsets)
            | set(self.control_offsets)
            | {p for p, _ in self.dirty}
            | {p for p, _ in self.dead_letters}
            | {p for _, p, _ in self.tombstones}
        )
