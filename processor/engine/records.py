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

# Record, Out and Outcome are built once per consumed or produced record: not
# frozen, whose __init__ (object.__setattr__ per field) costs ~3x a plain one.
# Nothing mutates them after construction.


@dataclass(slots=True)
class Record:
    """One consumed record (an event or a control command)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int  # ms since the epoch; the loop fills in "now" when the broker gave none


@dataclass(slots=True)
class Out:
    """One record to produce in the batch's transaction (``value`` None: a tombstone)."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes | None


class Fate(Enum):
    """What happened to one event record."""

    APPLIED = "applied"  # folded into its session
    DUPLICATE = "duplicate"  # an exact retry of a folded event: dropped, nothing published
    REJECTED = "rejected"  # dead-lettered; its session quarantined (unless held off)
    QUARANTINED = "quarantined"  # dead-lettered because its session already is


@dataclass(slots=True)
class Outcome:
    fate: Fate
    session_id: str | None
    seq: int | None = None
    rule: str | None = None
    reason: str | None = None


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
