"""The runtime's ``goal`` unit (GL-1..GL-7, docs/projection-rules.md).

The cases follow the runtime's own replay cases for its goal fold: every
invalid stream below is one the runtime's fold refuses, every valid one a
stream its goal service writes.
"""

from __future__ import annotations

from typing import Any

import pytest

from processor.core.builder import LogBuilder
from processor.core.builtin import GOAL, default_registry
from processor.core.builtin.goal import GoalReplayError, decode_change
from processor.core.defaults import default_message_projections
from processor.core.session import Session


def change(**overrides: Any) -> dict[str, Any]:
    """A valid create change (the runtime spec's base case), with overrides."""
    base: dict[str, Any] = {
        "kind": "goal/change",
        "version": 1,
        "operation": "create",
        "goal": {
            "id": "goal-validation",
            "revision": 1,
            "objective": "validate",
            "phase": "active",
            "maxGoalRounds": 2,
        },
        "roundsStarted": 0,
        "createdAt": 10,
        "updatedAt": 10,
    }
    return {**base, **overrides}


def mutation(
    current: dict[str, Any], operation: str, phase: str, **overrides: Any
) -> dict[str, Any]:
    """The next revision of ``current`` in ``phase`` (one tick later)."""
    goal = {
        "id": current["goal"]["id"],
        "revision": current["goal"]["revision"] + 1,
        "objective": current["goal"]["objective"],
        "phase": phase,
        "maxGoalRounds": current["goal"]["maxGoalRounds"],
    }
    if phase == "blocked":
        goal["blockedReason"] = {"code": "test-blocker", "message": "Blocked for the test."}
    return {
        **current,
        "operation": operation,
        "goal": goal,
        "updatedAt": current["updatedAt"] + 1,
        **overrides,
    }


def clear(goal_id: str, revision: int, at: int) -> dict[str, Any]:
    return {
        "kind": "goal/change",
        "version": 1,
        "operation": "clear",
        "cleared": {"id": goal_id, "revision": revision},
        "clearedAt": at,
    }


def fold(*items: dict[str, Any] | tuple[str, int, int]) -> Any:
    """Fold changes (dicts) and goal rounds (``(goalId, revision, round)``)."""
    b = LogBuilder()
    b.system("s")
    for item in items:
        if isinstance(item, tuple):
            goal_id, revision, number = item
            b.user(
                f"round {number}",
                source={"kind": "goal", "goalId": goal_id, "revision": revision, "round": number},
            )
        else:
            b.add_raw("goal/change", item)
    s = Session.fold(
        b.events, projections=default_registry(), message_projections=default_message_projections()
    )
    return s.projections.state_of("goal"), s.projections.view_of("goal")


def failure(*items: dict[str, Any] | tuple[str, int, int]) -> str:
    state, _ = fold(*items)
    assert state["failure"] is not None, "the stream should break a goal rule"
    return str(state["failure"])


# ------------------------------------------------------------------ GL-1


def test_GL1_view_is_null_before_create_and_the_whole_goal_after() -> None:
    state, view = fold()
    assert view is None
    assert state == {"current": None, "seenGoalIds": [], "failure": None}
    assert GOAL.state_version == 6 and GOAL.key == "goal"
    first = change()
    paused = mutation(first, "pause", "paused")
    state, view = fold(first, paused)
    assert view == {
        "goal": {
            "id": "goal-validation",
            "revision": 2,
            "objective": "validate",
            "phase": "paused",
            "maxGoalRounds": 2,
        },
        "roundsStarted": 0,
        "createdAt": 10,
        "updatedAt": 11,
    }
    assert state["seenGoalIds"] == ["goal-validation"]
    GOAL.validate_state(state)


def test_GL1_unrelated_events_keep_the_state_object() -> None:
    b = LogBuilder()
    b.system("s")
    b.add_raw("goal/change", change())
    s = Session.fold(
        b.events, projections=default_registry(), message_projections=default_message_projections()
    )
    before = s.projections.state_of("goal")
    s.append(b.user("plain", source={"kind": "user"}))
    s.append(b.add_raw("turn/start", {"turn": 1}))
    assert s.projections.state_of("goal") is before


# ------------------------------------------------------------------ GL-2


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (change(version=2), "unsupported goal change version"),
        (change(operation="explode"), "operation is invalid"),
        (change(extra=True), "snapshot change must have exactly"),
        ({**clear("x", 2, 1), "extra": True}, "clear change must have exactly"),
        (change(roundsStarted=-1), "roundsStarted"),
        (change(createdAt=-1), "createdAt"),
        (change(updatedAt=9), "cannot precede"),
        ({**clear("x", 2, 1), "cleared": None}, "tombstone"),
        ({**clear("x", 2, 1), "cleared": {"id": "", "revision": 1}}, "non-empty"),
        ({**clear("x", 2, 1), "cleared": {"id": "x", "revision": 0}}, "positive safe integer"),
        (
            {"kind": "goal/change", "version": 1, "operation": "create"},
            "snapshot change must have exactly",
        ),
    ],
)
def test_GL2_malformed_changes_are_refused(payload: dict[str, Any], message: str) -> None:
    with pytest.raises(GoalReplayError, match=message):
        decode_change(payload)
    assert message in failure(payload)


