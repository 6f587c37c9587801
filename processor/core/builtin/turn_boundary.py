"""``turnBoundary``: where the open turn and the last step boundary are.

State and view (the same deep-frozen JSON object)::

    {"openTurnStartSeq": int | None,   # seq of the turn/start of the open turn
     "lastStepStartSeq": int | None,   # seq of the last step/start
     "lastStepBoundary": {"kind": "start" | "end", "seq": int,
                          "turn": int | None, "step": int | None} | None,
     "lastTurn": int | None}           # data.turn of the last turn/start

Why: a resumed agent must know whether it crashed inside a turn or a step
(it closes them before starting a new turn), and after a checkpoint restore
the log prefix holding those events may be gone, so the boundary keeps the
``turn``/``step`` numbers of the boundary event too (an addition to the
spec's ``{kind, seq}``).

Folds ``turn/start``, ``turn/end``, ``step/start`` and ``step/end``; every
other event returns the same object (P-1), and so does a ``turn/end`` when
no turn is open.  Non-integer ``turn``/``step`` values are recorded as null.
"""

from __future__ import annotations

from typing import Any

from processor.core.builtin._common import identity, is_int, require_dict, require_seq
from processor.core.events import Event
from processor.core.frozen import FrozenDict, freeze
from processor.core.log import SessionHeader
from processor.core.projections import ProjectionDefinition, WireView

KEY = "turnBoundary"
KEYS = ("openTurnStartSeq", "lastStepStartSeq", "lastStepBoundary", "lastTurn")


def init(header: SessionHeader, inherited: int) -> Any:
    return freeze({k: None for k in KEYS})


def _int_or_none(value: Any) -> int | None:
    return value if is_int(value) else None


def _field(event: Event, key: str) -> int | None:
    # Log-only data may be any JSON value in the runtime's logs, not only an object.
    data = event.data
    return _int_or_none(data.get(key)) if isinstance(data, dict) else None


def _boundary(kind: str, event: Event) -> FrozenDict:
    return FrozenDict(
        {
            "kind": kind,
            "seq": event.seq,
            "turn": _field(event, "turn"),
            "step": _field(event, "step"),
        }
    )


def apply(state: Any, event: Event) -> Any:
    # New states are built from the frozen old one and scalars/frozen parts:
    # nothing needs a deep freeze.
    t, seq = event.type, event.seq
    if t == "turn/start":
        return FrozenDict({**state, "openTurnStartSeq": seq, "lastTurn": _field(event, "turn")})
    if t == "turn/end":
        if state["openTurnStartSeq"] is None:
            return state
        return FrozenDict({**state, "openTurnStartSeq": None})
    if t == "step/start":
        return FrozenDict(
            {**state, "lastStepStartSeq": seq, "lastStepBoundary": _boundary("start", event)}
        )
    if t == "step/end":
        return FrozenDict({**state, "lastStepBoundary": _boundary("end", event)})
    return state


def apply_all(state: Any, events: list[Event]) -> Any:
    """:func:`apply` over ``events``: one new frozen state per batch (same keys, order, values)."""
    new: dict[str, Any] | None = None
    boundary: tuple[str, Event] | None = None  # the last step boundary, built once
    for event in events:
        t = event.type
        if t == "turn/start":
            if new is None:
                new = dict(state)
            new["openTurnStartSeq"] = event.seq
            new["lastTurn"] = _field(event, "turn")
        elif t == "turn/end":
            if (new if new is not None else state)["openTurnStartSeq"] is None:
                continue
            if new is None:
                new = dict(state)
            new["openTurnStartSeq"] = None
        elif t == "step/start" or t == "step/end":
            if new is None:
                new = dict(state)
            if t == "step/start":
                new["lastStepStartSeq"] = event.seq
                boundary = ("start", event)
            else:
                boundary = ("end", event)
    if new is None:
        return state
    if boundary is not None:
        new["lastStepBoundary"] = _boundary(boundary[0], boundary[1])
    return FrozenDict(new)


def validate(state: Any) -> None:
    require_dict(state, KEYS, "turnBoundary state")
    require_seq(state["openTurnStartSeq"], "turnBoundary.openTurnStartSeq")
    require_seq(state["lastStepStartSeq"], "turnBoundary.lastStepStartSeq")
    if state["lastTurn"] is not None and not is_int(state["lastTurn"]):
        raise ValueError("turnBoundary.lastTurn must be an integer or null")
    boundary = state["lastStepBoundary"]
    if boundary is None:
        return
    require_dict(boundary, ("kind", "seq"), "turnBoundary.lastStepBoundary")
    if boundary["kind"] not in ("start", "end"):
        raise ValueError("turnBoundary.lastStepBoundary.kind must be 'start' or 'end'")
    require_seq(boundary["seq"], "turnBoundary.lastStepBoundary.seq", optional=False)


TURN_BOUNDARY = ProjectionDefinition(
    key=KEY,
    state_version=2,
    init=init,
    apply=apply,
    validate_state=validate,
    wire=WireView(view=identity, validate_view=validate),
    event_types=frozenset({"turn/start", "turn/end", "step/start", "step/end"}),
    apply_all=apply_all,
)
