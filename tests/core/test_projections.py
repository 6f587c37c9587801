"""Rule P (domain projections, docs/session-semantics.md §6): registry, cells, checkpoints.

Each test is named after the rule it pins and asserts against what a broken
implementation would plausibly do (deep-equality gates, trusting rows,
folding over gaps, aliasing checkpoint dicts, ...).
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processor.core.builtin import BUILTIN_UNITS, register_builtins
from processor.core.errors import ProjectionError
from processor.core.events import Event, make_event
from processor.core.frozen import FrozenDict
from processor.core.log import SessionLog
from processor.core.projections import (
    _SHARED_DISPATCH,
    ProjectionDefinition,
    ProjectionRegistry,
    SessionProjections,
    WireView,
    restore,
    restore_floor,
    view_checkpoint,
)

HEADER: dict[str, Any] = {
    "type": "session",
    "version": 1,
    "id": "s",
    "createdAt": 0,
    "isSeeded": False,
    "delegationDepth": 0,
}


# ------------------------------------------------------------------ helpers


def user(seq: int, mid: str | None = None) -> Event:
    return make_event(
        "user/message",
        seq,
        {"id": mid or f"u{seq}", "role": "user", "content": []},
        surface_op="append",
    )


def turn(seq: int) -> Event:
    return make_event("turn/start", seq, {"turn": seq})


def ignorable(seq: int) -> Event:
    return make_event("vendor/x", seq, {"n": seq}, ignorable=True)


class Counter:
    """A unit counting user messages, recording every call it gets."""

    def __init__(
        self,
        key: str = "users",
        version: int = 1,
        *,
        wire: bool = True,
        new_equal_state: bool = False,
    ) -> None:
        self.applied: list[int] = []
        self.views = 0
        self.inits: list[int] = []
        self.new_equal_state = new_equal_state
        self.definition = ProjectionDefinition(
            key,
            version,
            self.init,
            self.apply,
            self.validate,
            WireView(self.view, self.validate_view) if wire else None,
        )

    def init(self, header: Any, inherited: int) -> Any:
        self.inits.append(inherited)
        return {"n": 0}

    def apply(self, state: Any, event: Event) -> Any:
        self.applied.append(event.seq)
        if event.type == "user/message":
            return {"n": state["n"] + 1}
        if self.new_equal_state:
            return {"n": state["n"]}  # deep-equal, but a new object
        return state

    def view(self, state: Any) -> Any:
        self.views += 1
        return {"count": state["n"]}

    @staticmethod
    def validate(state: Any) -> None:
        if not isinstance(state, dict) or type(state.get("n")) is not int:
            raise ValueError("n must be an int")

    @staticmethod
    def validate_view(view: Any) -> None:
        if not isinstance(view, dict) or "count" not in view:
            raise ValueError("count missing")


def setup(
    *units: Counter | ProjectionDefinition,
    base_seq: int = 0,
) -> tuple[ProjectionRegistry, SessionLog, SessionProjections]:
    registry = ProjectionRegistry()
    for unit in units:
        registry.register(unit.definition if isinstance(unit, Counter) else unit)
    log = SessionLog(base_seq)
    return registry, log, SessionProjections(registry, HEADER, log)


def commit(log: SessionLog, proj: SessionProjections, *events: Event) -> None:
    for event in events:
        log.append(event)
        proj.on_commit(event)


def mixed(n: int, start: int = 0) -> list[Event]:
    """Users at even seqs, turn/starts at odd ones."""
    return [user(s) if s % 2 == 0 else turn(s) for s in range(start, start + n)]


# ------------------------------------------------------------------ P-1


def test_P1_irrelevant_event_keeps_state_identity_view_and_fires_nothing() -> None:
    c = Counter()
    _, log, proj = setup(c)
    commit(log, proj, user(0))
    state, view = proj.state_of("users"), proj.view_of("users")
    fired: list[Any] = []
    proj.add_listener(lambda *args: fired.append(args))
    commit(log, proj, turn(1), ignorable(2))
    assert proj.state_of("users") is state
    assert proj.view_of("users") is view
    assert fired == []
    commit(log, proj, user(3))
    assert fired == [("users", {"n": 2}, {"count": 2}, 3)]


def test_P1_view_is_recomputed_only_when_the_state_object_changes() -> None:
    c = Counter()
    _, log, proj = setup(c)
    commit(log, proj, user(0))
    proj.snapshot()
    views = c.views
    commit(log, proj, turn(1), turn(2))
    proj.snapshot()
    proj.drain_view_changes()
    assert c.views == views  # no state change, no view call
    commit(log, proj, user(3))
    proj.snapshot()
    assert c.views == views + 1


def test_P1_identity_not_deep_equality_is_the_change_gate() -> None:
    """A new but deep-equal state is a change (the unit said so by its identity)."""
    c = Counter(new_equal_state=True)
    _, log, proj = setup(c)
    commit(log, proj, user(0))
    proj.drain_view_changes()
    fired: list[int] = []
    proj.add_listener(lambda key, state, view, seq: fired.append(seq))
    commit(log, proj, turn(1))
    assert fired == [1]
    assert "users" in proj.drain_view_changes()


def test_P1_a_view_returned_as_the_same_object_is_not_a_change() -> None:
    cache: dict[int, Any] = {}

    def view(state: Any) -> Any:  # visible part: parity only, object reused
        return cache.setdefault(state["n"] % 2, {"count": state["n"] % 2})

    unit = ProjectionDefinition(
        "parity",
        1,
        lambda h, i: {"n": 0},
        lambda s, e: {"n": s["n"] + 1} if e.type == "user/message" else s,
        Counter.validate,
        WireView(view, Counter.validate_view),
    )
    _, log, proj = setup(unit)
    commit(log, proj, user(0))
    first = proj.drain_view_changes()
    assert first["parity"][0] == {"count": 1}
    commit(log, proj, user(1), user(2))  # state changed twice, view back to the same object
    assert proj.drain_view_changes() == {}
    assert proj.views_of("parity") == (None, cache[1])  # no view change was recorded
    commit(log, proj, user(3))
    assert proj.drain_view_changes() == {"parity": (cache[0], 3)}
    prev_cur = proj.views_of("parity")
    assert prev_cur is not None and prev_cur[0] is cache[1] and prev_cur[1] is cache[0]


def test_P1_drain_reports_each_changed_view_once_per_batch() -> None:
    a, b = Counter("a"), Counter("b")
    _, log, proj = setup(a, b)
    assert set(proj.drain_view_changes()) == {"a", "b"}  # fresh cells (at seq -1)
    commit(log, proj, user(0), user(1), turn(2))
    assert proj.drain_view_changes() == {"a": ({"count": 2}, 2), "b": ({"count": 2}, 2)}
    assert proj.drain_view_changes() == {}


def test_P1_listener_remover_stops_notifications() -> None:
    _, log, proj = setup(Counter())
    fired: list[int] = []
    remove = proj.add_listener(lambda key, state, view, seq: fired.append(seq))
    commit(log, proj, user(0))
    remove()
    remove()  # idempotent
    commit(log, proj, user(1))
    assert fired == [0]


# ------------------------------------------------------------------ P-2


def test_P2_same_version_adds_a_reference_and_keeps_the_first_definition() -> None:
    registry = ProjectionRegistry()
    first, second = Counter(), Counter()
    r1 = registry.register(first.definition)
    r2 = registry.register(second.definition)
    assert registry.get("users") is first.definition and registry.refs("users") == 2
    r1.release()
    r1.release()  # a double release must not drop r2's reference
    assert registry.get("users") is first.definition and registry.refs("users") == 1
    r2.release()
    assert registry.get("users") is None and "users" not in registry


def test_P2_different_version_is_refused_with_rule_P2() -> None:
    registry = ProjectionRegistry()
    registry.register(Counter(version=1).definition)
    with pytest.raises(ProjectionError) as err:
        registry.register(Counter(version=2).definition)
    assert err.value.rule == "P-2"
    assert registry.get("users") is not None and registry.refs("users") == 1


def test_P2_definitions_are_in_registration_order() -> None:
    registry = ProjectionRegistry()
    for key in ("c", "a", "b"):
        registry.register(Counter(key).definition)
    assert [d.key for d in registry.definitions()] == ["c", "a", "b"]


def test_P2_session_notices_unregistration() -> None:
    c, other = Counter(), Counter("other")
    registry, log, proj = setup(other)
    reg = registry.register(c.definition)
    commit(log, proj, user(0))
    assert "users" in proj.snapshot().values
    reg.release()
    assert "users" not in proj.snapshot().values
    assert proj.state_of("users") is None
    assert "users" not in proj.checkpoint()
    cached = proj.cached_snapshot()
    assert cached is not None and "users" not in cached.values


def test_P2_reregistered_key_with_a_new_version_folds_from_init() -> None:
    v1 = Counter(version=1)
    registry, log, proj = setup()
    reg = registry.register(v1.definition)
    commit(log, proj, user(0), user(1))
    reg.release()
    v2 = Counter(version=2)
    registry.register(v2.definition)
    commit(log, proj, turn(2))
    assert v2.inits == [0] and v2.applied == [0, 1, 2]  # whole prefix, from init
    assert proj.checkpoint()["users"]["ver"] == 2


def test_P2_release_and_reregister_between_two_commits_is_still_noticed() -> None:
    """Even the same version and definition: a new incarnation refolds."""
    c = Counter()
    registry, log, proj = setup()
    reg = registry.register(c.definition)
    commit(log, proj, user(0))
    reg.release()
    registry.register(c.definition)
    log.append(user(1))
    proj.on_commit(log.get(1))  # type: ignore[arg-type]
    assert c.inits == [0, 0]


# ------------------------------------------------------------------ P-3


def test_P3_every_committed_event_drives_every_unit_eagerly() -> None:
    a, b = Counter("a"), Counter("b", wire=False)
    _, log, proj = setup(a, b)
    commit(log, proj, *mixed(4))
    assert a.applied == [0, 1, 2, 3] and b.applied == [0, 1, 2, 3]  # without any read


def test_P3_unit_without_a_cell_folds_init_over_the_whole_prefix() -> None:
    late = Counter()
    registry, log, proj = setup(Counter("early"))
    commit(log, proj, *mixed(5))
    registry.register(late.definition)
    commit(log, proj, user(5))
    assert late.applied == [0, 1, 2, 3, 4, 5]
    assert proj.state_of("users") == {"n": 4}


def test_P3_init_gets_the_inherited_event_count() -> None:
    c = Counter()
    registry, log, proj = setup()
    commit(log, proj, user(0), make_event("session/end-seed", 1, {"inherited": True}), user(2))
    registry.register(c.definition)
    proj.materialize()
    assert c.inits == [2]


def test_P3_watermark_advances_even_when_state_does_not_change() -> None:
    _, log, proj = setup(Counter())
    commit(log, proj, user(0), turn(1), turn(2))
    assert proj.observed_seq("users") == 2
    assert proj.snapshot().as_of_seq == 2


def test_P3_ignorable_unknown_events_advance_but_are_never_applied() -> None:
    c = Counter()
    _, log, proj = setup(c)
    commit(log, proj, user(0), ignorable(1), user(2))
    assert c.applied == [0, 2]
    assert proj.observed_seq("users") == 2


def test_P3_gap_cannot_be_crossed() -> None:
    c = Counter()
    _, log, proj = setup(c)
    commit(log, proj, user(0), user(1))
    gapped = SessionLog(5, [user(5)])
    proj.log = gapped  # the retained tail skips seqs 2..4
    with pytest.raises(ProjectionError, match="cannot advance across missing seq 2") as err:
        proj.materialize()
    assert err.value.rule == "P-3"
    assert proj.observed_seq("users") == 1 and proj.log is gapped


def test_P3_a_unit_without_a_cell_on_a_suffix_log_refuses() -> None:
    registry, log, proj = setup(base_seq=10)
    registry.register(Counter().definition)
    log.append(user(10))
    with pytest.raises(ProjectionError, match="re-read from seq 0") as err:
        proj.on_commit(log.get(10))  # type: ignore[arg-type]
    assert err.value.rule == "P-7"


def test_P3_on_commit_of_an_event_not_in_the_log_is_refused() -> None:
    _, _, proj = setup(Counter())
    with pytest.raises(ProjectionError, match="append it to the log first"):
        proj.on_commit(user(0))


def test_P3_failing_apply_leaves_the_cell_at_its_previous_watermark() -> None:
    def apply(state: Any, event: Event) -> Any:
        if event.type == "turn/start":
            raise ProjectionError(event.seq, "X-1", "boom")
        return {"n": state["n"] + 1}

    unit = ProjectionDefinition("fragile", 1, lambda h, i: {"n": 0}, apply, Counter.validate)
    _, log, proj = setup(unit)
    commit(log, proj, user(0))
    log.append(turn(1))
    with pytest.raises(ProjectionError, match="boom"):
        proj.on_commit(log.get(1))  # type: ignore[arg-type]
    assert proj.observed_seq("fragile") == 0


# ------------------------------------------------------------------ P-4


def test_P4_state_of_materializes_and_unknown_key_is_none() -> None:
    late = Counter()
    registry, log, proj = setup()
    commit(log, proj, user(0), user(1))
    registry.register(late.definition)
    assert proj.observed_seq("users") is None
    assert proj.state_of("users") == {"n": 2}
    assert proj.state_of("nope") is None


def test_P4_snapshot_holds_validated_wire_views_only_at_the_log_end() -> None:
    registry, log, proj = setup(Counter("w"), Counter("plain", wire=False))
    commit(log, proj, *mixed(3))
    snap = proj.snapshot()
    assert snap.as_of_seq == 2 and snap.values == {"w": {"count": 2}}
    assert proj.snapshot(["plain", "nope"]).values == {}
    registry.register(Counter("late").definition)
    assert set(proj.snapshot(["late"]).values) == {"late"}


def test_P4_snapshot_refuses_an_invalid_view() -> None:
    unit = ProjectionDefinition(
        "bad",
        1,
        lambda h, i: {"n": 0},
        lambda s, e: s,
        Counter.validate,
        WireView(lambda s: {"oops": 1}, Counter.validate_view),
    )
    _, log, proj = setup(unit)
    commit(log, proj, user(0))
    with pytest.raises(ProjectionError, match="invalid view"):
        proj.snapshot()
    with pytest.raises(ProjectionError, match="invalid view"):
        proj.drain_view_changes()


def test_P4_cached_snapshot_never_folds_and_reports_the_lowest_watermark() -> None:
    a, b, late = Counter("a"), Counter("b"), Counter("late")
    registry, log, proj = setup(a, b)
    for event in mixed(6):
        log.append(event)
    proj.install(
        {"a": {"ver": 1, "seq": 3, "val": {"n": 2}}, "b": {"ver": 1, "seq": 5, "val": {"n": 3}}}
    )
    registry.register(late.definition)
    cached = proj.cached_snapshot()
    assert cached is not None and cached.as_of_seq == 3
    assert cached.values == {"a": {"count": 2}, "b": {"count": 3}}
    assert a.applied == b.applied == late.applied == []  # nothing folded
    assert proj.observed_seq("late") is None


def test_P4_cached_snapshot_is_none_without_a_wire_cell() -> None:
    _, log, proj = setup(Counter("plain", wire=False))
    commit(log, proj, user(0))
    assert proj.cached_snapshot() is None
    _, _, empty = setup(Counter())
    assert empty.cached_snapshot() is None


# ------------------------------------------------------------------ P-5


def test_P5_checkpoint_covers_every_unit_with_detached_values() -> None:
    _, log, proj = setup(Counter("w"), Counter("plain", wire=False))
    commit(log, proj, user(0), user(1))
    cp = proj.checkpoint()
    assert cp == {
        "w": {"ver": 1, "seq": 1, "val": {"n": 2}},
        "plain": {"ver": 1, "seq": 1, "val": {"n": 2}},
    }
    cp["w"]["val"]["n"] = 99
    assert proj.state_of("w") == {"n": 2}
    assert proj.state_of("w") is not cp["w"]["val"]


def test_P5_checkpoint_of_frozen_states_is_plain_and_mutable() -> None:
    registry, log, proj = setup()
    register_builtins(registry)
    commit(log, proj, user(0))
    row = proj.checkpoint()["sessionStats"]
    assert type(row["val"]) is dict and type(row["val"]["messages"]) is dict
    row["val"]["messages"]["user"] = 42  # a thawed copy: no TypeError, no effect
    assert proj.state_of("sessionStats")["messages"] == {"user": 1}


def test_P5_empty_log_rows_are_at_seq_minus_one() -> None:
    _, _, proj = setup(Counter())
    assert proj.checkpoint() == {"users": {"ver": 1, "seq": -1, "val": {"n": 0}}}


# ------------------------------------------------------------------ P-6


def test_P6_restore_floor_backs_off_one_anchor_event() -> None:
    registry, _, _ = setup(Counter("a"), Counter("b"))
    assert (
        restore_floor(
            registry, {"a": {"ver": 1, "seq": 9, "val": {}}, "b": {"ver": 1, "seq": 5, "val": {}}}
        )
        == 5
    )
    assert (
        restore_floor(
            registry, {"a": {"ver": 1, "seq": 9, "val": {}}, "b": {"ver": 1, "seq": 9, "val": {}}}
        )
        == 9
    )


def test_P6_missing_or_mismatched_row_needs_the_whole_log() -> None:
    registry, _, _ = setup(Counter("a"), Counter("b"))
    assert restore_floor(registry, {"a": {"ver": 1, "seq": 9, "val": {}}}) == 0
    assert (
        restore_floor(
            registry, {"a": {"ver": 2, "seq": 9, "val": {}}, "b": {"ver": 1, "seq": 9, "val": {}}}
        )
        == 0
    )
    assert (
        restore_floor(
            registry,
            {
                "a": {"ver": True, "seq": 9, "val": {}},  # bool is not 1
                "b": {"ver": 1, "seq": 9, "val": {}},
            },
        )
        == 0
    )
    assert (
        restore_floor(
            registry, {"a": {"ver": 1, "seq": -1, "val": {}}, "b": {"ver": 1, "seq": 9, "val": {}}}
        )
        == 0
    )


def test_P6_no_registered_unit_means_no_floor() -> None:
    assert restore_floor(ProjectionRegistry(), {"a": {"ver": 1, "seq": 3, "val": {}}}) is None


def test_P6_anchor_lets_restore_detect_a_shortened_log() -> None:
    """Reading from the floor (= row.seq) proves the row's own event is still there."""
    c = Counter()
    registry, log, proj = setup(c)
    commit(log, proj, *mixed(8))
    cp = proj.checkpoint()
    floor = restore_floor(registry, cp)
    assert floor == 7
    stored = mixed(7)  # crash repair cut the log to seqs 0..6
    with pytest.raises(ProjectionError, match="re-read from seq 0"):
        restore(registry, HEADER, cp, stored[floor:], floor)


