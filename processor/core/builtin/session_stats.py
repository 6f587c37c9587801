"""``sessionStats``: counters for dashboards.

State and view::

    {"turns": int, "steps": int, "toolCalls": int, "toolErrors": int,
     "attempts": int, "retries": int,
     "messages": {role: count},          # surface events by message role
     "usage": {field: sum}}              # every numeric field of assistant usage

Counts are of events in the log (a compaction does not uncount).
"""

from __future__ import annotations

from typing import Any

from processor.core.builtin._common import identity, require_dict
from processor.core.events import SURFACE_TYPES, Event
from processor.core.log import SessionHeader
from processor.core.projections import ProjectionDefinition, WireView

COUNTERS = {"turn/start": "turns", "step/start": "steps", "tool/call": "toolCalls",
            "assistant/attempt": "attempts", "llm/retry": "retries"}
KEYS = ("turns", "steps", "toolCalls", "toolErrors", "attempts", "retries", "messages", "usage")


def init(header: SessionHeader, inherited: int) -> dict[str, Any]:
    return {"turns": 0, "steps": 0, "toolCalls": 0, "toolErrors": 0, "attempts": 0,
            "retries": 0, "messages": {}, "usage": {}}


def _num(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def apply(state: dict[str, Any], event: Event) -> dict[str, Any]:
    t = event.type
    counter = COUNTERS.get(t)
    if counter is not None:
        return {**state, counter: state[counter] + 1}
    if t not in SURFACE_TYPES:
        return state
    role = event.message["role"]
    new = {**state, "messages": {**state["messages"],
                                 role: state["messages"].get(role, 0) + 1}}
    if t == "tool/result" and "error" in event.data:
        new["toolErrors"] = state["toolErrors"] + 1
    usage = event.data.get("usage") if t == "assistant/message" else None
    if isinstance(usage, dict):
        summed = dict(state["usage"])
        for k, v in usage.items():
            if _num(v):
                summed[k] = summed.get(k, 0) + v
        new["usage"] = summed
    return new


def validate(state: Any) -> None:
    require_dict(state, KEYS, "sessionStats state")


SESSION_STATS = ProjectionDefinition(
    key="sessionStats", state_version=1, init=init, apply=apply, validate_state=validate,
    wire=WireView(view=identity, validate_view=validate))
