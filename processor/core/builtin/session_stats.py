"""``sessionStats``: counters for dashboards.

State and view (the same deep-frozen JSON object)::

    {"turns": int,          # turn/start events
     "steps": int,          # step/start events
     "toolCalls": int,      # tool/call events
     "toolErrors": int,     # appended tool/result events carrying data.error
     "attempts": int,       # assistant/attempt events (failed model calls, F-3)
     "retries": int,        # llm/retry events
     "replacements": int,   # surface events with a replace surfaceOp (compactions, rewrites)
     "messages": {role: int},   # appended surface events by message role
     "usage": {field: number}}  # sums of every numeric top-level field of
                                # data.usage of appended assistant/message events

Decisions: counts are of events in the log, so a compaction never uncounts
anything; a *replacement* surface event (``surfaceOp.op == "replace"``) is
counted in ``replacements`` only — it rewrites what was already counted (a
tool/result rewrite keeps its ``error`` by S-5 and must not count twice).
Usage values that are not numbers (booleans included) and nested objects
are ignored.  Every event outside these rules returns the same object (P-1).
"""

from __future__ import annotations

from typing import Any, Final

from processor.core.builtin._common import identity, is_int, is_number, require_dict
from processor.core.events import SURFACE_TYPES, Event
from processor.core.frozen import FrozenDict, freeze
from processor.core.log import SessionHeader
from processor.core.projections import ProjectionDefinition, WireView

KEY = "sessionStats"
COUNTERS = {
    "turn/start": "turns",
    "step/start": "steps",
    "tool/call": "toolCalls",
    "assistant/attempt": "attempts",
    "llm/retry": "retries",
}
INT_KEYS = ("turns", "steps", "toolCalls", "toolErrors", "attempts", "retries", "replacements")
KEYS = (*INT_KEYS, "messages", "usage")
# writes into a FrozenDict this module has just copied and not yet returned
_set = dict.__setitem__


def init(header: SessionHeader, inherited: int) -> Any:
    return freeze({**{k: 0 for k in INT_KEYS}, "messages": {}, "usage": {}})


def apply(state: Any, event: Event) -> Any:
    # The state is deep-frozen and every changed value is a number or a frozen
    # dict of numbers, so each new state is a copy of the old one with the
    # changed keys written in (freezing the whole state again per event was the
    # unit's main cost).  The copy is ``FrozenDict(old)`` (dict's own copy of a
    # dict) and the writes go through ``dict.__setitem__`` before anyone else
    # holds the new object; ``FrozenDict({**old, k: v})`` built and copied a
    # second dict per state, the ``messages`` one and an argument dict on top.
    # Key order is the same both ways (existing keys keep their place).
    t = event.type
    counter = COUNTERS.get(t)
    if counter is not None:
        new = FrozenDict(state)
        _set(new, counter, state[counter] + 1)
        return new
    if t not in SURFACE_TYPES:
        return state
    if event.surface_op != "append":
        new = FrozenDict(state)
        _set(new, "replacements", state["replacements"] + 1)
        return new
    data = event.data
    if t == "tool/result":
        role: Any = "tool"  # a v3 tool result is a user-role message; count it as a tool result
    else:
        # event.message, inline (a surface event; user/message data is the message)
        if t == "user/message":
            message = data
        else:
            message = data.get("message") if isinstance(data, dict) else None
        role = message.get("role") if isinstance(message, dict) else None
        if not isinstance(role, str):
            return state
    messages = state["messages"]
    counts = FrozenDict(messages)
    _set(counts, role, messages.get(role, 0) + 1)
    new = FrozenDict(state)
    _set(new, "messages", counts)
    if t == "tool/result":
        if "error" in data:
            _set(new, "toolErrors", state["toolErrors"] + 1)
    elif t == "assistant/message":
        usage = data.get("usage")
        if isinstance(usage, dict):
            summed = FrozenDict(state["usage"])
            for k, v in usage.items():
                kind = type(v)  # is_number's exact-type test, inline (per usage field)
                if kind is int or kind is float or is_number(v):
                    _set(summed, k, summed.get(k, 0) + v)
            _set(new, "usage", summed)
    return new


