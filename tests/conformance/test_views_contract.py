"""The views topic's contract (docs/views-format.md), rule by rule (issue 35)."""

from __future__ import annotations

from typing import Any

from processor.client.views_reader import _Materializer
from tests.engine.kit import CODEC, CONFIG, Harness, compacted, session_log

VIEWS = CONFIG.topics.views


def test_VF4_a_reader_never_shows_a_unit_newer_than_the_sessions_status() -> None:
    """Unit records precede their head in a transaction: held until it arrives."""
    h = Harness()
    events = session_log(40, seed=5)
    for start in range(0, 40, 4):
        h.fold_events("s", events[start : start + 4])
        h.commit()
    reader = _Materializer(CODEC, None, None)
    checked = 0
    for o in h.topic(VIEWS):
        reader.apply_all(o.key, o.value)
        views = reader.views.get("s", {})
        if "status" not in views:
            continue
        last = views["status"].value["lastSeq"]
        newer = {n: r.as_of_seq for n, r in views.items() if r.as_of_seq > last}
        assert not newer, f"units ahead of status {last}: {newer}"
        checked += 1
    assert checked > 20


def test_VF4_a_unit_tombstone_waits_for_its_head_too() -> None:
    from tests.engine.test_unit_names import unit

    h = Harness()
    events = session_log(8)
    reg = h.engine.registry.register(unit("extra"))
    h.fold_events("s", events[:2])
    h.commit()
    reg.release()
    h.fold_events("s", events[2:3])
    out = [o for o in h.commit() if o.topic == VIEWS]
    reader = _Materializer(CODEC, None, None)
    for o in h.topic(VIEWS)[: -len(out)]:
        reader.apply_all(o.key, o.value)
    assert "extra" in reader.views["s"]
    [i] = [i for i, o in enumerate(out) if o.key == b"s/extra"]
    for o in out[: i + 1]:
        reader.apply_all(o.key, o.value)
    assert "extra" in reader.views["s"]  # the tombstone waits for the head
    for o in out[i + 1 :]:
        reader.apply_all(o.key, o.value)
    assert "extra" not in reader.views["s"]


def _split_harness() -> tuple[Harness, list[Any]]:
    from dataclasses import replace

    from tests.conformance.make import Blob

    config = replace(CONFIG, max_view_bytes=2048)
    h = Harness(config=config)
    h.engine.registry.register(Blob().definition)
    return h, session_log(40, seed=31)


def _parts_left(outs: list[Any]) -> dict[bytes, int]:
    """Split keys the compacted topic keeps, and the parts their part 0 says."""
    held = {o.key: o.value for o in compacted(outs) if o.key is not None and o.value is not None}
    whole = {k: CODEC.decode_view(v).parts for k, v in held.items() if b"#" not in k}
    return {k: whole.get(k.rpartition(b"#")[0], 0) for k in held if b"#" in k}


def test_VF2_a_view_that_shrinks_after_a_restart_leaves_no_part_behind() -> None:
    from dataclasses import replace

    from tests.conformance.make import Blob
    from tests.engine.kit import restored_from

    h, events = _split_harness()
    for start in range(0, 15, 3):  # the blob grows to 2, then 3 parts
        h.fold_events("s", events[start : start + 3])
        h.commit()
    assert _parts_left(h.topic(VIEWS)), "the case must have split the view"
    r = restored_from(h, config=replace(CONFIG, max_view_bytes=2048))
    r.engine.registry.register(Blob().definition)
    r.fold_events("s", events[15:18])  # one part again
    r.commit()
    left = _parts_left(r.topic(VIEWS))
    assert not left, f"parts no part 0 counts: {left}"


def test_VF2_a_session_tombstone_names_the_parts_of_its_split_views() -> None:
    h, events = _split_harness()
    for start in range(0, 15, 3):  # the blob at 3 parts
        h.fold_events("s", events[start : start + 3])
        h.commit()
    assert _parts_left(h.topic(VIEWS))
    h.engine.tombstone_session(0, "s", h.checkpoints()["s"])
    h.commit()
    assert not [o.key for o in compacted(h.topic(VIEWS)) if o.key and o.key.startswith(b"s/")]


def test_VF6_an_in_place_replay_rewrites_no_written_once_record_and_leaves_none_behind() -> None:
    from processor.engine.replay_floor import replay_floor

    events = session_log(50, seed=61)
    h = Harness()
    for start in range(0, 50, 5):
        h.fold_events("s", events[start : start + 5])
        h.commit()
    floors = {sid: replay_floor(0, sid, cp, CONFIG) for sid, cp in h.checkpoints().items()}
    replayed = Harness(publish_floor=floors)
    for start in range(0, 50, 13):
        replayed.fold_events("s", events[start : start + 13])
        replayed.commit()
    log = [*h.topic(VIEWS), *replayed.topic(VIEWS)]
    written: dict[bytes, bytes] = {}
    for o in log:  # ~b and ~t are written once: never again with other contents
        if o.key and o.value is not None and o.key.startswith((b"s/~b", b"s/~t")):
            before = written.setdefault(o.key, o.value)
            assert CODEC.decode_view(before).json_value() == CODEC.decode_view(o.value).json_value()
    new = {o.key for o in replayed.topic(VIEWS) if o.value is not None}
    left = {o.key for o in compacted(log) if o.key and o.key.startswith((b"s/~b", b"s/~m"))}
    assert left <= new, f"old records no head names: {sorted(left - new)}"


