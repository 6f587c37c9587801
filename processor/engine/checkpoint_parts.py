"""What a changed session writes to the checkpoints topic, in the parted format.

The head (schemas/checkpoint_head.avsc) is small and rewritten per batch;
what grows with the session is in parts (schemas/checkpoint_part.avsc),
written once or when it changed, and tombstoned in the transaction whose
head stops naming it — so the compacted topic keeps only live state:

- ``b.<n>``: a bundle (format 3): every part below but ``r.<i>`` and
  ``x.<i>`` that one checkpoint writes, as entries ``[name, value]`` or
  ``[name, value, version]``, so a checkpoint writes one part and its head
  whatever the batch held.  A bundle lives while one of its entries is
  still named (an entry is dropped when its node leaves, its override is
  superseded, it is rewritten by a later bundle, its digest block leaves
  the window...) and is tombstoned with the last (cut into several when
  its JSON would pass ``max_bytes``).  The same names as parts of their
  own (format 2) are still restored, and tombstoned when dropped;
- ``u.<key>``: a projection row ``{ver, val}``, rewritten when it changed
  (a small row that changed in this batch rides in the head instead);
- ``n.<i>`` / ``h.<i>``: closed chunks of the node list and the header
  seqs (chunks.py);
- ``r.<i>``: replacement ``i`` of the replace history (G-5), written once;
- ``d8.<b>``: a closed block of the duplicate-digest window (``d.<b>`` for
  the blocks of 16 of a version-1 head);
- ``hdr``: the session header;
- ``t.<seq>``: a transcript message the views have not published yet (held
  back by an in-place replay; none otherwise);
- ``x.<i>``: the seqs of the views' transcript chunk ``~t<i>``, written once:
  so a session tombstone names exactly the ``~m<seq>`` records that exist;
- ``vb.<n>``: ``[pinned, [name...]]``, the droppable messages views bundle
  ``~b<n>`` was written with (a bundle entry only), dropped when the last of
  them is: what a restored processor needs to tombstone that bundle in time.

The transcript is not in the checkpoint: the views hold it (view_parts.py).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from processor.codec import encode_json_payload
from processor.core.session import Session
from processor.core.sharing import BoundedTable, NewestTable
from processor.engine.chunks import ChunkLedger
from processor.engine.view_parts import NO_GENERATIONS, no_generations
from processor.protocol import DIGEST_BLOCK

#: Write bundles (format 3); False writes a part per entry (format 2), kept
#: only so tests can produce the previous format and prove it restores.
BUNDLES = True


#: One copy of each part name the held sessions' ledgers share (the same few
#: ``e.<seq>``, ``u.<key>`` and ``d8.<b>`` names in every session; a copy per
#: session was ~0.8 KB of each at 12 events, figure 6).  Seqs and keys come
#: from the input, so the table stops growing at its bound (later names are
#: plain copies, as before the sharing).
PART_NAMES: Final[BoundedTable[str]] = BoundedTable("part_names", 8192)


def shared_name(name: str) -> str:
    return PART_NAMES.share(name)


def bundle_part(number: int) -> str:
    return f"b.{number}"


def event_part(seq: int) -> str:
    return PART_NAMES.share(f"e.{seq}")


def override_part(seq: int, generation: int) -> str:
    return f"o.{seq}.{generation}"


def unit_part(key: str) -> str:
    return PART_NAMES.share(f"u.{key}")


def chunk_part(kind: str, index: int) -> str:
    return f"{kind}.{index}"


def digest_part(block: int, size: int = DIGEST_BLOCK) -> str:
    """``d.<b>`` for blocks of 16 (version-1 heads), ``d<size>.<b>`` otherwise:
    blocks of two sizes never share a key."""
    return PART_NAMES.share(f"d.{block}" if size == 16 else f"d{size}.{block}")


def pending_part(seq: int) -> str:
    return f"t.{seq}"


def views_bundle_part(number: int) -> str:
    return f"vb.{number}"


def seqs_part(index: int) -> str:
    return f"x.{index}"


HEADER_PART = "hdr"
UNIT_KEYS_PART = "k"
#: A row that changed in this checkpoint and in the one before (hot) rides in
#: the head as its leaf values against its part ``u.<key>`` (the base, same
#: shape), when those encode to at most this many bytes: rows that change
#: with every event (counters) then cost a few numbers per checkpoint, not a
#: record with every field name.
INLINE_ROW_BYTES = 512
#: A hot row that stopped changing keeps riding inline for this many
#: checkpoints (cheap) before it is written out as its part (a new base), so a
#: counter that pauses for one event does not cost a whole part.
SETTLE_AFTER = 4


@dataclass(slots=True)
class UnitSlot:
    """What the checkpoints topic holds for one projection row.

    The row's ``ver`` and (frozen, the cell's own) ``val``, not the row dict
    ``checkpoint()`` made: one dict per unit was ~1.6 KB of a held session at
    nine units (figure 6).
    """

    ver: Any  # the row as of the last checkpoint: its version...
    val: Any  # ... and its value
    changed_at: int  # lastSeq of the checkpoint that last changed it
    part_version: int | None = None  # version of the live part ``u.<key>``, if any
    part_val: Any = None  # the ``val`` that part holds (the base of inline leaves)
    inline: bool = False  # the head carries it (as leaves against the part)


#: The one empty ``standalone`` (``frozenset()`` is a new object per call)
NO_NAMES: frozenset[str] = frozenset()


@dataclass(slots=True)
class PartLedger:
    """The parts the checkpoints topic holds for one session.

    No set of the event parts ``e.<seq>``: they are the session's nodes and
    headers as of ``last_write`` (checkpoint_writes), and ``bundle_of`` names
    the bundled ones (the set was 0.6 KB of each held 12-event session, figure
    6).  The lists that are mostly empty are tuples, ``()`` when empty (one
    shared object, where an empty list is 56 bytes per held session).
    """

    #: seq -> generation (the shared empty mapping while there are none)
    overrides: Mapping[int, int] = field(default_factory=no_generations)
    units: dict[str, UnitSlot] = field(default_factory=dict)
    unit_keys: tuple[list[str], int] | None = None  # part ``k``: (keys, version)
    nodes: ChunkLedger = field(default_factory=ChunkLedger)
    headers: ChunkLedger = field(default_factory=ChunkLedger)
    replacements: int = 0  # parts ``r.<i>`` written
    digest_blocks: tuple[int, ...] = ()
    digest_size: int = DIGEST_BLOCK  # block size of ``digest_blocks``
    header: Any = None  # the header object written as ``hdr``
    last_write: int = -1  # lastSeq of the previous checkpoint of this session
    #: transcript entries folded while the views were held back: parts ``t.<seq>``
    pending: tuple[int, ...] = ()
    #: parts ``x.<i>`` exist for transcript chunks ``seq_chunks_from <= i < seq_chunks``
    #: (a session restored from an older head has none for its earlier chunks)
    seq_chunks_from: int = 0
    seq_chunks: int = 0
    next_bundle: int = 0  # number of the next part ``b.<n>``
    bundle_of: dict[str, int] = field(default_factory=dict)  # entry -> its bundle
    #: live bundle -> how many of its entries are still named (``bundle_of``
    #: names them: a set per bundle would hold every name twice)
    bundles: dict[int, int] = field(default_factory=dict)
    stale: tuple[int, ...] = ()  # restored bundles nothing names: tombstone
    #: rewritable parts (not ``e.``/``o.``) that live as records of their own
    #: (format 2): a bundle entry that supersedes one tombstones it
    #: (almost always none: an empty frozenset, not a 216-byte set per session)
    standalone: Set[str] = NO_NAMES

    def drop(self, name: str, tombstones: list[str]) -> None:
        """Entry ``name`` is named no more: tombstone its part or its bundle's last use."""
        n = self.bundle_of.pop(name, None)
        if n is None or name in self.standalone:
            tombstones.append(name)
            if isinstance(self.standalone, set):  # non-empty ones are sets
                self.standalone.discard(name)
        if n is None:
            return
        live = self.bundles[n] - 1
        self.bundles[n] = live
        if not live:
            del self.bundles[n]
            tombstones.append(bundle_part(n))

    def names(self, events: Iterable[int]) -> list[str]:
        """Every live part (a session tombstone removes them all); ``events``: the
        session's nodes and headers as of the last checkpoint."""
        entries = [event_part(s) for s in sorted(events)]
        entries += [override_part(s, g) for s, g in sorted(self.overrides.items())]
        names = [e for e in entries if e not in self.bundle_of]
        names += [bundle_part(n) for n in sorted(self.bundles)]
        names += sorted(self.standalone)
        names += [
            unit_part(k) for k in sorted(self.units) if self.units[k].part_version is not None
        ]
        if self.unit_keys is not None:
            names.append(UNIT_KEYS_PART)
        for kind, chunks in (("n", self.nodes), ("h", self.headers)):
            names += [chunk_part(kind, i) for i in range(len(chunks.closed))]
        names += [chunk_part("r", i) for i in range(self.replacements)]
        names += [digest_part(b, self.digest_size) for b in self.digest_blocks]
        if self.header is not None:
            names.append(HEADER_PART)
        names += [pending_part(s) for s in self.pending]
        names += [seqs_part(i) for i in range(self.seq_chunks_from, self.seq_chunks)]
        return [n for n in dict.fromkeys(names) if n not in self.bundle_of]