def _add_usage(usage: dict[str, Any], fields: dict[str, Any]) -> None:
    for k, v in fields.items():
        kind = type(v)
        if kind is int or kind is float or is_number(v):
            usage[k] = usage.get(k, 0) + v


#: :func:`apply_all`'s one lookup per event: the index in ``INT_KEYS`` a type
#: counts into, or ``_SURFACE`` for a surface type (a counter type wins, as in
#: :func:`apply`); absent: the type changes nothing
_SURFACE: Final = -1
_CODE: Final[dict[str, int]] = {
    **{t: _SURFACE for t in SURFACE_TYPES},
    **{t: INT_KEYS.index(c) for t, c in COUNTERS.items()},
}
_REPLACEMENTS: Final = INT_KEYS.index("replacements")
_TOOL_ERRORS: Final = INT_KEYS.index("toolErrors")


def apply_all(state: Any, events: list[Event]) -> Any:
    """:func:`apply` over ``events`` in one pass: one new frozen state per batch.

    The same rules, counted into a list of per-key increments and plain copies
    of ``messages``/``usage`` made at their first change, frozen once at the
    end; keys keep their places and new roles/usage fields are added in the
    order ``apply`` would add them, sums are added in the same order, so the
    result equals the per-event fold.  Nothing changed: the same object.
    (Per event this is one dict lookup and a list write, where the copied
    state took a lookup, a read and a write of the state dict per counter.)
    """
    added = [0] * len(INT_KEYS)
    changed = False
    messages: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    for event in events:
        t = event.type
        code = _CODE.get(t)
        if code is None:
            continue
        if code != _SURFACE:
            added[code] += 1
            changed = True
            continue
        op = event.surface_op
        if not (isinstance(op, str) and op == "append"):  # compiled: a str compare
            added[_REPLACEMENTS] += 1
            changed = True
            continue
        data = event.data
        # the counted message role, as apply finds it (a v3 tool result is a
        # user-role message; it counts as a tool result)
        if t == "tool/result":
            role: Any = "tool"
        else:
            message = (
                data
                if t == "user/message"
                else data.get("message")
                if isinstance(data, dict)
                else None
            )
            role = message.get("role") if isinstance(message, dict) else None
            if not isinstance(role, str):
                continue
        changed = True
        if messages is None:
            messages = dict(state["messages"])
        messages[role] = messages.get(role, 0) + 1
        if t == "tool/result":
            if "error" in data:
                added[_TOOL_ERRORS] += 1
        elif t == "assistant/message":
            fields = data.get("usage")
            if isinstance(fields, dict):
                if usage is None:
                    usage = dict(state["usage"])
                _add_usage(usage, fields)
    if not changed:
        return state
    new = dict(state)
    for i, key in enumerate(INT_KEYS):
        if added[i]:
            new[key] += added[i]
    if messages is not None:
        new["messages"] = FrozenDict(messages)
    if usage is not None:
        new["usage"] = FrozenDict(usage)
    return FrozenDict(new)


def validate(state: Any) -> None:
    require_dict(state, KEYS, "sessionStats state")
    for k in INT_KEYS:
        if not is_int(state[k]) or state[k] < 0:
            raise ValueError(f"sessionStats.{k} must be a non-negative integer")
    require_dict(state["messages"], (), "sessionStats.messages")
    if not all(is_int(v) for v in state["messages"].values()):
        raise ValueError("sessionStats.messages counts must be integers")
    require_dict(state["usage"], (), "sessionStats.usage")
    if not all(is_number(v) for v in state["usage"].values()):
        raise ValueError("sessionStats.usage sums must be numbers")


SESSION_STATS = ProjectionDefinition(
    key=KEY,
    state_version=3,
    init=init,
    apply=apply,
    validate_state=validate,
    wire=WireView(view=identity, validate_view=validate),
    event_types=frozenset(COUNTERS) | SURFACE_TYPES,
    apply_all=apply_all,
)
