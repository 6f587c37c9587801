"""The views topic's contract (docs/views-format.md), rule by rule (issue 35)."""

from __future__ import annotations

from processor.service.views_reader import _Materializer
from tests.engine.kit import CODEC, CONFIG, Harness, session_log

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
