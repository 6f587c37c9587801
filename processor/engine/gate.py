"""The seq gate (S-1): each event is applied once, in seq order, or refused.

Producers retry, so the same event can arrive twice; a rewritten event under
a folded seq, or a missing seq, would make the views disagree with the log.
The gate tells these apart with the runtime's window of folded digests, and
past the window by the record's offset: a record at or before the offset of
the session's last applied event is a re-read of the log (a rewind to a
committed offset behind the checkpoints), judged when it was first read.
"""

from __future__ import annotations

from enum import Enum

from processor.core.events import Event
from processor.engine.runtime import SessionRuntime


class Gate(Enum):
    APPLY = "apply"  # the next seq
    DUPLICATE = "duplicate"  # a folded seq, byte-for-byte the folded event: drop quietly
    CONFLICT = "conflict"  # a folded seq with different content
    UNPROVABLE = "unprovable"  # a folded seq older than the digest window
    GAP = "gap"  # seqs are missing before it


def judge(rt: SessionRuntime, event: Event, offset: int | None = None) -> Gate:
    """The gate's verdict on ``event``, read at ``offset`` of the session's partition."""
    last = rt.last_seq
    if event.seq <= last:
        verdict = rt.duplicate_verdict(event)
        if verdict == "unknown" and offset is not None and 0 <= offset <= rt.last_offset:
            # Without this a member resuming at a committed offset behind its
            # checkpoints (at least once: a crash after they were delivered)
            # dead-letters every re-read event older than the window as unprovable.
            return Gate.DUPLICATE
        return (
            Gate.DUPLICATE
            if verdict == "same"
            else Gate.CONFLICT
            if verdict == "different"
            else Gate.UNPROVABLE
        )
    if event.seq > last + 1:
        return Gate.GAP
    return Gate.APPLY


def refusal(gate: Gate, seq: int, last: int) -> tuple[str, str]:
    """(rule, reason) of a refused event; the texts are the dead letters' contract."""
    if gate is Gate.GAP:
        return "S-1", f"seq {seq}: gap, expected {last + 1} (S-1)"
    reason = (
        "conflicting duplicate: differs from the folded event"
        if gate is Gate.CONFLICT
        else "duplicate older than the verification window; cannot prove it equal"
    )
    return "SEQ-GATE", f"seq {seq}: {reason} (watermark {last})"
