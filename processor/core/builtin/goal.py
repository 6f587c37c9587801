"""``goal``: the runtime's same-session goal, folded from ``goal/change`` events.

The runtime's goal service writes every mutation of a session's goal as one
``goal/change`` event carrying the complete post-change value (a snapshot) or
a clear tombstone, and attributes each automatic continuation round to the
goal with a ``user/message`` whose source is
``{kind: "goal", goalId, revision, round}``.  Its ``goal`` projection unit
(stateVersion 6) replays them through strict rules; this unit applies the
same rules (docs/projection-rules.md, rules GL-1..GL-7)::

    snapshot: {kind: "goal/change", version: 1,
               operation: create|edit|pause|resume|complete|block,
               goal: {id, revision, objective, phase, maxGoalRounds,
                      blockedReason?: {code, message}},
               roundsStarted, createdAt, updatedAt}
    clear:    {kind: "goal/change", version: 1, operation: "clear",
               cleared: {id, revision}, clearedAt}

State::

    {"current": {"goal": snapshot, "roundsStarted", "createdAt", "updatedAt"} | None,
     "seenGoalIds": [id, ...], "failure": str | None}

View: ``current`` (``None`` before the first create and after a clear).  The
first event that breaks a rule is kept in ``failure`` (naming its seq) and
every later event is ignored: the view stays at the last valid goal, as the
runtime's does (GL-7).
"""

from __future__ import annotations

import re
from typing import Any, Final

from processor.core.builtin._common import require_dict
from processor.core.errors import InvalidInput
from processor.core.events import Event, safe_int
from processor.core.frozen import freeze
from processor.core.log import SessionHeader
from processor.core.projections import ProjectionDefinition, WireView

KEY: Final = "goal"
CHANGE_VERSION: Final = 1
PHASES: Final = ("active", "paused", "blocked", "complete")
SNAPSHOT_OPERATIONS: Final = frozenset({"create", "edit", "pause", "resume", "complete", "block"})
_SNAPSHOT_KEYS: Final = frozenset(
    {"kind", "version", "operation", "goal", "roundsStarted", "createdAt", "updatedAt"}
)
_CLEAR_KEYS: Final = frozenset({"kind", "version", "operation", "cleared", "clearedAt"})
_GOAL_KEYS: Final = frozenset({"id", "revision", "objective", "phase", "maxGoalRounds"})
_CODE: Final = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
# The characters JavaScript's String.prototype.trim removes (WhiteSpace and
# LineTerminator); Python's str.strip set differs (it has \x1c-\x1f, not \ufeff).
_JS_SPACE: Final = (
    "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
)

_INIT: Final[Any] = freeze({"current": None, "seenGoalIds": [], "failure": None})


class GoalReplayError(InvalidInput, ValueError):
    """One event breaks the goal stream's rules (kept in the state's ``failure``, never raised
    out of the unit)."""


def _js_trim(text: str) -> str:
    return text.strip(_JS_SPACE)


def _integer(value: Any) -> int | None:
    """``value`` as a JavaScript safe integer (``events.safe_int``), ``-0.0`` included:
    the unit's checks are ``Number.isSafeInteger``, which holds for -0 (the
    envelope's seq check refuses it on its own)."""
    return 0 if isinstance(value, float) and value == 0 else safe_int(value)


def _positive(value: Any, field: str) -> int:
    n = _integer(value)
    if n is None or n < 1:
        raise GoalReplayError(f"goal change {field} must be a positive safe integer")
    return n


def _non_negative(value: Any, field: str) -> int:
    n = _integer(value)
    if n is None or n < 0:
        raise GoalReplayError(f"goal change {field} must be a non-negative safe integer")
    return n


def _normalized_text(value: Any) -> bool:
    return isinstance(value, str) and value != "" and _js_trim(value) == value


# ------------------------------------------------------------------ decoding (GL-2)


