"""The parted format (issue 12): a batch writes what changed, not the session.

Broker-less: the engine harness produces the records of each transaction;
restores go through ``latest_checkpoints`` and reads through the views
reader's materializer, the two entries every consumer uses.
"""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import fastavro
import orjson
import pytest

from processor.client.views_reader import (
    _Materializer,
    offline_equivalent,
    session_fold_equivalent,
)
from processor.codec import (
    Anchor,
    Checkpoint,
    decode_part,
    encode_part,
    part_key,
    schema_fingerprint,
    split_part_key,
)
from processor.codec.schemas import find_schema_dir
from processor.core.builder import LogBuilder
from processor.core.events import Event
from processor.core.session import CHECKPOINT_VERSION
from processor.engine import Out
from processor.engine.checkpoint_parts import decode_leaves, encode_leaves
from processor.engine.checkpoints import latest_checkpoints
from processor.offline import fold_events, session_output
from tests.engine.format2 import format2
from tests.engine.kit import CODEC, CONFIG, Harness, session_log

VIEWS, CHECKPOINTS = CONFIG.topics.views, CONFIG.topics.checkpoints
SCHEMAS = find_schema_dir()


def size(outs: list[Out]) -> int:
    return sum(len(o.key or b"") + len(o.value or b"") for o in outs)


def conversation(n: int) -> list[Event]:
    """A system head and ``n - 1`` user messages: ``n`` surface nodes."""
    b = LogBuilder()
    b.system("You are terse.")
    for i in range(n - 1):
        b.user(f"message number {i}")
    return b.events


def expected(log: list[Event]) -> dict[str, Any]:
    return offline_equivalent(session_output(fold_events(log)))


def core(doc: dict[str, Any]) -> dict[str, Any]:
    """The core views of a fold-equivalent document (units are records of their own)."""
    return {k: v for k, v in doc.items() if k != "projections"}


def part_names(outs: list[Out], sid: str = "s") -> tuple[set[str], set[str]]:
    """(written, tombstoned) checkpoint part names of ``sid`` in ``outs``."""
    written: set[str] = set()
    gone: set[str] = set()
    for o in outs:
        ident = split_part_key(o.key or b"") if o.topic == CHECKPOINTS else None
        if ident is not None and ident[0] == sid:
            (gone if o.value is None else written).add(ident[1])
    return written, gone


def view_names(outs: list[Out], sid: str = "s") -> tuple[set[str], set[str]]:
    prefix = f"{sid}/".encode()
    written: set[str] = set()
    gone: set[str] = set()
    for o in outs:
        if o.topic == VIEWS and o.key is not None and o.key.startswith(prefix):
            (gone if o.value is None else written).add(o.key[len(prefix) :].decode())
    return written, gone


def _bundle_entries(o: Out) -> list[str]:
    """The entry names a written bundle record holds (format 3)."""
    if o.topic == CHECKPOINTS:
        return [str(entry[0]) for entry in decode_part(CODEC, o.value or b"")[2]]
    items = CODEC.decode_view(o.value or b"").json_value()
    return [f"~m{e[0]}" if len(e) == 2 else f"~m{e[0]}.{e[1]}" for e in items]


def entry_names(
    outs: list[Out], history: list[Out], topic: str, sid: str = "s"
) -> tuple[set[str], set[str]]:
    """(written, tombstoned) entry names of ``sid`` in ``outs``: a bundle counts
    as its entries (what a tombstoned bundle held is looked up in ``history``)."""
    names = part_names if topic == CHECKPOINTS else view_names
    held: dict[str, list[str]] = {}
    for o in history:
        if o.topic == topic and o.value is not None:
            name = names([o], sid)[0]
            if len(name) == 1 and next(iter(name)).startswith(("b.", "~b")):
                held[next(iter(name))] = _bundle_entries(o)
    written, gone = names(outs, sid)

    def expand(xs: set[str]) -> set[str]:
        return {e for x in xs for e in held.get(x, [x])}

    return expand(written), expand(gone)


