"""Rule P (domain projections), H-1 (canonical header), H-5 (tool history)."""

from __future__ import annotations

from typing import Any

import pytest

from processor.core.builder import LogBuilder, tool_def
from processor.core.builtin import BUILTIN_UNITS, default_registry
from processor.core.errors import ProjectionError, SessionError
from processor.core.events import Event, make_event
from processor.core.log import SessionLog
from processor.core.projections import (
    ProjectionDefinition,
    ProjectionRegistry,
    SessionProjections,
    WireView,
    restore,
    restore_floor,
    view_checkpoint,
)
from processor.core.session import Session


def counter(
    key: str = "users", version: int = 1, *, wire: bool = True, calls: list[str] | None = None
) -> ProjectionDefinition:
    """Counts user messages; irrelevant events return the same state object."""

    def apply(state: Any, event: Event) -> Any:
        if calls is not None:
            calls.append(event.type)
        return {"n": state["n"] + 1} if event.type == "user/message" else state

    def check(value: Any) -> None:
        if not isinstance(value, dict) or not isinstance(value.get("n"), int):
            raise ValueError("n must be an int")

    return ProjectionDefinition(
        key,
        version,
        lambda h, i: {"n": 0},
        apply,
        check,
        WireView(lambda s: {"count": s["n"]}, lambda v: None) if wire else None,
    )


def log_of(n_users: int = 2) -> LogBuilder:
    b = LogBuilder()
    b.system("sys")
    for i in range(n_users):
        b.turn_start()
        b.user(f"u{i}")
    return b


def session_with(*defs: ProjectionDefinition, events: list[Event] | None = None) -> Session:
    registry = ProjectionRegistry()
    for d in defs:
        registry.register(d)
    s = Session(projections=registry)
    s.extend(events or [])
    return s


def test_P1_irrelevant_event_keeps_state_identity_and_view() -> None:
    changes: list[tuple[str, int]] = []
    s = session_with(counter(), events=log_of(1).events)
    s.projections.add_listener(lambda key, state, view, seq: changes.append((key, seq)))
    before = s.projections.state_of("users")
    view = s.projections.view_of("users")
    s.append(make_event("turn/end", s.next_seq, {"turn": 1, "reason": "x"}))
    assert s.projections.state_of("users") is before
    assert s.projections.view_of("users") is view  # same object: not republished
    assert changes == []
    s.append(
        make_event(
            "user/message",
            s.next_seq,
            {"id": "m", "role": "user", "content": [], "source": {"kind": "user"}},
            surface_op="append",
        )
    )
    assert changes == [("users", s.last_seq)]


def test_P1_unchanged_view_is_not_drained_again() -> None:
    s = session_with(counter(), events=log_of(1).events)
    assert "users" in s.projections.drain_view_changes()
    s.append(make_event("turn/end", s.next_seq, {"turn": 1, "reason": "x"}))
    assert s.projections.drain_view_changes() == {}


def test_P2_same_version_adds_a_reference_first_definition_stays() -> None:
    registry = ProjectionRegistry()
    first, second = counter(), counter()
    r1 = registry.register(first)
    r2 = registry.register(second)
    assert registry.get("users") is first and registry.refs("users") == 2
    r1.release()
    assert registry.get("users") is first
    r2.release()
    assert registry.get("users") is None


def test_P2_different_version_is_refused() -> None:
    registry = ProjectionRegistry()
    registry.register(counter(version=1))
    with pytest.raises(ProjectionError, match="P-2"):
        registry.register(counter(version=2))


def test_P2_released_key_is_absent_from_snapshots() -> None:
    registry = ProjectionRegistry()
    reg = registry.register(counter())
    s = Session(projections=registry)
    s.extend(log_of(1).events)
    assert "users" in s.projections.snapshot().values
    reg.release()
    assert "users" not in s.projections.snapshot().values


def test_P3_new_unit_folds_the_whole_prefix_from_init() -> None:
    registry = ProjectionRegistry()
    s = Session(projections=registry)
    s.extend(log_of(3).events)
    registry.register(counter())  # registered late
    assert s.projections.state_of("users") == {"n": 3}


def test_P3_watermark_advances_without_state_change() -> None:
    s = session_with(counter(), events=log_of(1).events)
    s.append(make_event("turn/end", s.next_seq, {"turn": 1, "reason": "x"}))
    assert s.projections.observed_seq("users") == s.last_seq


def test_P3_every_committed_event_drives_every_unit_eagerly() -> None:
    calls: list[str] = []
    session_with(counter(calls=calls), events=log_of(1).events)
    assert len(calls) == len(log_of(1).events)  # driven without any read