def _block_reason(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or set(value) != {"code", "message"}:
        raise GoalReplayError("goal change goal.blockedReason must have exactly code and message")
    code, message = value["code"], value["message"]
    if not isinstance(code, str) or _CODE.fullmatch(code) is None:
        raise GoalReplayError("goal change goal.blockedReason.code must be lower-kebab-case")
    if not _normalized_text(message):
        raise GoalReplayError(
            "goal change goal.blockedReason.message must be non-empty and trimmed"
        )
    return {"code": code, "message": message}


def _snapshot(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise GoalReplayError("goal change goal must be an object")
    goal_id = value.get("id")
    if not isinstance(goal_id, str) or not goal_id:
        raise GoalReplayError("goal change goal.id must be a non-empty string")
    if not _normalized_text(value.get("objective")):
        raise GoalReplayError("goal change goal.objective must be non-empty and trimmed")
    phase = value.get("phase")
    if phase not in PHASES:
        raise GoalReplayError("goal change goal.phase is invalid")
    keys = _GOAL_KEYS | {"blockedReason"} if phase == "blocked" else _GOAL_KEYS
    if set(value) != keys:
        raise GoalReplayError(
            f"goal change goal in phase {phase} must have exactly {','.join(sorted(keys))}"
        )
    snapshot: dict[str, Any] = {
        "id": goal_id,
        "revision": _positive(value["revision"], "goal.revision"),
        "objective": value["objective"],
        "phase": phase,
        "maxGoalRounds": _positive(value["maxGoalRounds"], "goal.maxGoalRounds"),
    }
    if phase == "blocked":
        snapshot["blockedReason"] = _block_reason(value["blockedReason"])
    return snapshot


def decode_change(value: Any) -> dict[str, Any] | None:
    """A ``goal/change`` payload, checked and normalized; None when it is not one (GL-2)."""
    if not isinstance(value, dict) or value.get("kind") != "goal/change":
        return None
    version = value.get("version")
    if _integer(version) != CHANGE_VERSION:
        raise GoalReplayError(f"unsupported goal change version {version!r}")
    operation = value.get("operation")
    if operation == "clear":
        if set(value) != _CLEAR_KEYS:
            raise GoalReplayError(
                f"goal clear change must have exactly {','.join(sorted(_CLEAR_KEYS))}"
            )
        ref = value["cleared"]
        if not isinstance(ref, dict) or set(ref) != {"id", "revision"}:
            raise GoalReplayError("goal clear tombstone must have exactly id and revision")
        if not isinstance(ref["id"], str) or not ref["id"]:
            raise GoalReplayError("goal clear tombstone id must be a non-empty string")
        return {
            "operation": "clear",
            "cleared": {
                "id": ref["id"],
                "revision": _positive(ref["revision"], "cleared.revision"),
            },
            "clearedAt": _non_negative(value["clearedAt"], "clearedAt"),
        }
    if operation not in SNAPSHOT_OPERATIONS:
        raise GoalReplayError("goal change operation is invalid")
    if set(value) != _SNAPSHOT_KEYS:
        raise GoalReplayError(
            f"goal snapshot change must have exactly {','.join(sorted(_SNAPSHOT_KEYS))}"
        )
    created = _non_negative(value["createdAt"], "createdAt")
    updated = _non_negative(value["updatedAt"], "updatedAt")
    if updated < created:
        raise GoalReplayError("goal change updatedAt cannot precede createdAt")
    return {
        "operation": operation,
        "goal": _snapshot(value["goal"]),
        "roundsStarted": _non_negative(value["roundsStarted"], "roundsStarted"),
        "createdAt": created,
        "updatedAt": updated,
    }


# ------------------------------------------------------------------ the fold


class _Fold:
    """The mutable replay accumulator for one event (built from the state)."""

    __slots__ = ("created", "goal", "rounds", "seen", "updated")

    def __init__(self, state: Any) -> None:
        current = state["current"]
        self.goal: Any = current["goal"] if current is not None else None
        self.rounds: int = current["roundsStarted"] if current is not None else 0
        self.created: int | None = current["createdAt"] if current is not None else None
        self.updated: int | None = current["updatedAt"] if current is not None else None
        self.seen: list[str] = list(state["seenGoalIds"])

    def state(self) -> Any:
        current = None
        if self.goal is not None:
            current = {
                "goal": self.goal,
                "roundsStarted": self.rounds,
                "createdAt": self.created,
                "updatedAt": self.updated,
            }
        return freeze({"current": current, "seenGoalIds": self.seen, "failure": None})

    def next_revision(self, ref: Any, operation: str) -> None:
        if ref["id"] != self.goal["id"] or ref["revision"] != self.goal["revision"] + 1:
            raise GoalReplayError(f"goal {operation} must advance the current goal by one revision")

    def clear(self, change: dict[str, Any]) -> None:  # GL-5
        if self.goal is None:
            raise GoalReplayError("goal clear requires a current goal")
        self.next_revision(change["cleared"], "clear")
        if self.updated is None or change["clearedAt"] < self.updated:
            raise GoalReplayError("goal clear timestamp cannot precede the current goal update")
        self.goal, self.rounds, self.created, self.updated = None, 0, None, None

    def create(self, change: dict[str, Any]) -> None:  # GL-3
        goal = change["goal"]
        if (
            goal["revision"] != 1
            or goal["phase"] != "active"
            or change["roundsStarted"] != 0
            or (self.goal is not None and self.goal["phase"] != "complete")
            or goal["id"] in self.seen
        ):
            raise GoalReplayError(
                "goal create requires a fresh active revision-one goal with zero rounds"
            )
        self.seen.append(goal["id"])

    def mutate(self, change: dict[str, Any]) -> None:  # GL-4
        operation, current, goal = change["operation"], self.goal, change["goal"]
        if current is None:
            raise GoalReplayError(f"goal {operation} requires a current goal")
        self.next_revision(goal, operation)
        if (
            change["createdAt"] != self.created
            or self.updated is None
            or change["updatedAt"] < self.updated
            or change["roundsStarted"] != self.rounds
        ):
            raise GoalReplayError(
                f"goal {operation} does not preserve the current counters and timestamps"
            )
        if operation == "edit":
            if goal["phase"] != current["phase"] or goal.get("blockedReason") != current.get(
                "blockedReason"
            ):
                raise GoalReplayError("goal edit cannot change phase or blocked reason")
            return
        if (
            goal["objective"] != current["objective"]
            or goal["maxGoalRounds"] != current["maxGoalRounds"]
        ):
            raise GoalReplayError(f"goal {operation} cannot change objective or maxGoalRounds")
        before, after = current["phase"], goal["phase"]
        allowed = {
            "pause": before == "active" and after == "paused",
            "resume": before != "complete" and after == "active",
            "complete": before != "complete" and after == "complete",
            "block": before == "active" and after == "blocked",
        }[operation]
        if not allowed:
            raise GoalReplayError(f"goal {operation} has an invalid phase transition")
        if operation == "resume" and self.rounds >= goal["maxGoalRounds"]:
            raise GoalReplayError("goal resume has an exhausted round budget")

    def change(self, event: Event) -> None:
        change = decode_change(event.data)
        if change is None:
            raise GoalReplayError(f"goal change at session event {event.seq} has an invalid kind")
        if change["operation"] == "clear":
            self.clear(change)
            return
        if change["operation"] == "create":
            self.create(change)
        else:
            self.mutate(change)
        self.goal = change["goal"]
        self.rounds = change["roundsStarted"]
        self.created = change["createdAt"]
        self.updated = change["updatedAt"]

    def round(self, event: Event, source: Any) -> None:  # GL-6
        goal_id = source.get("goalId")
        revision, number = _integer(source.get("revision")), _integer(source.get("round"))
        if (
            not isinstance(goal_id, str)
            or not goal_id
            or revision is None
            or revision < 1
            or number is None
            or number < 1
        ):
            raise GoalReplayError("goal message source is invalid")
        goal = self.goal
        if (
            goal is None
            or goal["phase"] != "active"
            or goal_id != goal["id"]
            or revision != goal["revision"]
            or number != self.rounds + 1
            or number > goal["maxGoalRounds"]
        ):
            raise GoalReplayError(
                f"goal round at session event {event.seq} is not the next admitted round "
                "of the active goal"
            )
        self.rounds = number


def _goal_source(event: Event) -> Any:
    """The source of a goal-attributed ``user/message``, or None."""
    data = event.data
    source = data.get("source") if isinstance(data, dict) else None
    return source if isinstance(source, dict) and source.get("kind") == "goal" else None


def init(header: SessionHeader, inherited: int) -> Any:
    return _INIT


def apply(state: Any, event: Event) -> Any:
    if state["failure"] is not None:  # GL-7: the first failure stops the replay
        return state
    source = None
    if event.type == "user/message":
        source = _goal_source(event)
        if source is None:
            return state
    elif event.type != "goal/change":
        return state
    fold = _Fold(state)
    try:
        if source is None:
            fold.change(event)
        else:
            fold.round(event, source)
    except GoalReplayError as error:
        return freeze(
            {**state, "failure": f"goal replay failed at session event {event.seq}: {error}"}
        )
    return fold.state()


# ------------------------------------------------------------------ validators


def _validate_current(current: Any) -> None:
    require_dict(current, ("goal", "roundsStarted", "createdAt", "updatedAt"), "goal.current")
    goal = current["goal"]
    require_dict(
        goal, ("id", "revision", "objective", "phase", "maxGoalRounds"), "goal.current.goal"
    )
    if not isinstance(goal["id"], str) or not goal["id"]:
        raise ValueError("goal id must be a non-empty string")
    if not isinstance(goal["objective"], str) or not goal["objective"]:
        raise ValueError("goal objective must be a non-empty string")
    if goal["phase"] not in PHASES:
        raise ValueError("goal phase is invalid")
    for field in ("revision", "maxGoalRounds"):
        n = _integer(goal[field])
        if n is None or n < 1:
            raise ValueError(f"goal {field} must be a positive integer")
    reason = goal.get("blockedReason")
    if reason is not None and not (
        isinstance(reason, dict)
        and isinstance(reason.get("code"), str)
        and isinstance(reason.get("message"), str)
    ):
        raise ValueError("goal blockedReason must be {code, message}")
    n = _integer(current["roundsStarted"])
    if n is None or n < 0:
        raise ValueError("goal roundsStarted must be a non-negative integer")
    for field in ("createdAt", "updatedAt"):
        if isinstance(current[field], bool) or not isinstance(current[field], int | float):
            raise ValueError(f"goal {field} must be a number")


def validate_view(view: Any) -> None:
    if view is not None:
        _validate_current(view)


def validate_state(state: Any) -> None:
    require_dict(state, ("current", "seenGoalIds", "failure"), "goal state")
    seen = state["seenGoalIds"]
    if not isinstance(seen, list) or not all(isinstance(i, str) and i for i in seen):
        raise ValueError("goal seenGoalIds must be a list of non-empty strings")
    if len(set(seen)) != len(seen):
        raise ValueError("goal seenGoalIds must be unique")
    failure = state["failure"]
    if failure is not None and (not isinstance(failure, str) or not failure):
        raise ValueError("goal failure must be a non-empty string or null")
    current = state["current"]
    if current is None:
        return
    validate_view(current)
    if current["goal"]["id"] not in seen:
        raise ValueError("the current goal id must be among the seen goal ids")
    if current["updatedAt"] < current["createdAt"]:
        raise ValueError("the current goal's update cannot precede its creation")


def view(state: Any) -> Any:
    return state["current"]


GOAL = ProjectionDefinition(
    key=KEY,
    state_version=6,
    init=init,
    apply=apply,
    validate_state=validate_state,
    wire=WireView(view=view, validate_view=validate_view),
    event_types=frozenset({"goal/change", "user/message"}),
)