def compacted(outs: list[Out], topic: str) -> list[tuple[bytes | None, bytes | None]]:
    """The topic after compaction: the last record per key, tombstones applied."""
    last: dict[bytes | None, int] = {}
    records = [o for o in outs if o.topic == topic]
    for i, o in enumerate(records):
        last[o.key] = i
    return [(o.key, o.value) for i, o in enumerate(records) if last[o.key] == i and o.value]


def append_cost(log: list[Event]) -> list[Out]:
    """The records of the second of two batches that each append one event
    (the first one settles the rows that changed while the log was folded)."""
    h = Harness()
    h.fold_events("s", log)
    h.commit()
    b = LogBuilder(start_seq=len(log))
    for text in ("one more line", "and another one"):
        h.fold_events("s", [b.user(text)])
        out = h.commit()
    assert h.fold_equivalent("s") == expected([*log, *b.events])
    return out


def test_appending_one_event_writes_bounded_records_whatever_the_session_length() -> None:
    short = append_cost(conversation(200))  # 200 nodes, 200 events
    long = append_cost(session_log(2000))  # 2,000 events, compacted contexts
    for out in (short, long):
        views = [o for o in out if o.topic == VIEWS]
        checkpoints = [o for o in out if o.topic == CHECKPOINTS]
        # views: the message, the head, the changed units; checkpoints: the
        # event, the head, the changed rows, at most one digest block in/out
        assert len(views) <= 2 + 3 and len(checkpoints) <= 2 + 3 + 2
    # the whole-session records of format 1 were ~40 KB here; now the cost
    # follows the event: 10x the events, about the same bytes
    assert size(long) <= 1.5 * size(short)
    assert size(long) < 3_000


def _with_compactions() -> tuple[LogBuilder, list[int]]:
    b = LogBuilder()
    b.system("sys")
    seqs = [b.user(f"m{i}").seq for i in range(10)]
    return b, seqs


def test_a_compaction_tombstones_the_parts_of_the_nodes_it_removed() -> None:
    b, seqs = _with_compactions()
    h = Harness()
    for event in b.events:  # a transaction per event: a bundle per event
        h.fold_events("s", [event])
        h.commit()
    first = b.summary("first summary", seqs[0], seqs[3], seqs[:4])
    h.fold_events("s", [first])
    out = h.commit()
    written, gone = entry_names(out, h.produced, CHECKPOINTS)
    ledger = h.engine.partitions[0].sessions["s"].part_ledger
    assert f"e.{first.seq}" in written
    assert not {f"e.{s}" for s in seqs[:4]} & set(ledger.bundle_of)  # named no more
    assert {f"e.{s}" for s in seqs[1:4]} <= gone  # their bundles had nothing else left
    assert view_names(out)[1] == set()  # append-origin messages are the transcript: kept
    second = b.summary("second summary", first.seq, seqs[6], [first.seq, *seqs[4:7]])
    h.fold_events("s", [second])
    out = h.commit()
    assert not {f"e.{s}" for s in (first.seq, *seqs[4:7])} & set(ledger.bundle_of)
    state = h.engine.partitions[0].sessions["s"].session.surface.state
    assert "b.0" in ledger.names([*state.nodes, *state.headers])  # the system prompt's: named
    # the first summary's message left the surface and is no transcript entry
    written, gone = entry_names(out, h.produced, VIEWS)
    assert f"~m{first.seq}" in gone and f"~m{second.seq}" in written
    assert h.fold_equivalent("s") == expected(b.events)
    # compaction leaves only live parts, and they restore the session
    restored = latest_checkpoints(CODEC, compacted(h.produced, CHECKPOINTS))
    assert restored.bad_records == 0
    # a bundle stays while one of its entries is named, and only then
    left = {split_part_key(k or b"") for k, _ in compacted(h.produced, CHECKPOINTS)}
    bundles = {name for sid, name in filter(None, left) if name.startswith("b.")}
    assert bundles == {f"b.{n}" for n in ledger.bundles}
    assert all(ledger.bundles.values()) and len(bundles) < len(b.events) + 2
    assert f"e.{second.seq}" in ledger.bundle_of