def test_P3_gap_cannot_be_crossed() -> None:
    log = SessionLog()
    proj = SessionProjections(ProjectionRegistry(), {}, log)
    proj.registry.register(counter())
    for ev in log_of(1).events:
        log.append(ev)
    proj.on_commit(log_of(1).events[-1])
    log.trim_before(log.next_seq)  # the service keeps only the tail
    cell_seq = proj.observed_seq("users")
    assert cell_seq == log.end_seq
    # a log whose tail skips past the watermark
    broken = SessionLog(base_seq=cell_seq + 5)
    proj.log = broken
    broken.append(make_event("turn/start", cell_seq + 5, {"turn": 9}))
    with pytest.raises(ProjectionError, match="cannot advance across missing seq"):
        proj.materialize()


def test_P3_ignorable_events_advance_the_watermark_only() -> None:
    calls: list[str] = []
    s = session_with(counter(calls=calls), events=log_of(1).events)
    calls.clear()
    s.append(make_event("vendor/x", s.next_seq, {}, ignorable=True))
    assert calls == [] and s.projections.observed_seq("users") == s.last_seq


def test_P4_state_of_unknown_key_is_none_and_snapshot_validates_views() -> None:
    s = session_with(counter(), events=log_of(2).events)
    assert s.projections.state_of("nope") is None
    snap = s.projections.snapshot()
    assert snap.as_of_seq == s.last_seq and snap.values == {"users": {"count": 2}}

    bad = ProjectionDefinition(
        "bad",
        1,
        lambda h, i: {},
        lambda st, ev: st,
        lambda st: None,
        WireView(lambda st: st, _refuse),
    )
    s2 = session_with(bad, events=log_of(1).events)
    with pytest.raises(ProjectionError, match="invalid view"):
        s2.projections.snapshot()


def _refuse(view: Any) -> None:
    raise ValueError("never valid")


def test_P4_cached_snapshot_never_folds_and_reports_lowest_watermark() -> None:
    registry = ProjectionRegistry()
    s = Session(projections=registry)
    assert s.projections.cached_snapshot() is None  # no wire cell yet
    registry.register(counter("a"))
    s.extend(log_of(2).events)
    registry.register(counter("b"))  # no cell for b until something folds
    cached = s.projections.cached_snapshot()
    assert cached is not None and set(cached.values) == {"a"}
    assert s.projections.observed_seq("b") is None  # still never folded


def test_P5_checkpoint_covers_every_unit_with_detached_values() -> None:
    s = session_with(counter("w"), counter("plain", wire=False), events=log_of(2).events)
    cp = s.projections.checkpoint()
    assert cp == {
        "w": {"ver": 1, "seq": s.last_seq, "val": {"n": 2}},
        "plain": {"ver": 1, "seq": s.last_seq, "val": {"n": 2}},
    }
    cp["w"]["val"]["n"] = 99  # detached: the live state is untouched
    assert s.projections.state_of("w") == {"n": 2}


def test_P6_restore_floor_backs_off_one_anchor_event() -> None:
    registry = ProjectionRegistry()
    registry.register(counter("a"))
    registry.register(counter("b"))
    assert (
        restore_floor(
            registry, {"a": {"ver": 1, "seq": 9, "val": {}}, "b": {"ver": 1, "seq": 5, "val": {}}}
        )
        == 5
    )
    assert restore_floor(registry, {"a": {"ver": 1, "seq": 9, "val": {}}}) == 0  # b missing
    assert (
        restore_floor(
            registry, {"a": {"ver": 2, "seq": 9, "val": {}}, "b": {"ver": 1, "seq": 9, "val": {}}}
        )
        == 0
    )  # bad ver
    assert restore_floor(ProjectionRegistry(), {}) is None


def test_P7_restore_from_row_plus_tail_equals_full_fold() -> None:
    events = log_of(5).events
    registry = ProjectionRegistry()
    registry.register(counter())
    at = Session.fold(events[:6], projections=registry).projections.checkpoint()
    floor = restore_floor(registry, at)
    assert floor == 5
    result = restore(registry, {}, at, events[floor:], floor)
    assert result.snapshot.values == {"users": {"count": 5}}
    assert result.rows["users"]["seq"] == events[-1].seq


def test_P7_unusable_row_with_suffix_requires_rereading_from_zero() -> None:
    events = log_of(3).events
    registry = ProjectionRegistry()
    registry.register(counter())
    stale = {"users": {"ver": 1, "seq": 1, "val": {"n": 0}}}  # below base_seq - 1
    with pytest.raises(ProjectionError, match="re-read from seq 0"):
        restore(registry, {}, stale, events[4:], 4)
    # from seq 0 an unusable row simply folds from init
    assert restore(registry, {}, stale, events, 0).snapshot.values == {"users": {"count": 3}}


def test_P7_row_beyond_the_log_end_is_unusable() -> None:
    events = log_of(2).events
    registry = ProjectionRegistry()
    registry.register(counter())
    ahead = {"users": {"ver": 1, "seq": 99, "val": {"n": 7}}}
    with pytest.raises(ProjectionError, match="re-read from seq 0"):
        restore(registry, {}, ahead, events[2:], 2)


