"""Format 3 (issue 12, throughput): a transaction's new content of a session in
one views bundle and one checkpoint bundle, and format 2 still read.

Broker-less, through the interfaces every consumer uses (``latest_checkpoints``,
the views reader), compared with the offline fold.
"""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from processor.client.views_reader import session_fold_equivalent
from processor.codec import decode_part, split_part_key
from processor.engine import Out
from processor.engine.checkpoints import latest_checkpoints
from processor.workload import generate_session
from tests.engine.format2 import format2
from tests.engine.kit import (
    CODEC,
    CONFIG,
    Harness,
    compacted,
    materialize,
    offline_fold,
    plain,
    restored_from,
)
from tests.engine.test_parted_properties import (
    SETTINGS,
    Scenario,
    _Follower,
    assert_views_equal_the_fold,
    play,
    scenarios,
)

VIEWS, CHECKPOINTS = CONFIG.topics.views, CONFIG.topics.checkpoints


def names(outs: list[Out], topic: str, sid: str) -> list[str]:
    """Record names of ``sid`` written (not tombstoned) to ``topic``."""
    found = []
    for o in outs:
        if o.topic != topic or o.value is None or o.key is None:
            continue
        if topic == CHECKPOINTS:
            ident = split_part_key(o.key)
            if ident is not None and ident[0] == sid:
                found.append(ident[1])
        elif o.key.startswith(f"{sid}/".encode()):
            found.append(o.key[len(sid) + 1 :].decode())
    return found


def test_one_transaction_of_many_events_writes_one_bundle_per_topic() -> None:
    log = generate_session(random.Random(3), 40, big_ratio=0.0)
    h = Harness()
    h.fold_events("s", log[:20])
    h.commit()
    h.fold_events("s", log[20:])
    out = h.commit()
    views = names(out, VIEWS, "s")
    parts = names(out, CHECKPOINTS, "s")
    assert [n for n in views if n.startswith("~b")] == ["~b1"]
    assert not [n for n in views if n.startswith("~m")]
    assert [n for n in parts if n.startswith("b.")] == ["b.1"]
    # besides the bundle only the write-once lists of the checkpoint are parts
    assert {n.split(".")[0] for n in parts} <= {"b", "r", "x"}
    assert h.fold_equivalent("s") == offline_fold(log)


def test_a_bundle_over_the_record_size_bound_is_cut_into_several() -> None:
    """30 events with ~10 KB tool results in one transaction, 20 KB records."""
    config = replace(CONFIG, max_view_bytes=20_000)
    log = generate_session(random.Random(5), 30, big_ratio=1.0)
    h = Harness(config=config)
    h.fold_events("s", log)
    out = h.commit()
    views = [o for o in out if o.topic == VIEWS and b"/~b" in (o.key or b"")]
    parts = [o for o in out if o.topic == CHECKPOINTS and b"\x00b." in (o.key or b"")]
    assert len(views) >= 2 and len(parts) >= 2
    # every record within the bound (the bound counts JSON; the records are compressed
    # when large, so the encoded value is smaller still)
    for o in views:
        value = CODEC.decode_view(o.value or b"").json_value()
        assert len(plain_json(value)) <= 20_000 or len(value) == 1
    for o in parts:
        value = decode_part(CODEC, o.value or b"")[2]
        assert len(plain_json(value)) <= 20_000 or len(value) == 1
    assert h.fold_equivalent("s") == offline_fold(log)
    r = restored_from(h, config=config)
    more = generate_session(random.Random(5), 34, big_ratio=1.0)[30:]
    r.fold_events("s", more)
    r.commit()
    assert r.fold_equivalent("s") == offline_fold([*log, *more])


def plain_json(value: object) -> bytes:
    import orjson

    return orjson.dumps(value)