def _image_session() -> LogBuilder:
    b = LogBuilder()
    b.system("sys")
    image = {"type": "image", "mediaType": "image/png", "data": "iVBORw0KGgo="}
    b.add_raw(
        "user/message",
        b.message("user", [{"type": "text", "text": "look"}, image, image]),
        surfaceOp="append",
    )
    return b


def test_an_image_offload_writes_an_override_and_tombstones_the_superseded_one() -> None:
    b = _image_session()
    target = b.events[-1].seq
    h = Harness()
    h.fold_events("s", b.events)
    h.commit()
    one = b.add_raw("image/offload", {"targets": [{"seq": target, "imageIndexes": [0]}]})
    h.fold_events("s", [one])
    out = h.commit()
    [first] = [
        n for n in entry_names(out, h.produced, CHECKPOINTS)[0] if n.startswith(f"o.{target}.")
    ]
    assert f"~m{target}.{first.split('.')[2]}" in entry_names(out, h.produced, VIEWS)[0]
    assert h.fold_equivalent("s") == expected(b.events)
    two = b.add_raw("image/offload", {"targets": [{"seq": target, "imageIndexes": [1]}]})
    h.fold_events("s", [two])
    out = h.commit()
    written, gone = entry_names(out, h.produced, CHECKPOINTS)
    [second] = [n for n in written if n.startswith(f"o.{target}.")]
    assert second != first and first in gone
    generation = first.split(".")[2]
    assert entry_names(out, h.produced, VIEWS)[1] == {f"~m{target}.{generation}"}
    assert h.fold_equivalent("s") == expected(b.events)
    # the transcript keeps the message as it was sent (G-4), the context the override
    restored = Harness(checkpoints={0: h.checkpoints()})
    restored.produced = list(h.produced)
    restored.offsets = dict(h.offsets)
    tail = b.user("after the restore")
    restored.fold_events("s", [tail])
    out = restored.commit()
    written = entry_names(out, restored.produced, CHECKPOINTS)[0]
    assert not any(n.startswith("o.") for n in written)  # not rewritten
    assert restored.fold_equivalent("s") == expected(b.events)


def test_a_head_whose_part_is_missing_makes_the_session_refold_and_is_reported() -> None:
    h = Harness()
    h.fold_events("s", session_log(40))
    h.fold_events("t", session_log(40, seed=9))
    h.commit()
    # one transaction: every part of "s" but its head is in bundle b.0
    records = [
        (o.key, o.value)
        for o in h.topic(CHECKPOINTS)
        if split_part_key(o.key or b"") != ("s", "b.0")
    ]
    reported: list[tuple[str, str]] = []
    restored = latest_checkpoints(CODEC, records, lambda sid, exc: reported.append((sid, str(exc))))
    assert set(restored.checkpoints) == {"t"} and restored.bad_records == 1
    [(sid, error)] = reported
    [bundle] = [o for o in h.topic(CHECKPOINTS) if o.key == part_key("s", "b.0")]
    assert sid == "s" and error.startswith("checkpoint part ") and error.endswith(" is missing")
    assert error.split()[2] in _bundle_entries(bundle)
    # a chunk at another version than the head names is as unusable
    b = LogBuilder()
    b.system("sys")
    seqs = [b.user(f"m{i}").seq for i in range(40)]
    h = Harness()
    h.fold_events("c", b.events)
    h.commit()
    h.fold_events("c", [b.summary("summary", seqs[2], seqs[5], seqs[2:6])])
    h.commit()
    second = part_key("c", "b.1")  # the replace rewrote chunk n.0 into it
    assert "n.0" in _bundle_entries(next(o for o in h.topic(CHECKPOINTS) if o.key == second))
    records = [(o.key, o.value) for o in h.topic(CHECKPOINTS) if o.key != second]
    reported.clear()
    restored = latest_checkpoints(CODEC, records, lambda sid, exc: reported.append((sid, str(exc))))
    assert "c" not in restored.checkpoints and restored.bad_records == 1
    assert reported == [
        (
            "c",
            f"checkpoint part n.0 (in b.0) is at version {seqs[-1]}, the head needs {seqs[-1] + 1}",
        )
    ]