# ------------------------------------------------------------------ P-7


def test_P7_restore_from_row_plus_tail_equals_full_fold() -> None:
    events = mixed(12)
    registry, log, proj = setup(Counter())
    commit(log, proj, *events[:6])
    cp = proj.checkpoint()
    full = setup(Counter())
    commit(full[1], full[2], *events)
    floor = restore_floor(registry, cp)
    assert floor == 5
    fresh = Counter()
    reg2, _, _ = setup(fresh)
    result = restore(reg2, HEADER, cp, events[floor:], floor)
    assert result.snapshot == full[2].snapshot()
    assert result.rows == full[2].checkpoint()
    assert fresh.applied == list(range(6, 12))  # only the events after row.seq
    assert fresh.inits == []


def test_P7_unusable_row_with_a_suffix_requires_rereading_from_zero() -> None:
    events = mixed(8)
    registry, _, _ = setup(Counter())
    for bad in (
        {"ver": 1, "seq": 1, "val": {"n": 0}},  # below base_seq - 1
        {"ver": 1, "seq": 99, "val": {"n": 0}},  # beyond the log end
        {"ver": 2, "seq": 4, "val": {"n": 0}},  # other stateVersion
        {"ver": 1, "seq": 4, "val": {"n": "x"}},  # invalid state
        {"ver": 1, "seq": 4},  # no val
        None,
    ):  # no row
        cp = {"users": bad} if bad is not None else {}
        with pytest.raises(ProjectionError, match="re-read from seq 0") as err:
            restore(registry, HEADER, cp, events[4:], 4)
        assert err.value.rule == "P-7"


