"""What a batch produces: coalesced views, checkpoints, order (the
processing loop's output step, docs/architecture.md), without a broker."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from processor.client.views_reader import offline_equivalent
from processor.engine import Fate
from processor.offline import fold_events, session_output
from tests.engine.kit import CONFIG, Harness, changed, keys, session_log


def test_views_are_coalesced_to_one_record_per_session_and_view_per_batch() -> None:
    h = Harness()
    log = session_log(80)
    h.fold_events("a", log)
    h.fold_events("b", log[:40])
    out = h.commit()
    views = keys(out, CONFIG.topics.views)
    assert views and max(Counter(views).values()) == 1
    checkpoints = keys(out, CONFIG.topics.checkpoints)
    assert max(Counter(checkpoints).values()) == 1
    # one checkpoint head per session, the rest are its parts (keys 0xFF...)
    assert [k for k in checkpoints if not k.startswith(b"\xff")] == [b"a", b"b"]
    assert h.commit() == []  # nothing folded: nothing produced


def test_only_changed_views_are_republished() -> None:
    h = Harness(config=replace(CONFIG, transcript_page_size=4))
    log = session_log(160)
    h.fold_events("s", log[:150])
    first = set(keys(h.commit(), CONFIG.topics.views))
    h.fold_events("s", log[150:151])
    second = set(keys(h.commit(), CONFIG.topics.views))
    # one event: its message (if it has one), at most one closed chunk, the
    # head, and the units it changed -- never the session's other records
    assert len(second - first) <= 2 and b"s/~h" in second
    units = {k for k in first if not k.startswith(b"s/~")}
    assert second & first <= units | {b"s/~h"}
    # closed transcript chunks never change again
    chunks = sorted(k for k in first if k.startswith(b"s/~t"))
    assert len(chunks) >= 1 and not any(k in second for k in chunks)


def test_the_published_views_equal_the_offline_fold_across_batches() -> None:
    h = Harness(config=replace(CONFIG, transcript_page_size=8))
    log = session_log(120, seed=3)
    for start in range(0, 120, 25):
        h.fold_events("s", log[start : start + 25])
        h.commit()
    assert h.fold_equivalent("s") == offline_equivalent(session_output(fold_events(log)))


def test_a_batch_produces_tombstones_then_dead_letters_then_views_then_checkpoints() -> None:
    h = Harness()
    log = session_log(10)
    h.fold_events("a", log[:3])
    h.commit()
    [cp] = h.checkpoints().values()
    h.engine.tombstone_session(0, "gone", cp)
    h.fold(h.record(b"a", b"junk"))
    h.fold_events("b", log[:3])
    out = h.commit()
    order = [o.topic for o in out]
    topics = CONFIG.topics
    assert order[0] == topics.checkpoints and out[0].key == b"gone" and out[0].value is None
    first_dlq = order.index(topics.dlq)
    assert all(o.value is None for o in out[:first_dlq])  # the tombstones
    assert order[first_dlq + 1 :].count(topics.dlq) == 0
    # per session: its views, then its checkpoint
    assert order[-1] == topics.checkpoints and out[-1].key == b"b"
    a_cp = next(i for i, o in enumerate(out) if o.topic == topics.checkpoints and o.key == b"a")
    assert all(k.startswith((b"b/", b"\xffb\x00")) for k in keys(out[a_cp + 1 : -1]))


def test_views_below_the_publish_floor_are_held_back() -> None:
    log = session_log(20)
    h = Harness(publish_floor={"s": log[9].seq})
    h.fold_events("s", log[:5])
    out = h.commit()
    assert {o.topic for o in out} == {CONFIG.topics.checkpoints}  # the checkpoint still moves
    h.fold_events("s", log[5:10])
    out = h.commit()
    assert any(o.topic == CONFIG.topics.views for o in out)
    assert h.views()["s"]["status"].value["lastSeq"] == log[9].seq


def test_a_quarantined_session_publishes_its_status_under_the_floor() -> None:
    log = session_log(20)
    h = Harness(publish_floor={"s": log[9].seq})
    h.fold_events("s", log[:3])
    h.fold(h.event("s", log[5]))
    h.commit()
    assert h.views()["s"]["status"].value["state"] == "quarantined"


def test_a_large_view_is_split_head_last_and_stale_parts_are_tombstoned() -> None:
    h = Harness(config=replace(CONFIG, max_view_bytes=100))
    log = session_log(40, seed=5)
    h.fold_events("s", log)
    out = h.commit()
    views = [o for o in out if o.topic == CONFIG.topics.views]
    split = {k.split(b"#")[0] for k in keys(views) if b"#" in k}
    assert split
    for head in split:
        heads = [k for k in keys(views) if k.split(b"#")[0] == head]
        assert heads[-1] == head  # parts first, head last
    assert h.fold_equivalent("s") == offline_equivalent(session_output(fold_events(log)))
    # the next batch with a smaller view tombstones the parts it no longer has
    unit = next(k.split(b"#")[0].decode()[2:] for k in split)
    h2 = Harness()
    h2.engine.partitions[0].view_parts[("s", unit)] = 9
    h2.fold_events("s", log[:1])
    stale = [o for o in h2.commit() if o.value is None]
    assert [o.key for o in stale] == [b"s/%s#%d" % (unit.encode(), i) for i in range(1, 9)]


def test_a_session_restored_from_its_checkpoint_continues_like_an_uninterrupted_one() -> None:
    log = session_log(60, seed=11)
    h = Harness()
    h.fold_events("s", log[:30])
    h.commit()
    restored = Harness(checkpoints={0: h.checkpoints()})
    restored.offsets = dict(h.offsets)
    restored.produced = list(h.produced)
    assert restored.fold(restored.event("s", log[29])).fate is Fate.DUPLICATE
    assert restored.fold(restored.event("s", changed(log[29]))).fate is Fate.REJECTED
    again = Harness(checkpoints={0: h.checkpoints()})
    again.offsets, again.produced = dict(h.offsets), list(h.produced)
    assert {o.fate for o in again.fold_events("s", log[30:])} == {Fate.APPLIED}
    again.commit()
    assert again.fold_equivalent("s") == offline_equivalent(session_output(fold_events(log)))


def test_a_gap_after_a_stale_restore_is_repaired_from_the_history() -> None:
    log = session_log(30)
    h = Harness()
    records = [h.event("s", e) for e in log]
    for rec in records[:10]:
        h.fold(rec)
    h.commit()
    stale = h.checkpoints()  # at seq 9; a later owner committed up to offset 20
    r = Harness(checkpoints={0: stale})
    part = r.engine.partitions[0]
    part.maybe_stale, part.resumed_at = True, 20
    r.feeds.history[0] = records
    assert r.fold(records[20]).fate is Fate.APPLIED
    assert r.feeds.asked == ["history 0 10..20"]
    # the refolded records were committed by their first owner: counted and
    # dead-lettered there, not here
    assert r.engine.tally.events == {"applied": 1}
    assert r.engine.partitions[0].sessions["s"].last_seq == log[20].seq
    r.commit()
    assert r.dead_letters() == []


def test_a_gap_in_a_session_that_is_not_fresh_is_not_repaired() -> None:
    log = session_log(30)
    h = Harness()
    records = [h.event("s", e) for e in log]
    r = Harness()
    part = r.engine.partitions[0]
    part.maybe_stale, part.resumed_at = True, 20
    r.feeds.history[0] = records
    r.fold(records[0])  # folded since the restore: the session is no longer fresh
    assert r.fold(records[5]).rule == "S-1"
    assert r.feeds.asked == []


def test_a_released_unit_is_tombstoned_once_in_every_session_that_published_it() -> None:
    from processor.core.builtin import default_registry
    from processor.core.session import Session, synthetic_header
    from processor.engine.runtime import SessionRuntime
    from tests.core.test_projections import Counter as Users

    registry = default_registry()
    registration = registry.register(Users("extra").definition)
    runtimes = []
    for sid in ("a", "b"):
        rt = SessionRuntime(sid, 0, Session(synthetic_header(sid), projections=registry))
        for event in session_log(6):
            rt.session.append(event)
        assert "extra" in {c.name for c in rt.view_changes() if not c.removed}
        runtimes.append(rt)
    registration.release()
    for rt in runtimes:
        assert [c.name for c in rt.view_changes() if c.removed] == ["extra"]
        assert not any(c.removed for c in rt.view_changes())  # once
    registry.register(Users("extra").definition)  # back: published again, no tombstone
    for rt in runtimes:
        changes = list(rt.view_changes())
        assert "extra" in {c.name for c in changes} and not any(c.removed for c in changes)
