"""What a changed session writes to the views topic, in the parted format.

Records (``View`` values, key ``<session>/<name>``; protocol.py names them):

- ``~b<n>``: a bundle (format 3): every message this batch publishes for the
  session, ``[seq, message]`` (the message of an event,
  ``derive_event_message``, no override) or ``[seq, generation, message]``
  (a projected override of node ``seq``, G-1), written once.  One record
  per session and transaction however many events it folded (a bundle
  whose JSON would pass ``max_bytes`` is cut into several, ``n`` counts
  per session).  A bundle holding a transcript message stays (the
  transcript is append-only); any other lives while one of its entries is
  still named (a replace-origin node on the surface, an override not
  superseded) and is tombstoned in the transaction that drops the last.
- ``~m<seq>`` / ``~m<seq>.<generation>``: the same entries one per record
  (format 2): still read, and tombstoned when dropped, never written.
- ``~t<i>``: closed chunk ``i`` of the transcript's seqs, written once.
- ``~n<i>``: closed chunk ``i`` of the node refs, versioned (chunks.py).
- ``~h``: the head, rewritten per batch (status, generations, versions of
  the node chunks, the open tails, the transcript total), written last.

A node ref is ``seq`` (its message is ``~m<seq>``), ``[seq, generation]``
(its message is the override) or ``[seq]`` (it yields no message).  So a
batch that appends one event writes its message once and a small head,
whatever the length of the session; a batch of many events writes one
bundle, not a record per message.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import orjson

from processor.core.messages import derive_event_message
from processor.core.session import Session
from processor.engine.chunks import ChunkLedger
from processor.protocol import (
    CHUNK_ITEMS,
    VIEWS_FORMAT,
    bundle_view,
    content_view,
    node_chunk_view,
    transcript_chunk_view,
)

#: Write bundles (format 3); False writes one record per message (format 2),
#: kept only so tests can produce the previous format and prove it is read.
BUNDLES = True


@dataclass(slots=True)
class BundleSlot:
    """A live bundle that holds entries which can be dropped."""

    pinned: bool  # holds a transcript message too: never tombstoned
    #: droppable entries still named: the ledger's ``bundle_of`` names them
    #: (entry -> bundle), so a count is all the slot needs to know its last
    live: int = 0


#: The one empty ``owned`` (``frozenset()`` is a new 216-byte object per call)
NO_SEQS: frozenset[int] = frozenset()
#: The one empty ``overrides`` of both ledgers (an empty dict is 64 bytes)
NO_GENERATIONS: Mapping[int, int] = MappingProxyType({})


def no_generations() -> Mapping[int, int]:
    return NO_GENERATIONS  # (a dataclass default must be hashable: a factory)


@dataclass(slots=True)
class ViewLedger:
    """What the views topic holds for one session (so only changes are written)."""

    nodes: ChunkLedger = field(default_factory=ChunkLedger)
    transcript_total: int = 0  # entries published
    transcript_base: int = 0  # entries that live in format-1 ``transcript.<n>`` pages
    transcript_tail: list[int] = field(default_factory=list)
    #: append-origin nodes below this seq have their own content (format-1 restore)
    content_floor: int = 0
    #: nodes whose own ``~m<seq>`` is live: few or none, so an empty frozenset until
    #: the first (an empty set is 216 bytes in every held session, figure 6)
    owned: Set[int] = NO_SEQS
    #: seq -> generation live (few or none: the shared empty mapping until the first)
    overrides: Mapping[int, int] = field(default_factory=no_generations)
    as_of: int = -1  # seq of the last head written
    #: format-1 records to tombstone.  This and the other lists that are empty
    #: between commits are tuples, ``()`` when empty (one shared object, where
    #: an empty list is 56 bytes in every held session: figure 6)
    legacy: tuple[str, ...] = ()
    #: transcript chunks closed in the views and not yet mirrored in the
    #: checkpoint (parts ``x.<i>``: what a session tombstone must remove)
    closed_chunks: tuple[tuple[int, list[int]], ...] = ()
    next_bundle: int = 0  # number of the next ``~b<n>`` (unique per session)
    #: published transcript entries (from ``transcript_base``) that have a
    #: ``~m<seq>`` record of their own (format 2); the later ones are bundled
    singles: int = 0
    #: droppable entry (``~m<seq>[.<g>]`` name) -> bundle holding it; an entry
    #: not here has a record of its own (format 2)
    bundle_of: dict[str, int] = field(default_factory=dict)
    bundles: dict[int, BundleSlot] = field(default_factory=dict)
    #: bundles with droppable entries written / emptied since the last
    #: checkpoint: the checkpoint records them (entries ``vb.<n>``) so a
    #: restore knows what every views bundle holds, without a list in the head
    born: tuple[tuple[int, bool, list[str]], ...] = ()
    died: tuple[int, ...] = ()

    def drop(self, name: str, tombstones: list[str]) -> None:
        """Entry ``name`` is named no more: tombstone its record or its bundle's last use."""
        n = self.bundle_of.pop(name, None)
        if n is None:
            tombstones.append(name)
            return
        slot = self.bundles[n]
        slot.live -= 1
        if not slot.live:
            del self.bundles[n]
            self.died += (n,)
            if not slot.pinned:
                tombstones.append(bundle_view(n))

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
    #: the messages to publish: (seq, generation or None, message, transcript?)
    entries: list[tuple[int, int | None, Any, bool]] = field(default_factory=list)
    tombstones: list[str] = field(default_factory=list)
    head: dict[str, Any] = field(default_factory=dict)