def test_P7_from_seq_zero_an_unusable_row_folds_from_init() -> None:
    events = mixed(8)
    registry, _, _ = setup(Counter())
    stale = {"users": {"ver": 1, "seq": 99, "val": {"n": 50}}}
    result = restore(registry, HEADER, stale, events, 0)
    assert result.snapshot.values == {"users": {"count": 4}}
    assert result.rows["users"] == {"ver": 1, "seq": 7, "val": {"n": 4}}


def test_P7_row_at_base_seq_minus_one_is_usable_without_events() -> None:
    registry, _, _ = setup(Counter())
    cp = {"users": {"ver": 1, "seq": 9, "val": {"n": 3}}}
    result = restore(registry, HEADER, cp, [], 10)
    assert result.snapshot.as_of_seq == 9 and result.snapshot.values == {"users": {"count": 3}}


def test_P7_restore_checks_contiguity_of_the_events() -> None:
    registry, _, _ = setup(Counter())
    cp = {"users": {"ver": 1, "seq": 3, "val": {"n": 1}}}
    with pytest.raises(ProjectionError, match="cannot advance across missing seq 5"):
        restore(registry, HEADER, cp, [user(3), user(4), user(6)], 3)
    with pytest.raises(ProjectionError, match="missing seq 3"):
        restore(registry, HEADER, cp, [user(4)], 3)


