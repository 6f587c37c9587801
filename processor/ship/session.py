"""One followed session: which file, how far sent, how far acknowledged.

Seqs are the session's, across generations: ``sent_seq`` is the last event
handed to the producer, ``acked_seq`` the last one the broker acknowledged.
An event read again at or below ``sent_seq`` (after a restart, a shrink or a
switch to a newer generation) is not sent again; if it differs from what was
sent, the session is refused rather than sending a different event under a
seq already on the topic.  ``offset`` positions are of the current file and
advance only over records whose every event is acknowledged.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path

from processor.ship.reader import Record, TailReader
from processor.ship.registry import Position

#: digests of recently sent events kept per session (a rollback removes at most
#: the runtime's last batch)
RECENT = 256
#: record ends remembered per session (where to read again after a shrink)
BOUNDARIES = 256


@dataclass
class Followed:
    dir: Path
    sid: str
    generation: int
    path: Path
    reader: TailReader
    sent_seq: int = -1
    acked_seq: int = -1
    acked_digest: bytes | None = None
    acked_offset: int = 0
    persisted_seq: int = -1
    persisted_offset: int = 0
    #: events at or below this seq come from an older generation (or the
    #: topic): skipped without comparing, a migration may reshape them
    superseded_seq: int = -1
    size: int = 0
    refused: str | None = None
    stat: tuple[int, int, int] = (0, 0, 0)
    recent: OrderedDict[int, bytes] = field(default_factory=OrderedDict)
    #: (start, end, digest) of records handled in the current file
    boundaries: deque[tuple[int, int, bytes]] = field(
        default_factory=lambda: deque(maxlen=BOUNDARIES)
    )
    #: (seq, end): once every event up to seq is acknowledged, ``end`` is safe
    pending_ends: deque[tuple[int, int]] = field(default_factory=deque)
    #: a record a bound stopped in the middle, and the index to go on from
    carry: tuple[Record, int] | None = None

    def remember(self, seq: int, dig: bytes) -> None:
        self.recent[seq] = dig
        if len(self.recent) > RECENT:
            self.recent.popitem(last=False)

    def known_digest(self, seq: int) -> bytes | None:
        if seq <= self.superseded_seq:
            return None
        if seq == self.acked_seq and self.acked_digest is not None:
            return self.acked_digest
        return self.recent.get(seq)

    def record_done(self, start: int, end: int, mark: bytes) -> None:
        """Every event of the record ``[start, end)`` was sent (or skipped)."""
        if mark:
            self.boundaries.append((start, end, mark))
        self.pending_ends.append((self.sent_seq, end))
        self.settle()

    def on_ack(self, seq: int) -> int:
        """An event was acknowledged; returns the bytes the offset advanced."""
        if seq > self.acked_seq:
            self.acked_seq = seq
            self.acked_digest = self.recent.get(seq)
        return self.settle()

    def settle(self) -> int:
        before = self.acked_offset
        while self.pending_ends and self.pending_ends[0][0] <= self.acked_seq:
            self.acked_offset = max(self.acked_offset, self.pending_ends.popleft()[1])
        return self.acked_offset - before

    def rewind_to(self, size: int, changed: bool) -> int:
        """The file shrank to ``size``: read again from the last record end at or
        below it, that record's digest checked (from 0 when none is remembered, or the
        bytes before the position changed); returns that offset."""
        ends = [b for b in self.boundaries if b[1] <= size and not changed]
        at = max(ends, key=lambda b: b[1]) if ends else None
        start = at[1] if at else 0
        self.carry = None
        self.reader.offset = start
        self.reader.started = start > 0
        self.reader.anchor = (at[0], at[2]) if at else None
        kept = [b for b in self.boundaries if b[1] <= start]
        self.boundaries = deque(kept, maxlen=BOUNDARIES)
        self.pending_ends = deque((s, e) for s, e in self.pending_ends if e <= start)
        self.acked_offset = min(self.acked_offset, start)
        return start

    def switch(self, generation: int, path: Path, reader: TailReader) -> None:
        """Follow a newer generation from its start; what was sent stays sent."""
        self.generation = generation
        self.path = path
        self.reader = reader
        self.superseded_seq = self.sent_seq
        self.carry = None
        self.acked_offset = 0
        self.persisted_offset = -1
        self.boundaries.clear()
        self.pending_ends.clear()

    def position(self) -> Position:
        at = next((b for b in reversed(self.boundaries) if b[1] == self.acked_offset), None)
        return Position(
            self.sid,
            self.generation,
            str(self.path),
            self.acked_offset,
            self.acked_seq,
            self.acked_digest,
            at[0] if at else None,
            at[2] if at else None,
        )

    @property
    def unpersisted(self) -> int:
        return self.sent_seq - self.persisted_seq

    @property
    def lag(self) -> int:
        return max(0, self.size - self.acked_offset)