def _v1_checkpoint(h: Harness, sid: str) -> Checkpoint:
    """What format 1 wrote: the whole session in one record."""
    rt = h.engine.partitions[0].sessions[sid]
    core = rt.session.checkpoint(detached=True)
    rows = core.pop("rows")
    service = {
        "version": 1,
        "lastOffset": rt.last_offset,
        "quarantine": None,
        "redriveAt": None,
        "liftedAt": None,
        "digests": "",
        "published": {"transcript": rt.session.transcript_count},
    }
    digest = rt.session.last_digest
    return Checkpoint(
        sid,
        rt.last_seq,
        Anchor(0, rt.last_offset, rt.last_seq, bytes.fromhex(digest) if digest else b""),
        rows,
        {"core": core, "service": service, "header": rt.session.header},
        CHECKPOINT_VERSION,
    )


def test_a_v1_checkpoint_still_restores_and_continues_in_parts() -> None:
    log = session_log(120, seed=4)
    h = Harness()
    h.fold_events("s", log[:60])  # folded, never published: format 1 held it all
    v1 = CODEC.encode_checkpoint(_v1_checkpoint(h, "s"))
    restored = latest_checkpoints(CODEC, [(b"s", v1)])
    assert restored.bad_records == 0 and restored.checkpoints["s"].last_seq == log[59].seq
    r = Harness(checkpoints={0: restored.checkpoints})
    r.fold_events("s", log[60:])
    out = r.commit()
    # the format-1 core views are tombstoned, the session continues in parts
    assert {"messages", "surface", "status", "transcript"} <= view_names(out)[1]
    assert r.fold_equivalent("s") == expected(log)
    again = Harness(checkpoints={0: r.checkpoints()})
    again.produced = list(r.produced)
    assert again.engine.runtime(again.engine.partitions[0], "s").last_seq == log[-1].seq


def test_a_session_tombstone_removes_its_parts_and_views() -> None:
    log = session_log(150, seed=2)
    h = Harness()
    h.fold_events("s", log)
    h.fold_events("keep", log[:20])
    h.commit()
    [cp] = [c for sid, c in h.checkpoints().items() if sid == "s"]
    h.engine.tombstone_session(0, "s", cp)
    h.commit()
    left = [k for k, _ in compacted(h.produced, CHECKPOINTS)]
    assert left and all(k == b"keep" or (k or b"").startswith(b"\xffkeep\x00") for k in left)
    views = [k for k, _ in compacted(h.produced, VIEWS)]
    assert views and all((k or b"").startswith(b"keep/") for k in views)
    assert not h.views().get("s") and h.views()["keep"]