def test_P7_restored_state_never_aliases_the_checkpoint() -> None:
    registry, _, _ = setup(Counter())
    cp: dict[str, Any] = {"users": {"ver": 1, "seq": 3, "val": {"n": 1}}}
    result = restore(registry, HEADER, cp, [user(3)], 3)
    cp["users"]["val"]["n"] = 1000
    assert result.rows["users"]["val"] == {"n": 1}
    assert result.snapshot.values == {"users": {"count": 1}}
    result.rows["users"]["val"]["n"] = 5
    assert cp["users"]["val"]["n"] == 1000
    # an identity view of an untouched row must not hand out the caller's dict either
    same = ProjectionDefinition(
        "same",
        1,
        lambda h, i: {"n": 0},
        lambda s, e: s,
        Counter.validate,
        WireView(lambda s: s, Counter.validate),
    )
    reg2, _, _ = setup(same)
    row: dict[str, Any] = {"same": {"ver": 1, "seq": 3, "val": {"n": 1}}}
    snap = restore(reg2, HEADER, row, [user(3)], 3).snapshot
    assert snap.values["same"] is not row["same"]["val"]
    row["same"]["val"]["n"] = 9
    assert snap.values["same"] == {"n": 1}


def test_P7_rows_per_unit_can_sit_at_different_watermarks() -> None:
    events = mixed(10)
    a, b = Counter("a"), Counter("b")
    registry, _, _ = setup(a, b)
    cp = {"a": {"ver": 1, "seq": 7, "val": {"n": 4}}, "b": {"ver": 1, "seq": 3, "val": {"n": 2}}}
    floor = restore_floor(registry, cp)
    assert floor == 3
    result = restore(registry, HEADER, cp, events[floor:], floor)
    assert result.snapshot.values == {"a": {"count": 5}, "b": {"count": 5}}
    assert a.applied == [8, 9] and b.applied == [4, 5, 6, 7, 8, 9]