@dataclass(slots=True)
class PartWrites:
    parts: list[tuple[str, int, Any]] = field(default_factory=list)  # (name, version, value)
    #: the parts to bundle, same shape (``parts`` are the ones written whole)
    entries: list[tuple[str, int, Any]] = field(default_factory=list)
    tombstones: list[str] = field(default_factory=list)
    head: dict[str, Any] = field(default_factory=dict)  # the surface-side head fields


def _chunks(
    kind: str,
    parts: PartLedger,
    ledger: ChunkLedger,
    items: Sequence[Any],
    version: int,
    out: PartWrites,
) -> dict[str, Any]:
    writes = ledger.update(items, version)
    out.entries.extend((chunk_part(kind, i), version, chunk) for i, chunk in writes.writes)
    for i in writes.removed:
        parts.drop(chunk_part(kind, i), out.tombstones)
    return {"chunks": ledger.versions, "tail": ChunkLedger.tail(items)}


def checkpoint_writes(
    session: Session,
    ledger: PartLedger,
    generations: Mapping[int, int],
    digests: bytes,
    window: int,
    published: int,
    closed_chunks: Sequence[tuple[int, list[int]]] = (),
    max_bytes: int = 512 * 1024,
    views_born: Sequence[tuple[int, bool, list[str]]] = (),
    views_died: Sequence[int] = (),
) -> PartWrites:
    """The parts that bring the checkpoints topic from ``ledger`` to ``session``.

    ``published``: transcript entries the views topic holds;
    ``closed_chunks``: the views' transcript chunks closed since the last call.
    """
    out = PartWrites()
    state = session.surface.state
    last = session.last_seq
    # the topic holds part ``e.<seq>`` for exactly the nodes and headers of the
    # previous checkpoint (``last_write``): a node enters with a new seq and
    # leaves only by a replace (``state.replacements``), a header never leaves
    written = ledger.last_write
    for seq in [*state.nodes, *state.headers]:
        if seq > written:
            event = state.node_events.get(seq) or state.headers[seq]
            out.entries.append((event_part(seq), 0, event.to_json()))
    shadowed = [s for r in state.replacements[ledger.replacements :] for s in r.shadowed]
    for seq in sorted(s for s in shadowed if s <= written):
        ledger.drop(event_part(seq), out.tombstones)
    for seq, generation in generations.items():
        if ledger.overrides.get(seq) != generation:
            out.entries.append((override_part(seq, generation), 0, state.overrides[seq]))
    for seq, generation in sorted(ledger.overrides.items()):
        if generations.get(seq) != generation:
            ledger.drop(override_part(seq, generation), out.tombstones)
    ledger.overrides = dict(generations) if generations else NO_GENERATIONS
    out.tombstones.extend(bundle_part(n) for n in ledger.stale)
    ledger.stale = ()
    rows = session.projections.checkpoint(detached=False)
    inline = {
        key: blob for key, row in rows.items() if (blob := _unit(key, row, ledger, last, out))
    }
    for key in sorted(set(ledger.units) - set(rows)):
        if ledger.units[key].part_version is not None:
            ledger.drop(unit_part(key), out.tombstones)
        del ledger.units[key]
    if session.header is not ledger.header:
        out.entries.append((HEADER_PART, 0, session.header))
        ledger.header = session.header
    out.head = {
        "replaceGeneration": state.replace_generation,
        "contentGeneration": state.content_generation,
        "projectionTypesUsed": sorted(state.projection_types_used),
        "nodes": _chunks("n", ledger, ledger.nodes, state.nodes, last, out),
        "headers": _chunks("h", ledger, ledger.headers, list(state.headers), last, out),
        "overrides": [{"seq": s, "generation": g} for s, g in sorted(generations.items())],
        "unitKeys": _unit_keys(list(rows), ledger, last, out),
        "units": [_unit_ref(last, ledger.units[k], inline.get(k)) for k in rows],
    }
    # the replace history only grows and each entry can be long (its shadowed
    # seqs): one part per replacement, written once; the head holds the count
    for i in range(ledger.replacements, len(state.replacements)):
        out.parts.append((chunk_part("r", i), 0, state.replacements[i].to_json()))
    ledger.replacements = len(state.replacements)
    out.head["replacements"] = ledger.replacements
    _digests(last, digests, window, ledger, out)
    _pending(session, published, ledger, out)
    for index, seqs in closed_chunks:
        if index >= ledger.seq_chunks:
            out.parts.append((seqs_part(index), 0, seqs))
            ledger.seq_chunks = index + 1
    ledger.last_write = last
    died = set(views_died)
    for n, pinned, names in views_born:
        if n not in died:  # born and emptied since the last checkpoint: nothing to keep
            out.entries.append((views_bundle_part(n), 0, [pinned, names]))
    born = {n for n, _, _ in views_born}
    for n in views_died:
        if n not in born:
            ledger.drop(views_bundle_part(n), out.tombstones)
    _bundle(ledger, max_bytes, out)
    return out