GOOD = change()["goal"]


@pytest.mark.parametrize(
    "goal",
    [
        None,
        {**GOOD, "extra": True},
        {**GOOD, "id": ""},
        {**GOOD, "objective": " "},
        {**GOOD, "objective": " padded "},
        {**GOOD, "objective": "\ufeffbom"},  # JavaScript's trim removes U+FEFF
        {**GOOD, "phase": "unknown"},
        {**GOOD, "blockedReason": {"code": "unexpected", "message": "Only blocked goals."}},
        {**GOOD, "phase": "blocked"},
        {**GOOD, "phase": "blocked", "blockedReason": None},
        {**GOOD, "phase": "blocked", "blockedReason": {"code": "a-b", "message": "V.", "x": 1}},
        {**GOOD, "phase": "blocked", "blockedReason": {"code": "NOT_CANONICAL", "message": "B."}},
        {**GOOD, "phase": "blocked", "blockedReason": {"code": "a-b\n", "message": "B."}},
        {**GOOD, "phase": "blocked", "blockedReason": {"code": "a-b", "message": " padded "}},
        {**GOOD, "revision": 0},
        {**GOOD, "revision": True},
        {**GOOD, "maxGoalRounds": -1},
        {**GOOD, "maxGoalRounds": 2**53},
    ],
)
def test_GL2_malformed_snapshots_are_refused(goal: Any) -> None:
    with pytest.raises(GoalReplayError):
        decode_change(change(goal=goal))


def test_GL2_other_values_are_not_goal_changes_and_integral_floats_are_integers() -> None:
    assert decode_change(None) is None
    assert decode_change({"kind": "other"}) is None
    decoded = decode_change(change(createdAt=10.0, updatedAt=12.0))
    assert decoded is not None and decoded["createdAt"] == 10 and type(decoded["createdAt"]) is int
    assert "has an invalid kind" in failure({"kind": "not-a-goal-change"})


# ------------------------------------------------------------------ GL-3


@pytest.mark.parametrize(
    "payload",
    [
        change(goal={**GOOD, "revision": 2}),
        change(goal={**GOOD, "phase": "paused"}),
        change(roundsStarted=1),
    ],
)
def test_GL3_create_needs_a_fresh_active_revision_one_goal(payload: dict[str, Any]) -> None:
    assert "goal create requires" in failure(payload)


def test_GL3_create_only_replaces_a_completed_goal_and_never_reuses_an_id() -> None:
    base = change()
    second = change(goal={**GOOD, "id": "goal-second"}, createdAt=20, updatedAt=20)
    assert "goal create requires" in failure(base, second)  # the first is still active
    complete = mutation(base, "complete", "complete")
    state, view = fold(base, complete, second)
    assert view["goal"]["id"] == "goal-second"
    assert state["seenGoalIds"] == ["goal-validation", "goal-second"]
    same_id = change(createdAt=20, updatedAt=20)
    assert "fresh active revision-one" in failure(base, complete, same_id)
    second_complete = mutation(second, "complete", "complete")
    again = change(createdAt=30, updatedAt=30)
    assert "fresh active revision-one" in failure(base, complete, second, second_complete, again)
    assert "fresh active revision-one" in failure(base, clear(GOOD["id"], 2, 11), same_id)


# ------------------------------------------------------------------ GL-4


def test_GL4_mutations_need_a_current_goal() -> None:
    base = change()
    assert "requires a current goal" in failure(mutation(base, "edit", "active"))


@pytest.mark.parametrize(
    "overrides",
    [
        {"goal": {**GOOD, "id": "goal-wrong", "revision": 2}},
        {"goal": {**GOOD, "revision": 3}},
        {"createdAt": 11},
        {"updatedAt": 9},
        {"roundsStarted": 1},
    ],
)
def test_GL4_a_mutation_advances_one_revision_and_keeps_counters(
    overrides: dict[str, Any],
) -> None:
    base = change()
    failure(base, mutation(base, "edit", "active", **overrides))


@pytest.mark.parametrize(
    ("operation", "phase", "goal"),
    [
        ("pause", "paused", {"objective": "changed illegally"}),
        ("pause", "paused", {"maxGoalRounds": 3}),
        ("edit", "paused", {}),
        ("pause", "active", {}),
        ("resume", "paused", {}),
        ("complete", "active", {}),
        ("block", "active", {}),
    ],
)
def test_GL4_lifecycle_transitions_follow_the_runtime(
    operation: str, phase: str, goal: dict[str, Any]
) -> None:
    base = change()
    bad = mutation(base, operation, phase)
    bad = {**bad, "goal": {**bad["goal"], **goal}}
    failure(base, bad)


