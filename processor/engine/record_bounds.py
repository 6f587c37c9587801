"""VF-7: every record the engine derives fits, or its session is refused.

A record the output producer cannot send (``MSG_SIZE_TOO_LARGE``, locally
above ``message.max.bytes``, at the broker above the topic's
``max.message.bytes``) aborts its transaction; the batch is refolded and
fails again, for ever, and every session of the partition stops with it.
Unit views and bundles are split or cut at ``max_view_bytes``, but a
checkpoint unit row is written whole (``toolHistory`` keeps the tools of
every request header), and one message may be as large as an event.

So each changed session's records are checked, before any of them enters
the transaction, against :func:`record_bound` (the producer's and the
topics' limit less framing).  A session with a record over it is refused,
as the seq gate refuses bad input: a dead letter (rule ``VF-7``) naming the
seq and the record, none of the session's records of the batch written, and
the session reloaded from its last committed checkpoint and quarantined
there (its ``status`` view and checkpoint head say why).  The other sessions
of the partition keep flowing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Final, Protocol, TypeVar

from processor.codec import Codec, session_key
from processor.config import ServiceConfig, TopicNames
from processor.engine.held import HeldSessions
from processor.engine.records import Batch, Out, Record
from processor.engine.runtime import Quarantine, SessionRuntime


class Partition(Protocol):
    """What a refusal touches of an events partition (``engine.PartitionState``)."""

    @property
    def number(self) -> int: ...
    @property
    def pinned(self) -> bool: ...
    @property
    def source(self) -> object | None: ...
    @property
    def sessions(self) -> dict[str, SessionRuntime]: ...
    @property
    def view_parts(self) -> dict[tuple[str, str], int]: ...
    @property
    def quarantined(self) -> set[str]: ...


P = TypeVar("P", bound=Partition)
P_contra = TypeVar("P_contra", bound=Partition, contravariant=True)


class Host(Protocol[P_contra]):
    """What a refusal asks of the engine (``engine.Engine``); a protocol, so
    that this module and the engine do not import each other."""

    @property
    def batch(self) -> Batch: ...
    @property
    def codec(self) -> Codec: ...
    @property
    def topics(self) -> TopicNames: ...
    @property
    def held(self) -> HeldSessions: ...
    def session_records(self, part: P_contra, rt: SessionRuntime) -> list[Out]: ...
    def runtime(self, part: P_contra, sid: str) -> SessionRuntime: ...
    def dead_letter(
        self,
        part: P_contra,
        sid: str | None,
        rec: Record,
        seq: int | None,
        rule: str,
        reason: str,
    ) -> None: ...


log = logging.getLogger(__name__)

RULE: Final = "VF-7"
#: ``max.message.bytes`` of the compacted output topics (views, checkpoints)
#: as the processor creates them (``service/topics.py``).
TOPIC_MAX_MESSAGE_BYTES: Final = 4 * 1024 * 1024
#: The output producer's ``message.max.bytes`` unless configured
#: (``service/clients.py``): the topics' limit, so neither refuses first.
PRODUCER_MAX_MESSAGE_BYTES: Final = TOPIC_MAX_MESSAGE_BYTES
#: Room for what surrounds key and value in a produce request: the record's
#: and the record batch's framing (well under 1 KiB) and headers (none).
FRAMING_MARGIN: Final = 16 * 1024


def record_bound(config: ServiceConfig) -> int:
    """The largest key + value a derived record may have (VF-7)."""
    return max_record_bytes(config.kafka) - FRAMING_MARGIN


def max_record_bytes(kafka: Mapping[str, str]) -> int:
    """The smaller of the producer's ``message.max.bytes`` (configured or
    ours) and the output topics' ``max.message.bytes``."""
    configured = kafka.get("message.max.bytes")
    producer = int(configured) if configured else PRODUCER_MAX_MESSAGE_BYTES
    return min(producer, TOPIC_MAX_MESSAGE_BYTES)


def record_size(out: Out) -> int:
    return (len(out.key) if out.key is not None else 0) + (
        len(out.value) if out.value is not None else 0
    )


def oversized(outs: list[Out], bound: int) -> Out | None:
    """The first record of ``outs`` over ``bound``, or None."""
    for out in outs:
        if out.value is not None and record_size(out) > bound:
            return out
    return None


def fitted(engine: Host[P], part: P, rt: SessionRuntime, bound: int) -> list[Out]:
    """The records of one changed session if every one fits, else its refusal's."""
    outs = engine.session_records(part, rt)
    big = oversized(outs, bound)
    if big is None:
        return outs
    return refuse(engine, part, rt, big, bound)


def refuse(engine: Host[P], part: P, rt: SessionRuntime, big: Out, bound: int) -> list[Out]:
    """Refuse ``rt``'s batch: a ``VF-7`` dead letter, the session back at its
    last committed checkpoint and quarantined there; the records to write."""
    sid, seq, offset = rt.session_id, rt.last_seq, rt.last_offset
    name = _describe(big)
    # forget the refused state (its ledgers think the dropped records written)
    part.sessions.pop(sid, None)
    engine.held.remove(rt)
    for ident in [k for k in part.view_parts if k[0] == sid]:
        del part.view_parts[ident]
    back: SessionRuntime | None = None
    if part.source is not None and not part.pinned:
        try:
            back = engine.runtime(part, sid)
        except Exception as exc:  # an unreadable store: keep the refused state below
            log.error("session %s: reloading its checkpoint failed (%s)", sid, exc)
    if back is None:
        back = rt  # nothing to go back to: the refused state, never written again
        part.sessions[sid] = rt
        engine.held.add(rt, 0)
    at = back.last_seq
    where = (
        "in memory only"
        if back is rt
        else "its last committed state"
        if at >= 0
        else "before its first event (nothing of it committed)"
    )
    reason = (
        f"seq {seq}: derived record {name} of {record_size(big):,} bytes exceeds the "
        f"record bound of {bound:,} bytes ({RULE}); the session's records of this "
        f"batch are not written and it is quarantined at seq {at}, {where}"
    )
    log.warning("session %s refused: %s", sid, reason)
    # (the batch's dead letters are already out: this one goes with the records)
    letters = engine.batch.dead_letters
    before = len(letters)
    record = Record(engine.topics.events, part.number, offset, session_key(sid), None, 0)
    engine.dead_letter(part, sid, record, seq, RULE, reason)
    dlq = engine.topics.dlq
    outs = [
        Out(dlq, p, session_key(sid), engine.codec.encode_dead_letter(letter))
        for p, letter in letters[before:]
    ]
    back.quarantine = Quarantine(at, RULE, reason, offset)
    back.redrive_at = None
    part.quarantined.add(sid)
    if back is rt:  # its own state cannot be written: quarantined in memory only
        return outs
    records = engine.session_records(part, back)
    if back.last_seq < 0:
        # refused in its first batch: its status says so, but an event-less
        # session gets no checkpoint (it would have no anchor to check)
        checkpoints = engine.topics.checkpoints
        records = [o for o in records if o.topic != checkpoints]
    again = oversized(records, bound)
    if again is not None:  # its committed state fitted once; never write a misfit
        log.error("session %s: its committed state no longer fits (%s)", sid, _describe(again))
        return outs
    return outs + records


def _describe(out: Out) -> str:
    key = out.key.decode("utf-8", "replace") if out.key is not None else ""
    return f"{out.topic}[{out.partition}] key {key.replace(chr(0), '/').lstrip(chr(0xFFFD))!r}"