def _bundle(ledger: PartLedger, max_bytes: int, out: PartWrites) -> None:
    """``out.entries`` as bundle parts of at most ``max_bytes`` of JSON each."""
    entries = out.entries
    if not entries:
        return
    if not BUNDLES:  # format 2: a part per entry
        out.parts.extend(entries)
        ledger.standalone = {
            *ledger.standalone,
            *(n for n, _, _ in entries if not n.startswith(("e.", "o."))),
        }
        return
    groups: list[list[list[Any]]] = [[]]
    size = 2
    for name, version, value in entries:
        if name in ledger.bundle_of or name in ledger.standalone:
            ledger.drop(name, out.tombstones)  # rewritten: the old copy goes
        # encoded once: the size decides the group, the bytes go into it as they are
        text = orjson.Fragment(encoded := orjson.dumps(value))
        entry_size = len(encoded) + len(name) + 30  # + '["name",...,version],'
        if groups[-1] and size + entry_size > max_bytes:
            groups.append([])
            size = 2
        size += entry_size
        groups[-1].append([name, text, version] if version else [name, text])
    for group in groups:
        n = ledger.next_bundle
        ledger.next_bundle += 1
        out.parts.append((bundle_part(n), 0, group))
        live = 0
        for entry in group:
            if ledger.bundle_of.get(entry[0]) != n:
                ledger.bundle_of[entry[0]] = n
                live += 1
        ledger.bundles[n] = live