def test_GL4_the_whole_lifecycle_folds_and_edit_may_change_the_definition() -> None:
    base = change()
    edited = mutation(base, "edit", "active")
    edited["goal"] = {**edited["goal"], "objective": "edited", "maxGoalRounds": 4}
    paused = mutation(edited, "pause", "paused")
    resumed = mutation(paused, "resume", "active")
    blocked = mutation(resumed, "block", "blocked")
    blocked_edit = mutation(blocked, "edit", "blocked")  # keeps the blocker
    resumed_again = mutation(blocked_edit, "resume", "active")
    done = mutation(resumed_again, "complete", "complete")
    state, view = fold(base, edited, paused, resumed, blocked, blocked_edit, resumed_again, done)
    assert state["failure"] is None
    assert view["goal"] == {
        "id": "goal-validation",
        "revision": 8,
        "objective": "edited",
        "phase": "complete",
        "maxGoalRounds": 4,
    }
    changed_blocker = mutation(blocked, "edit", "blocked")
    changed_blocker["goal"]["blockedReason"] = {"code": "other", "message": "Other."}
    assert "blocked reason" in failure(base, edited, paused, resumed, blocked, changed_blocker)


def test_GL4_resume_needs_round_budget() -> None:
    base = change()
    paused = mutation(base, "pause", "paused", roundsStarted=2)
    exhausted = mutation(paused, "resume", "active")
    message = failure(base, ("goal-validation", 1, 1), ("goal-validation", 1, 2), paused, exhausted)
    assert "exhausted round budget" in message


# ------------------------------------------------------------------ GL-5


def test_GL5_clear_tombstones_the_next_revision_and_keeps_seen_ids() -> None:
    base = change()
    state, view = fold(base, clear(GOOD["id"], 2, 20))
    assert view is None
    assert state == {"current": None, "seenGoalIds": ["goal-validation"], "failure": None}
    assert "requires a current goal" in failure(clear(GOOD["id"], 2, 12))
    assert "advance the current goal" in failure(base, clear(GOOD["id"], 3, 11))
    assert "timestamp cannot precede" in failure(base, clear(GOOD["id"], 2, 9))
    fresh = change(goal={**GOOD, "id": "goal-fresh"}, createdAt=30, updatedAt=30)
    _, view = fold(base, clear(GOOD["id"], 2, 20), fresh)
    assert view["goal"]["id"] == "goal-fresh"


# ------------------------------------------------------------------ GL-6


def test_GL6_goal_rounds_advance_rounds_started() -> None:
    base = change()
    state, view = fold(base, ("goal-validation", 1, 1), ("goal-validation", 1, 2))
    assert view["roundsStarted"] == 2 and state["failure"] is None


@pytest.mark.parametrize(
    ("rounds", "message"),
    [
        ([("goal-other", 1, 1)], "not the next admitted round"),
        ([("goal-validation", 2, 1)], "not the next admitted round"),
        ([("goal-validation", 1, 2)], "not the next admitted round"),
        (
            [("goal-validation", 1, 1), ("goal-validation", 1, 2), ("goal-validation", 1, 3)],
            "not the next admitted round",
        ),
        ([("goal-validation", 1, 0)], "goal message source is invalid"),
        ([("", 1, 1)], "goal message source is invalid"),
    ],
)
def test_GL6_a_round_must_be_the_next_of_the_active_goal(
    rounds: list[tuple[str, int, int]], message: str
) -> None:
    assert message in failure(change(), *rounds)


def test_GL6_a_round_without_a_goal_or_of_a_paused_goal_is_refused() -> None:
    assert "not the next admitted round" in failure(("goal-validation", 1, 1))
    base = change()
    paused = mutation(base, "pause", "paused")
    assert "not the next admitted round" in failure(base, paused, ("goal-validation", 2, 1))


# ------------------------------------------------------------------ GL-7


def test_GL7_the_first_failure_stops_the_replay_and_the_view_stays() -> None:
    base = change()
    broken = mutation(base, "edit", "active", createdAt=11)
    later = mutation(base, "pause", "paused")  # valid after base, but after the failure
    state, view = fold(base, broken, later)
    assert state["failure"].startswith("goal replay failed at session event 2: ")
    assert view["goal"]["revision"] == 1 and view["goal"]["phase"] == "active"
    GOAL.validate_state(state)


def test_GL7_checkpoint_rows_are_validated() -> None:
    state, _ = fold(change())
    GOAL.validate_state(state)
    with pytest.raises(ValueError, match="seen goal ids"):
        GOAL.validate_state({**state, "seenGoalIds": []})
    with pytest.raises(ValueError, match="precede"):
        GOAL.validate_state(
            {**state, "current": {**state["current"], "createdAt": 2, "updatedAt": 1}}
        )
    with pytest.raises(ValueError, match="unique"):
        GOAL.validate_state({**state, "seenGoalIds": ["goal-validation", "goal-validation"]})
