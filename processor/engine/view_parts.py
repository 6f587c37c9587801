"""What a changed session writes to the views topic, in the parted format.

Records (``View`` values, key ``<session>/<name>``; protocol.py names them):

- ``~m<seq>``: the message of an event (``derive_event_message``, no
  override), written once.  Append-origin messages are the transcript and
  stay; a replace-origin node's message is tombstoned when the node leaves
  the surface (or gets an override).
- ``~m<seq>.<generation>``: a projected override of node ``seq`` (G-1),
  tombstoned when superseded or when the node leaves.
- ``~t<i>``: closed chunk ``i`` of the transcript's seqs, written once.
- ``~n<i>``: closed chunk ``i`` of the node refs, versioned (chunks.py).
- ``~h``: the head, rewritten per batch (status, generations, versions of
  the node chunks, the open tails, the transcript total), written last.

A node ref is ``seq`` (its message is ``~m<seq>``), ``[seq, generation]``
(its message is the override) or ``[seq]`` (it yields no message).  So a
batch that appends one event writes its message once and a small head,
whatever the length of the session.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from processor.core.messages import derive_event_message
from processor.core.session import Session
from processor.engine.chunks import ChunkLedger
from processor.protocol import (
    CHUNK_ITEMS,
    content_view,
    node_chunk_view,
    transcript_chunk_view,
)


@dataclass(slots=True)
class ViewLedger:
    """What the views topic holds for one session (so only changes are written)."""

    nodes: ChunkLedger = field(default_factory=ChunkLedger)
    transcript_total: int = 0  # entries published
    transcript_base: int = 0  # entries that live in format-1 ``transcript.<n>`` pages
    transcript_tail: list[int] = field(default_factory=list)
    #: append-origin nodes below this seq have their own content (format-1 restore)
    content_floor: int = 0
    owned: set[int] = field(default_factory=set)  # nodes whose own ``~m<seq>`` is live
    overrides: dict[int, int] = field(default_factory=dict)  # seq -> generation live
    as_of: int = -1  # seq of the last head written
    legacy: list[str] = field(default_factory=list)  # format-1 records to tombstone
    #: transcript chunks closed in the views and not yet mirrored in the
    #: checkpoint (parts ``x.<i>``: what a session tombstone must remove)
    closed_chunks: list[tuple[int, list[int]]] = field(default_factory=list)

    def owns(self, session: Session, seq: int, overridden: bool) -> bool:
        """Does node ``seq`` need a content record of its own (not the transcript's)?"""
        if overridden:
            return False
        event = session.surface.state.node_events[seq]
        if event.surface_op == "append" and seq >= self.content_floor:
            return False
        return derive_event_message(event) is not None


@dataclass(slots=True)
class ViewWrites:
    records: list[tuple[str, Any]] = field(default_factory=list)  # parts, in order
    tombstones: list[str] = field(default_factory=list)
    head: dict[str, Any] = field(default_factory=dict)


def view_writes(
    session: Session,
    ledger: ViewLedger,
    generations: Mapping[int, int],
    quarantine: Any,
    *,
    page_size: int,
) -> ViewWrites:
    """The records that bring the views topic from ``ledger`` to ``session``."""
    out = ViewWrites()
    _transcript(session, ledger, out)
    state = session.surface.state
    live_nodes = set(state.nodes)
    refs = node_refs(session, generations)
    for seq in state.nodes:
        generation = generations.get(seq)
        if generation is not None and ledger.overrides.get(seq) != generation:
            out.records.append((content_view(seq, generation), state.overrides[seq]))
        if seq not in ledger.owned and ledger.owns(session, seq, generation is not None):
            out.records.append((content_view(seq), derive_event_message(state.node_events[seq])))
            ledger.owned.add(seq)
    for seq in sorted(ledger.owned):
        if seq not in live_nodes or seq in generations:
            out.tombstones.append(content_view(seq))
            ledger.owned.discard(seq)
    for seq, generation in sorted(ledger.overrides.items()):
        if generations.get(seq) != generation:
            out.tombstones.append(content_view(seq, generation))
    ledger.overrides = dict(generations)
    chunks = ledger.nodes.update(refs, session.last_seq)
    out.records.extend((node_chunk_view(i), items) for i, items in chunks.writes)
    out.tombstones.extend(node_chunk_view(i) for i in chunks.removed)
    out.tombstones.extend(ledger.legacy)
    ledger.legacy = []
    head: dict[str, Any] = {
        "ps": page_size,
        "rg": state.replace_generation,
        "cg": state.content_generation,
        "nc": [session.last_seq - v for v in ledger.nodes.versions],  # ages: short
        "nt": ChunkLedger.tail(refs),
        "tn": ledger.transcript_total,
        "tt": list(ledger.transcript_tail),
    }
    if ledger.transcript_base:
        head["tb"] = ledger.transcript_base
    if quarantine is not None:
        head["q"] = quarantine
    out.head = head
    ledger.as_of = session.last_seq
    return out


def node_refs(session: Session, generations: Mapping[int, int]) -> list[Any]:
    """The head's node list: ``seq``, ``[seq, generation]`` or ``[seq]`` per node."""
    state = session.surface.state
    refs: list[Any] = []
    for seq in state.nodes:
        generation = generations.get(seq)
        if generation is not None:
            refs.append([seq, generation])
        elif derive_event_message(state.node_events[seq]) is None:
            refs.append([seq])
        else:
            refs.append(seq)
    return refs


def _transcript(session: Session, ledger: ViewLedger, out: ViewWrites) -> None:
    """Messages and closed chunks of the transcript entries not yet published."""
    total = session.transcript_count
    if total <= ledger.transcript_total:
        return
    tail = ledger.transcript_tail
    for entry in session.transcript_slice(ledger.transcript_total, total):
        seq = int(entry["seq"])
        out.records.append((content_view(seq), entry["message"]))
        tail.append(seq)
        ledger.transcript_total += 1
        if len(tail) == CHUNK_ITEMS:
            index = (ledger.transcript_total - ledger.transcript_base) // CHUNK_ITEMS - 1
            out.records.append((transcript_chunk_view(index), list(tail)))
            ledger.closed_chunks.append((index, list(tail)))
            tail.clear()
    session.drop_transcript_before(total)  # the views hold them now