def _pending(session: Session, published: int, ledger: PartLedger, out: PartWrites) -> None:
    """Transcript entries the views have not published (held back) are kept as
    parts, so a restore can still publish them; published ones are tombstoned."""
    entries = session.transcript_slice(published, session.transcript_count)
    seqs = [int(e["seq"]) for e in entries]
    known = set(ledger.pending)
    out.entries.extend(
        (pending_part(int(e["seq"])), 0, e["message"])
        for e in entries
        if int(e["seq"]) not in known
    )
    live = set(seqs)
    for s in ledger.pending:
        if s not in live:
            ledger.drop(pending_part(s), out.tombstones)
    ledger.pending = tuple(seqs)


def _unit(
    key: str, row: Mapping[str, Any], ledger: PartLedger, last: int, out: PartWrites
) -> bytes:
    """Bring row ``key`` up to date: its inline leaves (empty: the head reads the part)."""
    slot = ledger.units.get(key)
    ver, val = row["ver"], row["val"]
    if slot is not None and _same_row(slot, ver, val):
        if slot.part_version is not None and not slot.inline:
            return b""  # the part holds it
        if slot.part_version is not None and last - slot.changed_at < SETTLE_AFTER:
            blob = _encode_leaves(slot.part_val, ver, val)
            if blob is not None:
                return blob  # paused: keeps riding a while
        # settled (or a format-2 inline row without a part): write it out
    elif (
        slot is not None
        and slot.part_version is not None
        and (
            slot.inline or slot.changed_at == ledger.last_write  # changed twice in a row: hot
        )
    ):
        blob = _encode_leaves(slot.part_val, ver, val)
        if blob is not None and len(blob) <= INLINE_ROW_BYTES:
            slot.ver, slot.val, slot.changed_at, slot.inline = ver, val, last, True
            return blob
    # a new, cold, reshaped or settled row: the part (the next inline rows' base)
    changed_at = last if slot is None or not _same_row(slot, ver, val) else slot.changed_at
    out.entries.append((unit_part(key), last, {"ver": ver, "val": val}))
    ledger.units[key] = UnitSlot(ver, val, changed_at, last, val, False)
    return b""