# ------------------------------------------------------------------ P-8


def test_P8_view_checkpoint_is_zero_io_and_drops_bad_rows() -> None:
    a, b, c, d = Counter("a"), Counter("b"), Counter("c"), Counter("d", wire=False)
    registry, _, _ = setup(a, b, c, d)
    cp = {
        "a": {"ver": 1, "seq": 3, "val": {"n": 4}},
        "b": {"ver": 7, "seq": 3, "val": {"n": 4}},
        "c": {"ver": 1, "seq": 3, "val": {"n": "x"}},
        "d": {"ver": 1, "seq": 3, "val": {"n": 1}},
        "gone": {"ver": 1, "seq": 3, "val": {"n": 1}},
    }
    assert view_checkpoint(registry, cp) == {"a": {"count": 4}}
    assert a.applied == [] and a.inits == []


def test_P8_a_row_whose_view_fails_validation_is_absent() -> None:
    unit = ProjectionDefinition(
        "v",
        1,
        lambda h, i: {"n": 0},
        lambda s, e: s,
        Counter.validate,
        WireView(lambda s: {"count": s["n"]} if s["n"] else {}, Counter.validate_view),
    )
    registry, _, _ = setup(unit)
    assert view_checkpoint(registry, {"v": {"ver": 1, "seq": 0, "val": {"n": 0}}}) == {}
    assert view_checkpoint(registry, {"v": {"ver": 1, "seq": 0, "val": {"n": 2}}}) == {
        "v": {"count": 2}
    }