def view_writes(
    session: Session,
    ledger: ViewLedger,
    generations: Mapping[int, int],
    quarantine: Any,
    *,
    page_size: int,
    max_bytes: int = 512 * 1024,
) -> ViewWrites:
    """The records that bring the views topic from ``ledger`` to ``session``."""
    out = ViewWrites()
    _transcript(session, ledger, out)
    state = session.surface.state
    live_nodes = set(state.nodes)
    refs = node_refs(session, generations)
    owned = ledger.owned
    for seq in state.nodes:
        generation = generations.get(seq)
        if generation is not None and ledger.overrides.get(seq) != generation:
            out.entries.append((seq, generation, state.overrides[seq], False))
        if seq not in owned and ledger.owns(session, seq, generation is not None):
            message = derive_event_message(state.node_events[seq])
            out.entries.append((seq, None, message, False))
            if not isinstance(owned, set):
                owned = ledger.owned = set(owned)
            owned.add(seq)
    for seq in sorted(owned):
        if seq not in live_nodes or seq in generations:
            ledger.drop(content_view(seq), out.tombstones)
            if not isinstance(owned, set):
                owned = ledger.owned = set(owned)
            owned.discard(seq)
    if not owned:
        ledger.owned = NO_SEQS
    for seq, generation in sorted(ledger.overrides.items()):
        if generations.get(seq) != generation:
            ledger.drop(content_view(seq, generation), out.tombstones)
    ledger.overrides = dict(generations) if generations else NO_GENERATIONS
    _bundle(out, ledger, max_bytes)
    chunks = ledger.nodes.update(refs, session.last_seq)
    out.records.extend((node_chunk_view(i), items) for i, items in chunks.writes)
    out.tombstones.extend(node_chunk_view(i) for i in chunks.removed)
    out.tombstones.extend(ledger.legacy)
    ledger.legacy = ()
    head: dict[str, Any] = {
        "f": VIEWS_FORMAT,
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
        out.entries.append((seq, None, entry["message"], True))
        tail.append(seq)
        ledger.transcript_total += 1
        if len(tail) == CHUNK_ITEMS:
            index = (ledger.transcript_total - ledger.transcript_base) // CHUNK_ITEMS - 1
            out.records.append((transcript_chunk_view(index), list(tail)))
            ledger.closed_chunks += ((index, list(tail)),)
            tail.clear()
    session.drop_transcript_before(total)  # the views hold them now


def _bundle(out: ViewWrites, ledger: ViewLedger, max_bytes: int) -> None:
    """``out.entries`` as bundles of at most ``max_bytes`` of JSON each (the records
    go first: a bundle precedes the transcript chunk and head that name its seqs)."""
    if not out.entries:
        return
    if not BUNDLES:  # format 2: a record per message
        out.records[:0] = [(content_view(s, g), m) for s, g, m, _ in out.entries]
        ledger.singles += sum(1 for *_, transcript in out.entries if transcript)
        return
    bundles: list[tuple[list[list[Any]], list[str], bool]] = []
    items: list[list[Any]] = []
    droppable: list[str] = []
    pinned = False
    size = 2
    for seq, generation, message, transcript in out.entries:
        # encoded once: the size decides the bundle, the bytes go into it as they are
        text = orjson.Fragment(encoded := orjson.dumps(message))
        entry_size = len(encoded) + 24  # + "[seq,generation,...]",
        if items and size + entry_size > max_bytes:
            bundles.append((items, droppable, pinned))
            items, droppable, pinned, size = [], [], False, 2
        size += entry_size
        items.append([seq, text] if generation is None else [seq, generation, text])
        if transcript:
            pinned = True
        else:
            droppable.append(content_view(seq, generation))
    bundles.append((items, droppable, pinned))
    records: list[tuple[str, Any]] = []
    for items, droppable, pinned in bundles:
        n = ledger.next_bundle
        ledger.next_bundle += 1
        records.append((bundle_view(n), items))
        live = 0
        for name in droppable:
            if name in ledger.bundle_of:  # rewritten whole (views held back, then
                ledger.drop(name, out.tombstones)  # published): the old copy goes
            if ledger.bundle_of.get(name) != n:
                ledger.bundle_of[name] = n
                live += 1
        if droppable:
            ledger.bundles[n] = BundleSlot(pinned, live)
            ledger.born += ((n, pinned, sorted(droppable)),)
    out.records[:0] = records