def _unit_ref(last: int, slot: UnitSlot, leaves: bytes | None) -> dict[str, Any]:
    assert slot.part_version is not None  # every row has its part once written
    return {"age": last - slot.part_version, "row": None, "leaves": leaves}


def _leaves(base: Any, val: Any, out: list[Any]) -> bool:
    """Append the leaf values of ``val`` in ``base``'s shape; False if shapes differ."""
    if isinstance(base, dict):
        if not isinstance(val, dict) or len(val) != len(base):
            return False
        # the lengths are equal: zip needs no ``strict`` (which compiled is a
        # generic call per dict, ~2.8k instructions, not a native loop)
        for (bk, bv), (k, v) in zip(base.items(), val.items()):  # noqa: B905
            if bk != k or not _leaves(bv, v, out):
                return False
        return True
    out.append(val)  # a leaf of the base: any value (also an object) fills it
    return True


def encode_leaves(base: Mapping[str, Any], row: Mapping[str, Any]) -> bytes | None:
    """``row`` as the JSON array ``[ver, leaf...]`` of its values in ``base``'s
    shape (the base's objects with the same keys in the same order are
    descended into; any other base value is a leaf that ``row`` fills with
    any value), or None when the shapes differ."""
    return _encode_leaves(base["val"], row["ver"], row["val"])