def test_a_reader_starting_mid_history_never_sees_an_inconsistent_snapshot() -> None:
    log = session_log(600, seed=13)  # compactions, rewrites and image offloads
    h = Harness()
    for start in range(0, len(log), 7):
        h.fold_events("s", log[start : start + 7])
        h.commit()
    records = [(o.key, o.value) for o in h.topic(VIEWS)]
    reader_saw_skips = False
    for cut in (len(records) // 3, len(records) // 2, 4 * len(records) // 5):
        # the segment before ``cut`` is compacted (older versions gone), the rest not
        head = records[:cut]
        later = {k for k, _ in records[cut:]}
        last = {k: i for i, (k, _) in enumerate(head)}
        kept = [
            (k, v)
            for i, (k, v) in enumerate(head)
            if last[k] == i and k not in later and v is not None
        ]
        m = _Materializer(CODEC, "s", None)
        for key, value in [*kept, *records[cut:]]:
            for update in m.apply_all(key, value):
                if update.view == "status" and update.record is not None:
                    as_of = update.record.as_of_seq
                    seen = core(session_fold_equivalent(m.views["s"]))
                    assert seen == core(expected(log[: as_of + 1]))
        reader_saw_skips |= m.parted.sessions["s"].skipped > 0
        assert session_fold_equivalent(m.views["s"]) == expected(log)
    assert reader_saw_skips  # the case under test happened


def test_a_checkpoint_taken_while_the_views_are_held_back_restores_and_publishes_later() -> None:
    log = session_log(90, seed=6)
    floor = {"s": log[59].seq}  # an in-place replay: the old views reach seq 59
    h = Harness(publish_floor=floor)
    h.fold_events("s", log[:30])
    out = h.commit()
    assert {o.topic for o in out} == {CHECKPOINTS}
    assert any(
        n.startswith("t.") for n in entry_names(out, h.produced, CHECKPOINTS)[0]
    )  # unpublished transcript kept
    r = Harness(checkpoints={0: h.checkpoints()}, publish_floor=floor)
    r.produced, r.offsets = list(h.produced), dict(h.offsets)
    r.fold_events("s", log[30:])
    out = r.commit()
    assert r.fold_equivalent("s") == expected(log)
    # published now: named no more (their bundle goes with its last entry)
    ledger = r.engine.partitions[0].sessions["s"].part_ledger
    assert not ledger.pending and not any(n.startswith("t.") for n in ledger.bundle_of)
    names = r.checkpoints()["s"].surface["service"]["parted"]["partNames"]
    assert names and not any(n.startswith("t.") for n in names)


def _hot_head(log: list[Event]) -> tuple[Harness, list[Out], dict[str, Any]]:
    """A session folded whole, then three batches of one event each."""
    h = Harness()
    h.fold_events("s", log[:40])
    h.commit()
    for event in log[40:43]:
        h.fold_events("s", [event])
        out = h.commit()
    [head] = [o for o in out if o.key == b"s"]
    return h, out, CODEC.decode_record(head.value or b"")[1]


def test_rows_that_change_every_batch_ride_in_the_head_and_restore() -> None:
    log = session_log(60, seed=8)
    h, out, datum = _hot_head(log)
    hot = [u for u in datum["units"] if u["leaves"] is not None]  # e.g. the session's counters
    assert hot and all(u["row"] is None for u in datum["units"])
    written, gone = entry_names(out, h.produced, CHECKPOINTS)
    # the hot row's base part stays (tokenUsage, which changes only on some
    # replies, writes its part when it changes after settling)
    assert "u.sessionStats" not in written | gone
    keys = h.engine.partitions[0].sessions["s"].session.projections.checkpoint(detached=False)
    stats = encode_leaves({"ver": 0, "val": keys["sessionStats"]["val"]}, keys["sessionStats"])
    assert stats is not None and len(stats) < len(orjson.dumps(keys["sessionStats"]["val"])) / 2
    r = Harness(checkpoints={0: h.checkpoints()})
    r.produced, r.offsets = list(h.produced), dict(h.offsets)
    r.fold_events("s", log[43:])
    r.commit()
    assert r.fold_equivalent("s") == expected(log)


def test_inline_leaves_fit_only_the_shape_of_their_base_row() -> None:
    base = {"ver": 1, "val": {"a": 1, "b": {"c": [1, 2], "d": None}, "e": "x"}}
    row = {"ver": 2, "val": {"a": 5, "b": {"c": [3], "d": {"z": 1}}, "e": "y"}}
    blob = encode_leaves(base, row)
    assert blob == b'[2,5,[3],{"z":1},"y"]'
    assert decode_leaves(base, orjson.loads(blob)) == row
    assert encode_leaves(base, {"ver": 2, "val": {"a": 5, "e": "y", "b": {}}}) is None
    assert encode_leaves(base, {"ver": 2, "val": {"b": {"c": 1, "d": 2}, "a": 1, "e": ""}}) is None
    assert encode_leaves(base, {"ver": 2, "val": 7}) is None
    for bad in ([2, 5], [2, 5, 1, 2, 3, 4], {"ver": 2}, []):
        with pytest.raises(ValueError):
            decode_leaves(base, bad)


def test_a_row_whose_shape_changes_is_written_as_a_new_base_part() -> None:
    h = Harness()
    b = LogBuilder()
    b.system("sys")
    h.fold_events("s", b.events)
    h.commit()
    outs = []
    for text in ("one", "two", "three"):  # the counters change every batch: hot
        h.fold_events("s", [b.user(text)])
        outs.append(h.commit())
    assert "u.sessionStats" not in entry_names(outs[-1], h.produced, CHECKPOINTS)[0]
    h.fold_events("s", [b.assistant("a new role: a new key in the counters")])
    out = h.commit()
    assert "u.sessionStats" in entry_names(out, h.produced, CHECKPOINTS)[0]
    h.fold_events("s", [b.user("four")])
    h.commit()
    r = Harness(checkpoints={0: h.checkpoints()})
    r.produced, r.offsets = list(h.produced), dict(h.offsets)
    r.fold_events("s", [b.user("five")])
    r.commit()
    assert r.fold_equivalent("s") == expected(b.events)


def test_a_head_of_schema_version_1_with_a_whole_inline_row_restores() -> None:
    """Heads written before ``leaves`` existed carry a hot row whole in ``row``
    (and no part backs it): they still restore, and the row gets its part."""
    log = session_log(60, seed=8)
    with format2():  # what such a head's session was written with
        h, _, datum = _hot_head(log)
    rows = h.engine.partitions[0].sessions["s"].session.projections.checkpoint(detached=False)
    keys = list(rows)
    i = next(i for i, u in enumerate(datum["units"]) if u["leaves"] is not None)
    row = rows[keys[i]]
    datum["units"][i] = {"age": 0, "row": orjson.dumps({"ver": row["ver"], "val": row["val"]})}
    records = [(o.key, o.value) for o in h.topic(CHECKPOINTS)]
    records = [r for r in records if split_part_key(r[0] or b"") != ("s", f"u.{keys[i]}")]
    records.append((b"s", _v1_head(datum, records)))
    restored = latest_checkpoints(CODEC, records)
    assert restored.bad_records == 0
    assert restored.checkpoints["s"].rows[keys[i]]["val"] == row["val"]
    # the duplicate window of the 16-blocks is the one the head of today restores
    now = latest_checkpoints(CODEC, [(o.key, o.value) for o in h.topic(CHECKPOINTS)])
    window = base64.b64decode(restored.checkpoints["s"].surface["service"]["digests"])
    full = base64.b64decode(now.checkpoints["s"].surface["service"]["digests"])
    assert full.endswith(window) and len(window) >= len(full) - 8 * 8 > 0
    r = Harness(checkpoints={0: restored.checkpoints})
    r.produced, r.offsets = list(h.produced), dict(h.offsets)
    r.fold_events("s", log[43:44])
    out = r.commit()
    assert f"u.{keys[i]}" in entry_names(out, r.produced, CHECKPOINTS)[0]
    v1_blocks = {
        ident[1]
        for k, _ in records
        if (ident := split_part_key(k or b"")) is not None and ident[1].startswith("d.")
    }
    assert v1_blocks and v1_blocks == {
        n for n in entry_names(out, r.produced, CHECKPOINTS)[1] if n.startswith("d.")
    }
    r.fold_events("s", log[44:])
    r.commit()
    assert r.fold_equivalent("s") == expected(log)


def _v1_head(datum: dict[str, Any], records: list[tuple[bytes | None, bytes | None]]) -> bytes:
    """``datum`` written with version 1 of the head schema (no leaves, no
    seqChunksFrom, digest blocks of 16: parts ``d.<b>``, appended to ``records``)."""
    last, size = datum["lastSeq"], datum.pop("digestBlock")
    held = dict(records)

    def digests(lo: int, hi: int) -> bytes:  # of seqs [lo, hi), from the blocks of ``size``
        return b"".join(
            base64.b64decode(decode_part(CODEC, held[part_key("s", f"d{size}.{b}")] or b"")[2])
            for b in range(lo // size, hi // size)
        )

    first = -(-datum["digestFirstBlock"] * size // 16)
    tail = (last + 1) // 16
    for b in range(first, tail):
        value = base64.b64encode(digests(16 * b, 16 * b + 16)).decode()
        records.append((part_key("s", f"d.{b}"), encode_part(CODEC, f"d.{b}", 0, value)))
    datum["digestTail"] = digests(16 * tail, (last + 1) // size * size) + datum["digestTail"]
    datum["digestFirstBlock"] = first
    for unit in datum["units"]:
        unit.pop("leaves", None)
    datum["views"].pop("seqChunksFrom", None)
    v1 = json.loads((SCHEMAS / "history" / "checkpoint_head.v1.avsc").read_text("utf-8"))
    buf = io.BytesIO()
    buf.write(b"\xc3\x01" + schema_fingerprint(v1))
    fastavro.schemaless_writer(buf, fastavro.parse_schema(v1, {}), datum)
    return buf.getvalue()


def _tombstone_cost(h: Harness, cp: Checkpoint) -> tuple[set[bytes], set[bytes]]:
    """(live view keys of ``s`` after compaction, the view keys its tombstone names)."""
    live = {k for k, _ in compacted(h.produced, VIEWS) if k is not None and k.startswith(b"s/")}
    h.engine.tombstone_session(0, "s", cp)
    tombs = {o.key for o in h.commit() if o.topic == VIEWS and o.value is None}
    return live, {k for k in tombs if k is not None}


def test_a_session_tombstone_names_only_the_records_that_exist() -> None:
    log = session_log(600, seed=13)  # compactions, rewrites and image offloads
    h = Harness()
    for start in range(0, len(log), 7):
        h.fold_events("s", log[start : start + 7])
        h.commit()
    cp = h.checkpoints()["s"]
    nodes = cp.surface["core"]["surface"]["nodes"]
    live, tombs = _tombstone_cost(h, cp)
    assert live <= tombs
    # a node without a message, or an append node (its message is the transcript's)
    assert len(tombs - live) <= len(nodes) + len(cp.rows)
    messages = [k for k in tombs if k.startswith(b"s/~m")]
    assert len(messages) < 0.8 * (cp.last_seq + 1)  # not one per seq up to the watermark
    assert not any((k or b"").startswith(b"s/") for k, _ in compacted(h.produced, VIEWS))


def test_a_session_checkpointed_before_the_seq_parts_is_still_tombstoned_whole() -> None:
    log = session_log(300, seed=13)
    h = Harness()
    with format2():  # what such a head's session was written with
        for start in range(0, len(log), 7):
            h.fold_events("s", log[start : start + 7])
            h.commit()
    [head] = [o for o in h.topic(CHECKPOINTS) if o.key == b"s"][-1:]
    datum = CODEC.decode_record(head.value or b"")[1]
    records = [(o.key, o.value) for o in h.topic(CHECKPOINTS)]
    records.append((b"s", _v1_head(datum, records)))
    cp = latest_checkpoints(CODEC, records).checkpoints["s"]
    live, tombs = _tombstone_cost(h, cp)
    assert live <= tombs
    assert not any((k or b"").startswith(b"s/") for k, _ in compacted(h.produced, VIEWS))


def test_only_the_newest_head_of_a_session_is_decoded() -> None:
    """A checkpoints topic not compacted yet holds a head per batch: restore
    decodes the last one only, so a superseded unreadable head costs nothing."""
    h = Harness()
    log = session_log(40)
    h.fold_events("s", log[:20])
    h.commit()
    h.fold_events("s", log[20:])
    h.commit()
    records = [(o.key, o.value) for o in h.topic(CHECKPOINTS)]
    first = next(i for i, (k, _) in enumerate(records) if k == b"s")
    records[first] = (b"s", b"\xc3\x01garbage")
    restored = latest_checkpoints(CODEC, records)
    assert restored.bad_records == 0 and restored.checkpoints["s"].last_seq == log[-1].seq
    records.append((b"s", b"\xc3\x01garbage"))  # the newest one unreadable: reported
    restored = latest_checkpoints(CODEC, records)
    assert restored.bad_records == 1 and "s" not in restored.checkpoints