def test_a_bundle_stays_while_one_entry_is_named_and_goes_with_the_last() -> None:
    """A replace range that drops part of a bundle keeps it; dropping the rest
    tombstones it (checkpoint side: events; views side: replace-origin messages)."""
    log = generate_session(random.Random(11), 200, context_budget=8)
    h = Harness()
    for start in range(0, len(log), 9):
        h.fold_events("s", log[start : start + 9])
        h.commit()
    rt = h.engine.partitions[0].sessions["s"]
    cps = compacted(h.topic(CHECKPOINTS))
    live = {n for n in names(cps, CHECKPOINTS, "s") if n.startswith("b.")}
    assert live == {f"b.{n}" for n in rt.part_ledger.bundles}  # none dead, none missing
    assert all(rt.part_ledger.bundles.values())
    ledger = rt.part_ledger

    def named(n: int) -> set[str]:  # the entries of bundle n still named
        return {e for e, b in ledger.bundle_of.items() if b == n}

    assert all(live == len(named(n)) for n, live in ledger.bundles.items())  # counts are exact
    written = {
        split_part_key(o.key or b"")[1]: {e[0] for e in decode_part(CODEC, o.value or b"")[2]}  # type: ignore[index]
        for o in cps
        if b"\x00b." in (o.key or b"")
    }
    # replace ranges dropped part of some bundles: they stay for the rest
    assert any(named(int(n[2:])) < entries for n, entries in written.items())
    assert any(
        e.startswith("e.") for n, entries in written.items() for e in entries - named(int(n[2:]))
    )
    views = compacted(h.topic(VIEWS))
    held = {n for n in names(views, VIEWS, "s") if n.startswith("~b")}
    unpinned = {f"~b{n}" for n, slot in rt.view_ledger.bundles.items() if not slot.pinned}
    assert unpinned <= held
    restored = latest_checkpoints(CODEC, [(o.key, o.value) for o in cps])
    assert restored.bad_records == 0
    assert plain(session_fold_equivalent(materialize(views)["s"])) == offline_fold(log)


def test_a_topic_written_in_format_2_assembles_restores_and_continues_in_format_3() -> None:
    log = generate_session(random.Random(21), 120, context_budget=10)
    h = Harness()
    with format2():
        for start in range(0, 80, 6):
            h.fold_events("s", log[start : min(start + 6, 80)])
            h.commit()
    old = h.topic(VIEWS)
    assert any("/~m" in (o.key or b"").decode() for o in old)
    assert not any("/~b" in (o.key or b"").decode() for o in old)
    assert plain(session_fold_equivalent(materialize(old)["s"])) == offline_fold(log[:80])
    r = restored_from(h)
    for start in range(80, 120, 6):
        r.fold_events("s", log[start : start + 6])
        r.commit()
    assert any("/~b" in (o.key or b"").decode() for o in r.topic(VIEWS))
    assert r.fold_equivalent("s") == offline_fold(log)
    for topic in (r.topic(VIEWS), compacted(r.topic(VIEWS))):
        assert plain(session_fold_equivalent(materialize(topic)["s"])) == offline_fold(log)
    # a session tombstone after the upgrade names every record either format left
    cp = restored_from(r).engine.partitions[0].checkpoints["s"]
    r.engine.tombstone_session(0, "s", cp)
    tombs = {o.key for o in r.commit() if o.value is None}
    left = {o.key for o in compacted(r.topic(VIEWS)) + compacted(r.topic(CHECKPOINTS))}
    assert {
        k for k in left if k is not None and (k.startswith((b"s/", b"\xffs\x00", b"s")))
    } <= tombs


@SETTINGS
@given(scenarios(), st.data())
def test_format_2_then_format_3_after_a_restore_equals_the_offline_fold(
    sc: Scenario, data: st.DataObject
) -> None:
    """The upgrade at any cut: a format-2 owner, then a format-3 owner restored
    from the compacted topics; every view and every follower snapshot holds."""
    cut = data.draw(st.integers(0, len(sc.steps)), label="cut")
    h = Harness(config=sc.config)
    with format2():
        first = play(h, sc, 0, cut)
    r = restored_from(h, config=sc.config)
    second = play(r, sc, cut, len(sc.steps))
    assert_views_equal_the_fold(r.views(), sc, list(sc.logs))
    assert_views_equal_the_fold(materialize(compacted(r.topic(VIEWS))), sc, list(sc.logs))
    follower = _Follower(sc)
    for tx in [*first, *second]:
        follower.read(tx)
    assert_views_equal_the_fold(follower.reader.views, sc, list(sc.logs))
    # nothing either format wrote outlives what the restored owner names
    third = restored_from(r, config=sc.config)
    for sid in sc.logs:
        rt = r.engine.partitions[0].sessions.get(sid)
        if rt is not None:  # folded after the restore
            live = {n for n in names(compacted(r.topic(CHECKPOINTS)), CHECKPOINTS, sid)}
            bundles = {n for n in live if n.startswith("b.")}
            assert bundles == {f"b.{n}" for n in rt.part_ledger.bundles}
            # a views bundle without a transcript message lives only while named
            transcript = {e["seq"] for e in offline_fold(list(sc.logs[sid]))["transcript"]}
            for o in compacted(r.topic(VIEWS)):
                if (o.key or b"").startswith(f"{sid}/~b".encode()):
                    seqs = {e[0] for e in CODEC.decode_view(o.value or b"").json_value()}
                    n = int((o.key or b"").decode()[len(sid) + 3 :])
                    assert seqs & transcript or n in rt.view_ledger.bundles, (sid, n)
        assert third.engine.partitions[0].checkpoints[sid].last_seq == sc.logs[sid][-1].seq