# ------------------------------------------------------------------ P-9


def test_P9_hydrate_views_cells_already_at_the_end_without_restoring() -> None:
    c = Counter()
    _, log, proj = setup(c)
    commit(log, proj, *mixed(6))
    applied = list(c.applied)
    garbage = {"users": {"ver": 99}}  # restore with base_seq 3 would refuse this
    snap = proj.hydrate(garbage, log.events_from(3), 3)
    assert snap.as_of_seq == 5 and snap.values == {"users": {"count": 3}}
    assert c.applied == applied


def test_P9_hydrate_restores_and_installs_missing_or_behind_cells() -> None:
    events = mixed(8)
    c = Counter()
    registry, log, proj = setup(base_seq=4)
    registry.register(c.definition)
    for event in events[4:]:
        log.append(event)
    cp = {"users": {"ver": 1, "seq": 4, "val": {"n": 3}}}
    snap = proj.hydrate(cp, events[4:], 4)
    assert snap.as_of_seq == 7 and snap.values == {"users": {"count": 4}}
    assert proj.observed_seq("users") == 7
    log.append(user(8))
    proj.on_commit(user(8))
    assert proj.state_of("users") == {"n": 5}


def test_P9_hydrate_never_moves_a_cell_back() -> None:
    a, b = Counter("a"), Counter("b")
    registry, log, proj = setup(a)
    commit(log, proj, *mixed(8))
    registry.register(b.definition)
    # b has no cell, a is at 7; hydrate over 0..5 must not move a back to 5
    snap = proj.hydrate({}, mixed(6), 0)
    assert snap.as_of_seq == 5 and snap.values == {"a": {"count": 3}, "b": {"count": 3}}
    assert proj.observed_seq("a") == 7 and proj.state_of("a") == {"n": 4}
    assert proj.observed_seq("b") == 7  # installed at 5, then caught up from the log


# ------------------------------------------------------------------ P-10


def test_P10_bumped_state_version_makes_rows_unusable_and_refolds_from_the_log() -> None:
    events = mixed(6)
    _, log, proj = setup(Counter(version=1))
    commit(log, proj, *events)
    cp = proj.checkpoint()
    reg2, _, _ = setup(Counter(version=2))
    assert restore_floor(reg2, cp) == 0
    with pytest.raises(ProjectionError, match="re-read from seq 0"):
        restore(reg2, HEADER, cp, events[5:], 5)
    result = restore(reg2, HEADER, cp, events, 0)  # the log is the truth
    assert result.rows["users"] == {"ver": 2, "seq": 5, "val": {"n": 3}}
    assert view_checkpoint(reg2, cp) == {}


def test_P10_a_checkpoint_never_replaces_the_log() -> None:
    """A row claiming more than the log holds is not served, even from seq 0."""
    registry, _, _ = setup(Counter())
    lying = {"users": {"ver": 1, "seq": 50, "val": {"n": 40}}}
    result = restore(registry, HEADER, lying, mixed(4), 0)
    assert result.snapshot.values == {"users": {"count": 2}}


# ------------------------------------------------------------------ install


def test_install_continues_from_rows_on_a_suffix_log_without_the_prefix() -> None:
    events = mixed(10)
    c = Counter()
    _, full_log, full = setup(Counter())
    commit(full_log, full, *events[:6])
    rows = full.checkpoint()
    _, log, proj = setup(c, base_seq=6)
    proj.install(rows, 5)
    assert proj.observed_seq("users") == 5 and c.applied == []
    commit(log, proj, *events[6:])
    commit(full_log, full, *events[6:])
    assert proj.snapshot() == full.snapshot()
    assert c.applied == [6, 7, 8, 9] and c.inits == []
    rows["users"]["val"]["n"] = 77  # installed state is not the row dict
    assert proj.state_of("users") == {"n": 5}