def test_P8_view_checkpoint_is_zero_io_and_drops_bad_rows() -> None:
    registry = ProjectionRegistry()
    registry.register(counter("a"))
    registry.register(counter("b"))
    registry.register(counter("c"))
    cp = {
        "a": {"ver": 1, "seq": 3, "val": {"n": 4}},
        "b": {"ver": 7, "seq": 3, "val": {"n": 4}},
        "c": {"ver": 1, "seq": 3, "val": {"n": "x"}},
    }
    assert view_checkpoint(registry, cp) == {"a": {"count": 4}}


def test_P9_hydrate_views_cells_already_at_end_and_never_moves_back() -> None:
    events = log_of(3).events
    s = session_with(counter(), events=events)
    old = {"users": {"ver": 1, "seq": 2, "val": {"n": 1}}}
    snap = s.projections.hydrate(old, events, 0)
    assert snap.values == {"users": {"count": 3}}
    assert s.projections.observed_seq("users") == events[-1].seq
    fresh = session_with(counter())
    fresh.projections.log = SessionLog(0, events)
    snap = fresh.projections.hydrate(old, events[2:], 2)
    assert snap.values == {"users": {"count": 3}}
    assert fresh.projections.observed_seq("users") == events[-1].seq


def test_P10_bumped_state_version_makes_rows_unusable_and_refolds() -> None:
    events = log_of(3).events
    v1 = ProjectionRegistry()
    v1.register(counter(version=1))
    cp = Session.fold(events, projections=v1).checkpoint()
    v2 = ProjectionRegistry()
    v2.register(counter(version=2))
    with pytest.raises(SessionError, match="re-read from seq 0"):
        Session.from_checkpoint(cp, projections=v2)
    assert restore_floor(v2, cp["rows"]) == 0
    assert restore(v2, {}, cp["rows"], events, 0).rows["users"]["ver"] == 2


def _tool_history(b: LogBuilder) -> Any:
    return Session.fold(b.events, projections=default_registry()).projections.view_of("toolHistory")


def test_H5_additions_resolve_from_their_header_and_removal_keeps_declaration() -> None:
    b = LogBuilder()
    b.system("s")
    h0 = b.header([tool_def("read")])
    h1 = b.header([tool_def("read"), tool_def("grep")], reason="change")
    b.tool_update(h1.seq, added=["grep"])
    h2 = b.header([tool_def("grep")], reason="change")
    b.tool_update(h2.seq, removed=["read"])
    view = _tool_history(b)
    assert view["baselineSeq"] == h0.seq and view["tools"] == [tool_def("read")]
    assert [u["added"] for u in view["updates"]] == [[tool_def("grep")], []]
    assert view["updates"][1]["removed"] == ["read"]
    state = Session.fold(b.events, projections=default_registry()).projections.state_of(
        "toolHistory"
    )
    assert "read" in state["declared"]  # removal never erases the declaration


def test_H5_new_series_on_series_reason_starts_series_or_redefinition() -> None:
    for kwargs, tools in (
        ({"reason": "series"}, [tool_def("read")]),
        ({"reason": "change", "starts_series": True}, [tool_def("read")]),
        ({"reason": "change"}, [tool_def("read", "a new schema")]),
    ):
        b = LogBuilder()
        b.system("s")
        b.header([tool_def("read")])
        h = b.header(tools, **kwargs)
        assert _tool_history(b)["baselineSeq"] == h.seq, kwargs


def test_H5_old_logs_without_updates_fall_back_to_active_tools() -> None:
    b = LogBuilder()
    b.system("s")
    b.header([tool_def("read")])
    b.header([tool_def("read"), tool_def("grep")], reason="change")  # no developer update
    view = _tool_history(b)
    assert view["tools"] == [tool_def("read"), tool_def("grep")] and view["updates"] == []


def test_builtin_units_fold_a_session() -> None:
    b = log_of(2)
    b.step_start()
    b.assistant("hi", usage={"inputTokens": 10, "outputTokens": 3})
    b.step_end()
    b.turn_end()
    b.add_raw(
        "agent/inbox/spliced",
        {
            "target": "next-turn",
            "start": 0,
            "inserted": [{"id": "in-1", "role": "user", "content": [], "source": {"kind": "user"}}],
        },
    )
    s = Session.fold(b.events, projections=default_registry())
    values = s.projections.snapshot().values
    assert set(values) == {u.key for u in BUILTIN_UNITS if u.wire is not None}
    assert values["turnBoundary"]["openTurnStartSeq"] is None
    assert values["turnBoundary"]["lastStepBoundary"]["kind"] == "end"
    stats = values["sessionStats"]
    assert stats["turns"] == 2 and stats["usage"] == {"inputTokens": 10, "outputTokens": 3}
    assert [m["id"] for m in values["inbox"]["next-turn"]] == ["in-1"]
    s.append(
        make_event(
            "agent/inbox/spliced",
            s.next_seq,
            {"target": "next-turn", "start": 0, "removedCount": 1, "inserted": []},
        )
    )
    assert s.projections.view_of("inbox") == {"next-turn": [], "next-step": []}