def _encode_leaves(base: Any, ver: Any, val: Any) -> bytes | None:
    leaves: list[Any] = [ver]
    if not _leaves(base, val, leaves):
        return None
    return encode_json_payload(leaves, threshold=1 << 62)[1]


_END = object()


def _rebuild(base: Any, leaves: Iterator[Any]) -> Any:
    if isinstance(base, dict):
        return {k: _rebuild(v, leaves) for k, v in base.items()}
    leaf = next(leaves, _END)
    if leaf is _END:
        raise ValueError("fewer leaves than the base row has")
    return leaf


def decode_leaves(base: Mapping[str, Any], leaves: Any) -> dict[str, Any]:
    """The row ``{ver, val}`` that :func:`encode_leaves` encoded against ``base``
    (ValueError when ``leaves`` does not fit ``base``)."""
    if not isinstance(leaves, list) or not leaves:
        raise ValueError("inline row leaves are not a non-empty JSON array")
    it = iter(leaves[1:])
    val = _rebuild(base["val"], it)
    if next(it, _END) is not _END:
        raise ValueError("more leaves than the base row has")
    return {"ver": leaves[0], "val": val}


#: The unit keys last seen (one entry: nothing stale is held), never mutated
UNIT_KEYS: Final[NewestTable[list[str], list[str]]] = NewestTable("unit_keys", 1)


def shared_keys(keys: list[str]) -> list[str]:
    """``keys`` as the one list of the last keys seen when equal: every session
    of the same units names the same keys (a list per session was ~0.1 KB)."""
    return UNIT_KEYS.get(keys, keys)


def _unit_keys(keys: list[str], ledger: PartLedger, last: int, out: PartWrites) -> int:
    """The version of part ``k`` naming ``keys`` (written when the keys change)."""
    if ledger.unit_keys is None or ledger.unit_keys[0] != keys:
        out.entries.append((UNIT_KEYS_PART, last, keys))
        ledger.unit_keys = (shared_keys(keys), last)
    return ledger.unit_keys[1]


def _same_row(slot: UnitSlot, ver: Any, val: Any) -> bool:
    return slot.ver == ver and (slot.val is val or slot.val == val)


def _digests(last: int, digests: bytes, window: int, ledger: PartLedger, out: PartWrites) -> None:
    """Closed blocks of the duplicate window as parts, the open block in the head.

    ``digests``: the 8-byte digests of contiguous seqs ending at ``last``, joined.
    """
    first = last - len(digests) // 8 + 1
    tail_block = (last + 1) // DIGEST_BLOCK
    start = max(first, tail_block * DIGEST_BLOCK)
    out.head["digestTail"] = digests[8 * (start - first) :]
    blocks: list[int] = []
    if first <= tail_block * DIGEST_BLOCK:
        block = tail_block - 1
        while (
            block >= 0
            and block * DIGEST_BLOCK >= first
            and (block + 1) * DIGEST_BLOCK - 1 >= last - window + 1
        ):
            blocks.append(block)
            block -= 1
    blocks.reverse()
    if ledger.digest_size != DIGEST_BLOCK:  # restored from a head of another block size
        for b in ledger.digest_blocks:
            ledger.drop(digest_part(b, ledger.digest_size), out.tombstones)
        ledger.digest_blocks, ledger.digest_size = (), DIGEST_BLOCK
    live = set(blocks)
    for block in blocks:
        if block not in ledger.digest_blocks:
            lo = block * DIGEST_BLOCK - first
            blob = digests[8 * lo : 8 * (lo + DIGEST_BLOCK)]
            out.entries.append((digest_part(block), 0, base64.b64encode(blob).decode()))
    for b in ledger.digest_blocks:
        if b not in live:
            ledger.drop(digest_part(b), out.tombstones)
    ledger.digest_blocks = tuple(blocks)
    out.head["digestFirstBlock"] = blocks[0] if blocks else tail_block
    out.head["digestBlock"] = DIGEST_BLOCK