def test_install_uses_each_row_seq_as_the_watermark() -> None:
    _, log, proj = setup(Counter("a"), Counter("b"), base_seq=4)
    for event in mixed(4, start=4):
        log.append(event)
    proj.install(
        {"a": {"ver": 1, "seq": 3, "val": {"n": 2}}, "b": {"ver": 1, "seq": 5, "val": {"n": 3}}}
    )
    assert proj.observed_seq("a") == 3 and proj.observed_seq("b") == 5
    assert proj.snapshot().values == {"a": {"count": 4}, "b": {"count": 4}}


def test_install_refuses_unusable_rows_and_installs_nothing() -> None:
    _, _, proj = setup(Counter("a"), Counter("b"), base_seq=6)
    good = {"ver": 1, "seq": 5, "val": {"n": 1}}
    for rows in (
        {"a": good},  # b missing
        {"a": good, "b": {"ver": 2, "seq": 5, "val": {"n": 1}}},
        {"a": good, "b": {"ver": 1, "seq": 2, "val": {"n": 1}}},  # below the log
        {"a": good, "b": {"ver": 1, "seq": 5, "val": []}},
    ):
        with pytest.raises(ProjectionError, match="re-read from seq 0"):
            proj.install(rows, 5)
        assert proj.observed_seq("a") is None
    with pytest.raises(ProjectionError, match="re-read from seq 0"):
        proj.install({"a": good, "b": good}, 4)  # not the seq the log continues from


# ------------------------------------------------------------------ property


def _random_events(rng: random.Random, n: int) -> list[Event]:
    """A random log of log-only and domain events the built-in units read."""
    events: list[Event] = []
    tools: list[str] = []
    header_seq: int | None = None
    pending: list[str] = []
    for seq in range(n):
        kind = rng.choice(
            [
                "turn",
                "turn_end",
                "step",
                "step_end",
                "call",
                "attempt",
                "retry",
                "splice",
                "header",
                "ignorable",
                "user",
                "assistant",
                "result",
                "dev",
            ]
        )
        if kind == "dev" and not tools:
            kind = "header"
        if kind == "turn":
            ev = make_event("turn/start", seq, {"turn": seq})
        elif kind == "turn_end":
            ev = make_event("turn/end", seq, {"turn": seq, "reason": "stop"})
        elif kind == "step":
            ev = make_event("step/start", seq, {"turn": 1, "step": seq})
        elif kind == "step_end":
            ev = make_event("step/end", seq, {"turn": 1, "step": seq})
        elif kind == "call":
            ev = make_event(
                "tool/call",
                seq,
                {"turn": 1, "step": 1, "callId": f"c{seq}", "name": "read", "arguments": {}},
            )
        elif kind == "attempt":
            ev = make_event("assistant/attempt", seq, {"turn": 1, "step": 1, "stream": "s"})
        elif kind == "retry":
            ev = make_event("llm/retry", seq, {})
        elif kind == "splice":
            mid = f"in{seq}"
            pending.append(mid)
            ev = make_event(
                "agent/inbox/spliced",
                seq,
                {
                    "target": rng.choice(["next-turn", "next-step"]),
                    "start": 0,
                    "inserted": [{"id": mid, "role": "user", "content": []}],
                },
            )
        elif kind == "header":
            names = rng.sample(["read", "grep", "edit"], rng.randint(0, 3))
            version = rng.choice(["v1", "v2"])
            header: dict[str, Any] = {"config": {"provider": "p", "model": "m"}}
            if names:
                header["tools"] = [
                    {"name": t, "description": version, "parameters": {"type": "object"}}
                    for t in names
                ]
            tools, header_seq = names, seq
            ev = make_event(
                "request/header",
                seq,
                {"header": header, "reason": rng.choice(["initial", "change", "series"])},
            )
        elif kind == "ignorable":
            ev = ignorable(seq)
        elif kind == "user":
            mid = pending.pop(0) if pending and rng.random() < 0.5 else f"u{seq}"
            ev = user(seq, mid)
        elif kind == "assistant":
            ev = make_event(
                "assistant/message",
                seq,
                {
                    "turn": 1,
                    "step": 1,
                    "stream": "s",
                    "usage": {"inputTokens": rng.randint(0, 9), "outputTokens": 1.5},
                    "message": {"id": f"a{seq}", "role": "assistant", "content": []},
                },
                surface_op="append",
            )
        elif kind == "result":
            data: dict[str, Any] = {
                "turn": 1,
                "step": 1,
                "message": {"id": f"t{seq}", "role": "tool", "content": [], "isError": True},
            }
            if rng.random() < 0.5:
                data["error"] = {"name": "read", "code": "x"}
            ev = make_event("tool/result", seq, data, surface_op="append")
        else:
            blocks = [
                {"type": "tool-addition", "toolName": rng.choice(tools)},
                {"type": "tool-removal", "toolName": rng.choice(["read", "grep"])},
            ]
            ev = make_event(
                "developer/message",
                seq,
                {
                    "turn": 1,
                    "step": 1,
                    "headerSeq": header_seq,
                    "message": {"id": f"d{seq}", "role": "developer", "content": blocks},
                },
                surface_op="append",
            )
        events.append(ev)
    return events


