"""``toolHistory`` (H-5): the tool declarations a provider must replay.

State::

    {"baselineSeq": int | None,          # header that started the series
     "baseline": [tool, ...],            # its tools
     "headers": {"<seq>": [tool, ...]},  # tools of every header, by seq
     "declared": {name: tool},           # every definition declared in the series
     "available": [name, ...],           # baseline names + additions - removals
     "active": [tool, ...],              # tools of the latest header
     "updates": [{"seq", "added": [tool], "removed": [name]}]}

A new series (baseline = this header, no updates) starts when there is no
baseline, the header's reason is ``series``, ``startsSeries`` is set, or a
declared name comes back with a different definition (a provider must not
reuse a prefix that declared the old schema).  Removing a tool never erases
its declared definition.

View: ``{"baselineSeq", "tools": baseline, "updates"}``; when the active
names differ from the available set (old logs without developer updates) it
falls back to ``{"baselineSeq", "tools": active, "updates": []}``.
"""

from __future__ import annotations

from typing import Any

from processor.core.builtin._common import require_dict
from processor.core.errors import ProjectionError
from processor.core.events import Event
from processor.core.log import SessionHeader
from processor.core.projections import ProjectionDefinition, WireView

KEYS = ("baselineSeq", "baseline", "headers", "declared", "available", "active", "updates")


def init(header: SessionHeader, inherited: int) -> dict[str, Any]:
    return {"baselineSeq": None, "baseline": [], "headers": {}, "declared": {},
            "available": [], "active": [], "updates": []}


def _on_header(state: dict[str, Any], event: Event) -> dict[str, Any]:
    tools = list(event.data["header"].get("tools") or [])
    headers = {**state["headers"], str(event.seq): tools}
    declared = state["declared"]
    redefined = any(t["name"] in declared and declared[t["name"]] != t for t in tools)
    if (state["baselineSeq"] is None or event.data.get("reason") == "series"
            or event.data.get("startsSeries") is True or redefined):
        return {"baselineSeq": event.seq, "baseline": tools, "headers": headers,
                "declared": {t["name"]: t for t in tools},
                "available": [t["name"] for t in tools], "active": tools, "updates": []}
    return {**state, "headers": headers, "active": tools}


def _on_developer(state: dict[str, Any], event: Event) -> dict[str, Any]:
    blocks = [b for b in event.data["message"]["content"]
              if isinstance(b, dict) and b.get("type") in ("tool-addition", "tool-removal")]
    if not blocks:
        return state
    declared = dict(state["declared"])
    available = list(state["available"])
    added: list[Any] = []
    removed: list[str] = []
    header_tools = state["headers"].get(str(event.data.get("headerSeq")), [])
    for block in blocks:
        name = block["toolName"]
        if block["type"] == "tool-addition":
            match = [t for t in header_tools if t.get("name") == name]
            if len(match) != 1:
                raise ProjectionError(event.seq, "H-5", f"toolHistory: addition {name!r} not "
                                      f"found in header {event.data.get('headerSeq')}")
            declared[name] = match[0]
            added.append(match[0])
            if name not in available:
                available.append(name)
        else:
            removed.append(name)
            if name in available:
                available.remove(name)
    update = {"seq": event.seq, "added": added, "removed": removed}
    return {**state, "declared": declared, "available": available,
            "updates": [*state["updates"], update]}


def apply(state: dict[str, Any], event: Event) -> dict[str, Any]:
    if event.type == "request/header":
        return _on_header(state, event)
    if event.type == "developer/message":
        return _on_developer(state, event)
    return state


def view(state: dict[str, Any]) -> dict[str, Any]:
    active_names = sorted(t["name"] for t in state["active"])
    if active_names != sorted(state["available"]):
        return {"baselineSeq": state["baselineSeq"], "tools": state["active"], "updates": []}
    return {"baselineSeq": state["baselineSeq"], "tools": state["baseline"],
            "updates": state["updates"]}


def validate(state: Any) -> None:
    require_dict(state, KEYS, "toolHistory state")


def validate_view(value: Any) -> None:
    require_dict(value, ("baselineSeq", "tools", "updates"), "toolHistory view")


TOOL_HISTORY = ProjectionDefinition(
    key="toolHistory", state_version=1, init=init, apply=apply, validate_state=validate,
    wire=WireView(view=view, validate_view=validate_view))