def test_VF1_part_0_is_the_bare_key_and_only_parts_1_on_carry_their_number() -> None:
    """What the writer does, and what the spec and README say about it."""
    from pathlib import Path

    h, events = _split_harness()
    for start in range(0, 15, 3):
        h.fold_events("s", events[start : start + 3])
        h.commit()
    for o in h.topic(VIEWS):
        if o.value is not None and b"blob" in (o.key or b""):
            part = CODEC.decode_view(o.value).part
            assert o.key == (b"s/blob" if part == 0 else f"s/blob#{part}".encode())
    root = Path(__file__).resolve().parents[2]
    spec = (root / "docs" / "views-format.md").read_text("utf-8")
    assert "part `i >= 1` under `#<i>`" in spec.replace("\n", " ")
    readme = (root / "README.md").read_text("utf-8")
    assert "keys `<key>#<i>`" not in readme  # the old, wrong description (issue 35)


def test_VF5_a_record_of_the_parted_format_in_parts_is_unreadable_not_half_read() -> None:
    from dataclasses import replace as change

    from processor.codec import View

    h = Harness()
    h.fold_events("s", session_log(40, seed=2))
    h.commit()
    reader = _Materializer(CODEC, None, None)
    for o in h.topic(VIEWS):
        value = o.value
        if value is not None and o.key == b"s/~n0":
            chunk: View = CODEC.decode_view(value)
            half = len(chunk.value) // 2
            value = CODEC.encode_view(change(chunk, value=chunk.value[:half], parts=2))
        reader.apply_all(o.key, value)
    assert "surface" not in reader.views.get("s", {})  # its head stays incomplete
    assert reader.parted.sessions["s"].skipped == 1


def test_VF5_assembled_views_follow_the_spec_formulas() -> None:
    """pages = ceil(tn/ps), stateVersion -1, asOfSeq the head's (section 6)."""
    from dataclasses import replace

    config = replace(CONFIG, transcript_page_size=7)
    h = Harness(config=config)
    h.fold_events("s", session_log(60, seed=9))
    h.commit()
    views = h.views()["s"]
    index, last = views["transcript"].value, views["status"].value["lastSeq"]
    assert index["pages"] == -(-index["total"] // 7) and index["pageSize"] == 7
    for name in ("messages", "surface", "transcript", "status", "transcript.0"):
        assert (views[name].as_of_seq, views[name].state_version) == (last, -1)
    more = session_log(70, seed=9)[60:]
    h.fold_events("s", more)
    h.commit()
    later = h.views()["s"]  # a closed page keeps the asOfSeq it last changed at
    assert later["transcript.0"].as_of_seq == last < later["status"].as_of_seq
    pages = [views[f"transcript.{p}"].value for p in range(index["pages"])]
    assert [len(p) for p in pages[:-1]] == [7] * (index["pages"] - 1)
    assert sum(map(len, pages)) == index["total"]


def test_VF5_an_unreadable_value_is_skipped_and_counted_never_a_crash() -> None:
    h = Harness()
    h.fold_events("s", session_log(10, seed=3))
    h.commit()
    reader = _Materializer(CODEC, None, None)
    reader.apply_all(b"s/x", b"\x07not a view")
    reader.apply_all(b"s/y", b"\xc3\x01" + bytes(8) + b"body")  # unknown fingerprint
    for o in h.topic(VIEWS):
        reader.apply_all(o.key, o.value)
    assert reader.unreadable == 2 and reader.views["s"]["status"].value["state"] == "ok"


def test_VF5_a_bundle_entry_of_another_length_is_ignored_without_shifting_the_others() -> None:
    """An entry that is neither ``[seq, message]`` nor ``[seq, generation, message]``
    is ignored; the entries after it keep their own messages."""
    from processor.codec import View

    h = Harness()
    h.fold_events("s", session_log(20, seed=4))
    h.commit()
    reader = _Materializer(CODEC, None, None)
    spliced = 0
    for o in h.topic(VIEWS):
        value = o.value
        if value is not None and o.key is not None and o.key.startswith(b"s/~b"):
            bundle: View = CODEC.decode_view(value)
            entries = bundle.json_value()
            if len(entries) >= 2:
                entries.insert(1, [1, 2, 3, 4])
                spliced += 1
            value = CODEC.encode_view(
                View.of("s", bundle.view, bundle.as_of_seq, bundle.state_version, entries)
            )
        reader.apply_all(o.key, value)
    assert spliced
    assert reader.views["s"]["messages"].value == h.views()["s"]["messages"].value