def _registry() -> tuple[ProjectionRegistry, Counter]:
    registry = ProjectionRegistry()
    register_builtins(registry)
    plain = Counter("plain", wire=False)
    registry.register(plain.definition)
    return registry, plain


def _fold(registry: ProjectionRegistry, events: list[Event]) -> SessionProjections:
    log = SessionLog()
    proj = SessionProjections(registry, HEADER, log)
    commit(log, proj, *events)
    return proj


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 40), data=st.data())
def test_P6_P7_checkpoint_at_any_k_restores_to_the_full_fold(
    seed: int, n: int, data: st.DataObject
) -> None:
    rng = random.Random(seed)
    events = _random_events(rng, n)
    registry, _ = _registry()
    full = _fold(registry, events)
    # one checkpoint per prefix; each unit's row may come from a different prefix
    cps = [_fold(registry, events[:k]).checkpoint() for k in range(n + 1)]
    keys = [d.key for d in registry.definitions()]
    ks = {key: data.draw(st.integers(0, n), label=f"k[{key}]") for key in keys}
    cp = {key: cps[ks[key]][key] for key in keys}
    floor = restore_floor(registry, cp)
    assert floor == max(min(ks.values()) - 1, 0)
    result = restore(registry, HEADER, cp, events[floor:], floor)
    assert result.snapshot == full.snapshot()
    assert result.rows == full.checkpoint()
    if len(set(ks.values())) == 1:
        assert (
            view_checkpoint(registry, cp)
            == _fold(registry, events[: ks[keys[0]]]).snapshot().values
        )
    # a log shortened below the highest watermark: refuse, or (from 0) fold the short log
    top = max(ks.values())
    if top >= 1:
        cut = data.draw(st.integers(0, top - 1), label="cut")  # seqs 0..cut-1 survive
        short = events[:cut]
        if floor > 0:
            with pytest.raises(ProjectionError, match="re-read from seq 0"):
                restore(registry, HEADER, cp, short[floor:], floor)
        else:
            again = restore(registry, HEADER, cp, short, 0)
            assert again.snapshot == _fold(registry, short).snapshot()


def test_builtin_units_are_all_registered_by_the_property_registry() -> None:
    registry, _ = _registry()
    keys = [u.key for u in BUILTIN_UNITS]
    assert [d.key for d in registry.definitions()][: len(keys)] == keys
    assert isinstance(_fold(registry, [user(0)]).state_of("sessionStats"), FrozenDict)


def test_P3_sessions_of_one_registry_share_a_dispatch_table_the_newest_8_kept() -> None:
    """Sessions of the same units share one dispatch table; the table of tables
    keeps the newest registries' (a replaced registry's go stale) and counts
    each one it drops, so its bound is reported."""
    table = _SHARED_DISPATCH
    registry, log, proj = setup(Counter())
    commit(log, proj, user(0), user(1))
    log2 = SessionLog(0)
    proj2 = SessionProjections(registry, HEADER, log2)
    hits = table.hits
    commit(log2, proj2, user(0), user(1))
    assert proj2._dispatch is proj._dispatch and table.hits > hits
    full = table.full
    others = [setup(Counter()) for _ in range(table.bound)]
    for _, olog, oproj in others:
        commit(olog, oproj, user(0), user(1))
    assert table.size() == table.bound
    assert table.full >= full + 1  # the first registry's table made room
    log3 = SessionLog(0)
    proj3 = SessionProjections(registry, HEADER, log3)
    commit(log3, proj3, user(0), user(1))
    assert proj3._dispatch is not proj._dispatch  # a copy: memory, not correctness
    assert proj3.observed_seq("users") == 1


def test_P3_ignorable_types_do_not_grow_the_shared_dispatch_table() -> None:
    """The fast path's dispatch table is shared by every session of the same
    units (process-wide): an ignorable type is any string the input picks,
    so it must not get an entry of its own (only the known types may)."""
    c = Counter()
    _, log, proj = setup(c)
    commit(log, proj, user(0))
    for seq in range(1, 200):
        commit(log, proj, make_event(f"vendor/x{seq}", seq, {"n": seq}, ignorable=True))
    commit(log, proj, user(200))
    assert c.applied == [0, 200]
    assert proj.observed_seq("users") == 200
    assert len(proj._dispatch) <= 2  # user/message, and nothing per vendor type
