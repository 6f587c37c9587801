"""What a changed session publishes, in the parted format (issue 12).

Per changed session and batch, in produce order: its new view records
(messages, transcript chunks, rewritten node chunks, changed unit views),
the tombstones of view records nothing names any more, the views head; then
its new checkpoint parts, their tombstones, the checkpoint head.  Parts come
before the head that names them, all in the runner's one transaction, so a
``read_committed`` reader that sees a head can read everything it names.
view_parts.py and checkpoint_parts.py decide what changed; this module
frames it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from processor.codec import (
    Checkpoint,
    Codec,
    View,
    encode_head,
    encode_json_payload,
    encode_part,
    part_key,
    session_key,
    split_view,
    stale_part_keys,
    view_key,
)
from processor.config import ServiceConfig
from processor.core.session import CHECKPOINT_VERSION
from processor.engine.checkpoint_parts import (
    NO_NAMES,
    UnitSlot,
    checkpoint_writes,
    shared_keys,
    shared_name,
)
from processor.engine.chunks import ChunkLedger
from processor.engine.records import Out, Tally
from processor.engine.runtime import SessionRuntime, ViewChange
from processor.engine.view_parts import (
    NO_GENERATIONS,
    NO_SEQS,
    BundleSlot,
    ViewLedger,
    node_refs,
    view_writes,
)
from processor.protocol import (
    CHUNK_ITEMS,
    CORE_STATE_VERSION,
    CORE_VIEWS,
    VIEW_HEAD,
    bundle_view,
    content_view,
    node_chunk_view,
    transcript_chunk_view,
    transcript_page,
)


def session_output(
    rt: SessionRuntime,
    changes: Iterable[ViewChange] | None,
    view_parts: dict[tuple[str, str], int],
    *,
    config: ServiceConfig,
    codec: Codec,
    tally: Tally,
) -> Iterator[Out]:
    """The records of one changed session, in produce order.

    ``changes``: its unit view changes, or None while its views are held
    back (publish floor).  ``view_parts``: (session, unit view) -> parts last
    published, updated here.
    """
    generations = rt.override_generations()
    if changes is not None:
        yield from _views(
            rt,
            changes,
            view_parts,
            generations,
            config=config,
            codec=codec,
            tally=tally,
        )
    split = [{"unit": u, "parts": n} for (s, u), n in view_parts.items() if s == rt.session_id]
    yield from _checkpoint(rt, generations, split, config=config, codec=codec, tally=tally)


def _views(
    rt: SessionRuntime,
    changes: Iterable[ViewChange],
    view_parts: dict[tuple[str, str], int],
    generations: dict[int, int],
    *,
    config: ServiceConfig,
    codec: Codec,
    tally: Tally,
) -> Iterator[Out]:
    topic, partition, sid, as_of = config.topics.views, rt.partition, rt.session_id, rt.last_seq
    quarantine = rt.quarantine.to_json() if rt.quarantine else None
    writes = view_writes(
        rt.session,
        rt.view_ledger,
        generations,
        quarantine,
        page_size=config.transcript_page_size,
        max_bytes=config.max_view_bytes,
    )
    threshold = codec.compress_threshold
    for name, value in writes.records:
        encoding, payload = encode_json_payload(value, threshold=threshold)
        encoded = codec.encode_whole_view(sid, name, as_of, CORE_STATE_VERSION, encoding, payload)
        yield Out(topic, partition, view_key(sid, name), encoded)
    tally.views_published += len(writes.records)
    max_bytes = config.max_view_bytes
    for change in changes:  # domain units: one record per unit, split when too large
        ident = (sid, change.name)
        old_parts = view_parts.get(ident, 1)
        if change.removed:
            for k in stale_part_keys(sid, change.name, old_parts, 0):
                yield Out(topic, partition, k, None)
            view_parts.pop(ident, None)
            continue
        encoding, payload = encode_json_payload(change.value, threshold=threshold)
        if old_parts == 1 and 0 < len(payload) <= max_bytes:
            # nearly every unit view: one part before and after, nothing to
            # tombstone or to remember (the general path below, short)
            encoded = codec.encode_whole_view(
                sid, change.name, as_of, change.state_version, encoding, payload
            )
            yield Out(topic, partition, view_key(sid, change.name), encoded)
            tally.views_published += 1
            continue
        whole = View(sid, change.name, as_of, change.state_version, encoding, payload)
        records = split_view(whole, max_bytes)
        for k in stale_part_keys(sid, change.name, old_parts, len(records)):
            yield Out(topic, partition, k, None)
        for record in sorted(records, key=lambda r: -r.part):  # parts first, head last
            yield Out(topic, partition, record.key, codec.encode_view(record))
        if len(records) > 1:  # one part is the default: a dict entry per session and
            view_parts[ident] = len(records)  # unit would outgrow the memory budget
        else:
            view_parts.pop(ident, None)
        tally.views_published += len(records)
    for name in writes.tombstones:
        yield Out(topic, partition, view_key(sid, name), None)
    encoding, payload = encode_json_payload(writes.head, threshold=threshold)
    encoded = codec.encode_whole_view(sid, VIEW_HEAD, as_of, CORE_STATE_VERSION, encoding, payload)
    yield Out(topic, partition, view_key(sid, VIEW_HEAD), encoded)
    tally.views_published += 1


def _checkpoint(
    rt: SessionRuntime,
    generations: dict[int, int],
    unit_parts: list[dict[str, Any]],
    *,
    config: ServiceConfig,
    codec: Codec,
    tally: Tally,
) -> Iterator[Out]:
    topic, partition, sid = config.topics.checkpoints, rt.partition, rt.session_id
    session = rt.session
    views = rt.view_ledger
    writes = checkpoint_writes(
        session,
        rt.part_ledger,
        generations,
        rt.digest_blob,
        rt.window,
        views.transcript_total,
        views.closed_chunks,
        max_bytes=config.max_view_bytes,
        views_born=views.born,
        views_died=views.died,
    )
    views.closed_chunks = views.born = views.died = ()
    for name, version, value in writes.parts:
        yield Out(
            topic,
            partition,
            part_key(sid, name),
            encode_part(codec, name, version, value),
        )
    for name in writes.tombstones:
        yield Out(topic, partition, part_key(sid, name), None)
    digest = session.last_digest
    q = rt.quarantine
    head: dict[str, Any] = {
        "sessionId": sid,
        "lastSeq": session.last_seq,
        "anchor": {
            "partition": rt.partition,
            "offset": rt.last_offset,
            "seq": session.last_seq,
            "digest": bytes.fromhex(digest) if digest else b"",
        },
        "coreVersion": CHECKPOINT_VERSION,
        **writes.head,
        "lastOffset": rt.last_offset,
        "quarantine": None
        if q is None
        else {"seq": q.seq, "rule": q.rule, "reason": q.reason, "offset": q.offset},
        "redriveAt": rt.redrive_at,
        "liftedAt": rt.lifted_at,
        "views": {
            "asOfSeq": views.as_of,
            "pending": list(rt.part_ledger.pending),
            "transcriptTotal": views.transcript_total,
            "transcriptBase": views.transcript_base,
            "transcriptTail": list(views.transcript_tail),
            "contentFloor": views.content_floor,
            "nodeChunks": views.nodes.versions,
            "seqChunksFrom": rt.part_ledger.seq_chunks_from,
            "nextBundle": views.next_bundle,
            "transcriptSingles": views.singles,
            "unitParts": unit_parts,  # split unit views: what a shrink must tombstone
        },
    }
    yield Out(topic, partition, session_key(sid), encode_head(codec, head))
    tally.checkpoints_published += len(writes.parts) + 1


def restore_ledgers(rt: SessionRuntime, parted: Any, page_size: int) -> list[tuple[str, int]]:
    """What the two topics hold for a restored session (see ``latest_checkpoints``);
    returns its split unit views and their parts (the engine keeps them per partition).

    ``parted``: the format-2 facts of its checkpoint, or None for a format-1
    checkpoint — then every part is written on the first batch, and the
    format-1 core view records are tombstoned but its closed transcript
    pages kept (the new transcript continues after them).
    """
    session = rt.session
    state = session.surface.state
    views = rt.view_ledger
    if parted is None:
        base = session.transcript_base
        retained = session.transcript()
        views.transcript_base = views.transcript_total = base
        views.content_floor = int(retained[0]["seq"]) if retained else session.last_seq + 1
        published = int(rt.published_transcript)
        views.legacy = (
            *CORE_VIEWS,
            *(transcript_page(n) for n in range(base // page_size, -(-published // page_size))),
        )
        return []
    v = parted["views"]
    views.next_bundle = int(v.get("nextBundle", 0))  # before any return: numbers stay unique
    singles = int(v.get("transcriptSingles", -1))  # -1: a format-2 head, all singles
    views.singles = singles if singles >= 0 else v["transcriptTotal"] - v["transcriptBase"]
    generations = {int(s): int(g) for s, g in parted["overrides"]}
    rt.adopt_override_generations(generations)
    parts = rt.part_ledger
    parts.overrides = dict(generations) if generations else NO_GENERATIONS
    rows = session.projections.checkpoint(detached=False)
    # names shared as a fresh session's are (checkpoint_parts.unit_part and
    # friends): decoded, they were a copy per loaded session (~1.2 KB of each)
    parts.units = {
        shared_name(k): _unit_slot(rows[k], session.last_seq if inline else int(v), v, base, inline)
        for k, v, inline, base in parted["units"]
        if k in rows
    }
    parts.unit_keys = (shared_keys([u[0] for u in parted["units"]]), int(parted["unitKeys"]))
    parts.nodes = ChunkLedger.restored(state.nodes, parted["nodeChunks"])
    parts.headers = ChunkLedger.restored(list(state.headers), parted["headerChunks"])
    parts.replacements = len(state.replacements)
    parts.digest_blocks = tuple(parted["digestBlocks"])
    parts.digest_size = int(parted["digestSize"])
    parts.header = session.header
    parts.last_write = session.last_seq
    for n, names in parted.get("partBundles", ()):
        if names:
            parts.bundle_of.update(dict.fromkeys(map(shared_name, names), int(n)))
            parts.bundles[int(n)] = len(set(names))
        else:
            parts.stale += (int(n),)
        parts.next_bundle = max(parts.next_bundle, int(n) + 1)
    parts.standalone = set(parted.get("standalone", ())) or NO_NAMES
    parts.pending = tuple(int(s) for s in v["pending"])
    parts.seq_chunks_from = int(parted["seqChunksFrom"])
    parts.seq_chunks = (int(v["transcriptTotal"]) - int(v["transcriptBase"])) // CHUNK_ITEMS
    views.transcript_total = int(v["transcriptTotal"])
    views.transcript_base = int(v["transcriptBase"])
    views.transcript_tail = [int(s) for s in v["transcriptTail"]]
    views.content_floor = int(v["contentFloor"])
    if int(v["asOfSeq"]) != session.last_seq:
        _restore_view_bundles(views, parted.get("viewBundles", ()), None)
        return restored_unit_parts(
            parted
        )  # views held back: the rest is written whole when they are published
    views.as_of = int(v["asOfSeq"])
    views.nodes = ChunkLedger.restored(node_refs(session, generations), v["nodeChunks"])
    views.owned = {s for s in state.nodes if views.owns(session, s, s in generations)} or NO_SEQS
    views.overrides = dict(generations) if generations else NO_GENERATIONS
    _restore_view_bundles(views, parted.get("viewBundles", ()), generations)
    return restored_unit_parts(parted)


def restored_unit_parts(parted: Any) -> list[tuple[str, int]]:
    """The split unit views a checkpoint records (head schema version 4)."""
    if not parted:
        return []
    return [(u["unit"], int(u["parts"])) for u in parted["views"].get("unitParts", ())]


def _unit_slot(row: Any, changed_at: int, version: Any, base: Any, inline: bool) -> UnitSlot:
    """The slot of a restored row; ``base``: the row its part holds (None: no part)."""
    part_val = None if base is None else base["val"]
    if part_val is not None and part_val == row["val"]:
        part_val = row["val"]  # the cell's frozen value: not a second, decoded copy
    return UnitSlot(row["ver"], row["val"], changed_at, version, part_val, inline)


def _restore_view_bundles(
    views: ViewLedger, described: Any, generations: dict[int, int] | None
) -> None:
    """The views bundles with droppable entries (checkpoint entries ``vb.<n>``).

    ``generations`` None (views held back): every entry a bundle was written
    with counts as named (the whole rewrite on publication drops them);
    otherwise only the ones the restored state still names.
    """
    named: set[str] | None = None
    if generations is not None:
        named = {content_view(s) for s in views.owned}
        named |= {content_view(s, g) for s, g in generations.items()}
    for n, pinned, names in described:
        live = set(names) if named is None else set(names) & named
        if not live:  # emptied without the checkpoint noticing: finish the job
            views.died += (int(n),)
            if not pinned:
                views.legacy += (bundle_view(int(n)),)
            continue
        views.bundles[int(n)] = BundleSlot(bool(pinned), len(live))
        views.bundle_of.update(dict.fromkeys(live, int(n)))


def session_tombstones(
    partition: int, sid: str, cp: Checkpoint, units: Iterable[str], config: ServiceConfig
) -> list[tuple[str, int, bytes]]:
    """Every record a session has in both topics, as tombstones (head keys first).

    A format-2 session's ``~m<seq>`` records are its surface nodes' and its
    transcript's, whose seqs the checkpoint keeps (parts ``x.<i>``, head
    ``transcriptTail``): so the tombstones follow the live state, not the
    session's length.  Only the transcript chunks before ``seqChunksFrom``
    (a session checkpointed before those parts existed) are unknown: every
    seq below the first known one is tombstoned for them.

    They commit in one transaction, the first of the rebuild, before any
    record the refold writes: a tombstone committed after a new record of
    the same key would delete it, so they cannot trail the rebuild.
    """
    cps, views, ps = config.topics.checkpoints, config.topics.views, config.transcript_page_size
    out = [(cps, partition, session_key(sid))]
    service = cp.surface.get("service", {})
    parted = service.get("parted")
    names = [*units, *CORE_VIEWS]
    if parted is None:
        published = int(service.get("published", {}).get("transcript", 0))
        names += [transcript_page(n) for n in range(-(-published // ps))]
    else:
        out += [(cps, partition, part_key(sid, name)) for name in parted["partNames"]]
        v = parted["views"]
        chunks = (int(v["transcriptTotal"]) - int(v["transcriptBase"])) // CHUNK_ITEMS
        names += [transcript_page(n) for n in range(-(-int(v["transcriptBase"]) // ps))]
        names += [VIEW_HEAD, *(node_chunk_view(i) for i in range(len(v["nodeChunks"])))]
        names += [bundle_view(n) for n in range(int(v.get("nextBundle", 0)))]
        names += [transcript_chunk_view(i) for i in range(chunks)]
        # messages in bundles have no record of their own (format 3): name only
        # the format-2 ones, the transcript's first ``singles`` and the
        # droppable entries the checkpoint lists in no bundle
        bundled = {name for _, _, names in parted.get("viewBundles", ()) for name in names}
        overrides = [content_view(int(s), int(g)) for s, g in parted["overrides"]]
        names += [n for n in overrides if n not in bundled]
        total = int(v["transcriptTotal"]) - int(v["transcriptBase"])
        singles = total if int(v.get("transcriptSingles", -1)) < 0 else int(v["transcriptSingles"])
        first = int(parted["seqChunksFrom"]) * CHUNK_ITEMS  # position of the first known seq
        known = [int(s) for s in parted["transcriptSeqs"]][: max(singles - first, 0)]
        if int(parted["seqChunksFrom"]) > 0 and singles:  # earlier seqs are not recorded
            known = [*range(known[0] if known else cp.last_seq + 1), *known]
        nodes = [content_view(int(s)) for s in cp.surface["core"]["surface"]["nodes"]]
        own = {content_view(s) for s in known} | {n for n in nodes if n not in bundled}
        names += sorted(own)
    out += [(views, partition, view_key(sid, name)) for name in names]
    for unit, parts in restored_unit_parts(parted):  # the other parts of split units
        out += [(views, partition, view_key(sid, unit, i)) for i in range(1, parts)]
    return out
