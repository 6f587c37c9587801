"""``turnBoundary``: where the open turn and the last step boundary are.

State and view (plain JSON)::

    {"openTurnStartSeq": int | None,   # seq of the turn/start of the open turn
     "lastStepStartSeq": int | None,   # seq of the last step/start
     "lastStepBoundary": {"kind": "start" | "end", "seq": int} | None,
     "lastTurn": int | None}           # data.turn of the last turn/start

A resumed agent uses it to know whether it crashed inside a turn or a step.
"""

from __future__ import annotations

from typing import Any

from processor.core.builtin._common import identity, require_dict
from processor.core.events import Event
from processor.core.log import SessionHeader
from processor.core.projections import ProjectionDefinition, WireView

KEYS = ("openTurnStartSeq", "lastStepStartSeq", "lastStepBoundary", "lastTurn")


def init(header: SessionHeader, inherited: int) -> dict[str, Any]:
    return {k: None for k in KEYS}


def apply(state: dict[str, Any], event: Event) -> dict[str, Any]:
    t, seq = event.type, event.seq
    if t == "turn/start":
        return {**state, "openTurnStartSeq": seq, "lastTurn": event.data.get("turn")}
    if t == "turn/end":
        return {**state, "openTurnStartSeq": None}
    if t == "step/start":
        return {**state, "lastStepStartSeq": seq,
                "lastStepBoundary": {"kind": "start", "seq": seq}}
    if t == "step/end":
        return {**state, "lastStepBoundary": {"kind": "end", "seq": seq}}
    return state


def validate(state: Any) -> None:
    require_dict(state, KEYS, "turnBoundary state")
    boundary = state["lastStepBoundary"]
    if boundary is not None and (not isinstance(boundary, dict)
                                 or boundary.get("kind") not in ("start", "end")):
        raise ValueError("turnBoundary.lastStepBoundary must be {kind, seq} or null")


TURN_BOUNDARY = ProjectionDefinition(
    key="turnBoundary", state_version=1, init=init, apply=apply, validate_state=validate,
    wire=WireView(view=identity, validate_view=validate))
