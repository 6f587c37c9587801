"""``toolHistory`` (H-5): the tool declarations a provider must replay.

A provider that keeps a cached request prefix needs the tools of the request
that *started* the series (the baseline) plus every later addition/removal,
in log order — not just the current tool set (the history and
``request.tools`` are not interchangeable).

State (deep-frozen JSON)::

    {"headers": {"<seq>": [tool, ...]},  # tools of every request/header that has tools
     "activeSeq": int | None,            # seq of the latest request/header
     "declared": {name: tool},           # every definition declared in the series
     "available": [name, ...],           # baseline names + additions - removals
     "series": {"baselineSeq": int | None, "tools": [tool, ...], "updates": [update]},
     "fallback": None | {"baselineSeq": int | None, "tools": [tool, ...], "updates": []}}

    update = {"seq": int, "messageId": str | None, "added": [tool, ...], "removed": [name, ...]}

View (what is published and what a provider reads)::

    {"baselineSeq": int | None, "tools": [tool, ...], "updates": [update, ...]}

which is ``series`` — the baseline header's tools and the developer updates
since — or, when the active header's tool names differ from the available
set (old logs that changed tools without developer updates), ``fallback``:
the active header's tools with no updates.  Before any header the view is
``{"baselineSeq": None, "tools": [], "updates": []}``.

Folding:

* ``request/header``: record the header's tools by seq and make them active.
  A new series (baseline = this header, declarations = its tools, no
  updates) starts when there is no baseline yet, ``reason`` is ``series``,
  ``data.startsSeries`` is true, or a declared name (removed ones included)
  comes back with a different definition — a provider must not reuse a
  prefix that declared the old schema.
* ``developer/message`` with ``tool-addition``/``tool-removal`` blocks:
  each addition is resolved from the tools of the header at ``headerSeq``
  (exactly one tool of that name, else :class:`ProjectionError` rule H-5 —
  D-3 checks this on append, but a unit must not trust that its input was
  validated), marked declared and made available; a removal makes the name
  unavailable but never erases its declared definition.  One update per
  message, in block order.
* every other ``developer/message`` appends an empty update too: the
  runtime's update list mirrors the developer messages of the series
  (issue 17 item 12), and a provider replaying it must see the same list.
* "a different definition" is a different JSON text (``js_json``, as the
  runtime's ``JSON.stringify``): key order matters, ``1`` equals ``1.0``.

Why ``series`` and ``fallback`` live in the state: the view must keep its
object identity when nothing visible changed (P-1), e.g. on a ``resume``
header with the same tools, even though the state itself changes (the new
header is recorded by seq).  Storing the view parts lets ``view`` return an
existing object instead of building an equal new one.
"""

from __future__ import annotations

from typing import Any

import orjson

from processor.core.builtin._common import is_int, require_dict, require_list, require_seq
from processor.core.errors import ProjectionError
from processor.core.events import Event
from processor.core.frozen import FrozenDict, freeze
from processor.core.header import js_json
from processor.core.log import SessionHeader
from processor.core.projections import ProjectionDefinition, WireView

KEY = "toolHistory"
KEYS = ("headers", "activeSeq", "declared", "available", "series", "fallback")
VIEW_KEYS = ("baselineSeq", "tools", "updates")
# writes into a FrozenDict this module has just copied and not yet returned
_set = dict.__setitem__


def init(header: SessionHeader, inherited: int) -> Any:
    return freeze(
        {
            "headers": {},
            "activeSeq": None,
            "declared": {},
            "available": [],
            "series": {"baselineSeq": None, "tools": [], "updates": []},
            "fallback": None,
        }
    )


def _active_tools(state: Any) -> Any:
    seq = state["activeSeq"]
    return state["headers"].get(str(seq), []) if seq is not None else []


def _with_fallback(state: dict[str, Any], previous: Any) -> Any:
    """Set ``fallback`` (reusing the previous object when equal, P-1) and freeze."""
    active = _active_tools(state)
    names = {t.get("name") for t in active}
    if names == set(state["available"]):
        state["fallback"] = None
    else:
        baseline = state["series"]["baselineSeq"]
        if (
            previous is not None
            and previous["baselineSeq"] == baseline
            and previous["tools"] == active
        ):
            state["fallback"] = previous
        else:
            state["fallback"] = {"baselineSeq": baseline, "tools": active, "updates": []}
    return freeze(state)


def _js_exact(value: Any) -> bool:
    """No float and no integer beyond 2**53 inside: ``js_json`` of it determines it.

    Such a value's JS text parses back to the very value (strings, exact
    integers, booleans, null, key order), so two of them with different
    orjson bytes (a different value, type or key order) have different JS texts.
    """
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return bool(-(2**53) <= value <= 2**53)
    if isinstance(value, dict):
        return all(_js_exact(v) for v in value.values())
    if isinstance(value, list):
        return all(_js_exact(v) for v in value)
    return False


def _same_tool(old: Any, new: Any) -> bool:
    """``JSON.stringify`` of both is the same (H-5's redefinition test).

    Headers repeat their tools, so the usual answer is yes: identical orjson
    bytes (key order, types and values all equal) imply the same JS text, and
    cost a fraction of :func:`js_json`.  Different bytes of two
    :func:`_js_exact` values imply different JS texts; :func:`js_json`
    judges the remaining cases (JS prints 1.0 as 1, 2**53 + 1 as 2**53).
    """
    if old is new:
        return True
    try:
        if orjson.dumps(old) == orjson.dumps(new):
            return True
    except orjson.JSONEncodeError:  # e.g. an integer beyond 64 bits: judge by js_json
        pass
    else:
        if _js_exact(old) and _js_exact(new):
            return False
    return js_json(old) == js_json(new)


def _on_header(state: Any, event: Event) -> Any:
    header = event.data.get("header")
    raw = header.get("tools") if isinstance(header, dict) else None
    # only named tools count: a header may carry anything else (D-4 lets it
    # load, as the runtime does) and a nameless entry cannot be declared
    tools = freeze(
        [t for t in raw if isinstance(t, dict) and isinstance(t.get("name"), str)]
        if isinstance(raw, list)
        else []
    )
    headers = state["headers"]
    if tools:
        # One frozen copy of the map with the new entry written in: the
        # ``{**headers, seq: tools}`` form was copied a second time by the
        # final ``freeze`` (and its values walked), per header with tools.
        headers = FrozenDict(headers)
        _set(headers, str(event.seq), tools)
    declared = state["declared"]
    redefined = any(
        t.get("name") in declared and not _same_tool(declared[t.get("name")], t) for t in tools
    )
    new: dict[str, Any] = {**state, "headers": headers, "activeSeq": event.seq}
    if (
        state["series"]["baselineSeq"] is None
        or event.data.get("reason") == "series"
        or event.data.get("startsSeries") is True
        or redefined
    ):
        new["series"] = {"baselineSeq": event.seq, "tools": tools, "updates": []}
        new["declared"] = {t.get("name"): t for t in tools}
        new["available"] = list(dict.fromkeys(t.get("name") for t in tools))
    return _with_fallback(new, state["fallback"])


def _resolve(state: Any, event: Event, name: str) -> Any:
    header_seq = event.data.get("headerSeq")
    tools = state["headers"].get(str(header_seq), []) if is_int(header_seq) else []
    matches = [t for t in tools if t.get("name") == name]
    if len(matches) != 1:
        raise ProjectionError(
            event.seq,
            "H-5",
            f"toolHistory: tool-addition {name!r} does "
            f"not resolve to exactly one tool of request/header "
            f"{header_seq!r} (found {len(matches)})",
        )
    return matches[0]


def _on_developer(state: Any, event: Event) -> Any:
    message = event.data.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    blocks = (
        [
            b
            for b in content
            if isinstance(b, dict) and b.get("type") in ("tool-addition", "tool-removal")
        ]
        if isinstance(content, list)
        else []
    )
    declared = dict(state["declared"])
    available = list(state["available"])
    added: list[Any] = []
    removed: list[str] = []
    for block in blocks:
        name = block.get("toolName")
        if not isinstance(name, str) or not name:
            raise ProjectionError(
                event.seq, "H-5", f"toolHistory: {block.get('type')} block without a toolName"
            )
        if block["type"] == "tool-addition":
            tool = _resolve(state, event, name)
            declared[name] = tool
            added.append(tool)
            if name not in available:
                available.append(name)
        else:
            removed.append(name)
            if name in available:
                available.remove(name)
    series = state["series"]
    message_id = message.get("id") if isinstance(message, dict) else None
    update = {
        "seq": event.seq,
        "messageId": message_id if isinstance(message_id, str) else None,
        "added": added,
        "removed": removed,
    }
    new = {
        **state,
        "declared": declared,
        "available": available,
        "series": {**series, "updates": [*series["updates"], update]},
    }
    return _with_fallback(new, state["fallback"])


def apply(state: Any, event: Event) -> Any:
    if event.type == "request/header":
        return _on_header(state, event)
    if event.type == "developer/message":
        return _on_developer(state, event)
    return state


def view(state: Any) -> Any:
    fallback = state["fallback"]
    return fallback if fallback is not None else state["series"]


def _validate_tools(tools: Any, what: str) -> None:
    require_list(tools, what)
    for tool in tools:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise ValueError(f"{what}: every tool must be an object with a string name")


def validate_view(value: Any) -> None:
    require_dict(value, VIEW_KEYS, "toolHistory view")
    require_seq(value["baselineSeq"], "toolHistory.baselineSeq")
    _validate_tools(value["tools"], "toolHistory.tools")
    require_list(value["updates"], "toolHistory.updates")
    for update in value["updates"]:
        require_dict(update, ("seq", "messageId", "added", "removed"), "toolHistory update")
        if update["messageId"] is not None and not isinstance(update["messageId"], str):
            raise ValueError("toolHistory update messageId must be a string or null")
        require_seq(update["seq"], "toolHistory update seq", optional=False)
        _validate_tools(update["added"], "toolHistory update added")
        require_list(update["removed"], "toolHistory update removed")
        if not all(isinstance(n, str) for n in update["removed"]):
            raise ValueError("toolHistory update removed must be tool names")


def validate(state: Any) -> None:
    require_dict(state, KEYS, "toolHistory state")
    require_dict(state["headers"], (), "toolHistory.headers")
    for seq, tools in state["headers"].items():
        if not seq.isdigit():
            raise ValueError("toolHistory.headers keys must be seqs")
        _validate_tools(tools, f"toolHistory.headers[{seq}]")
    require_seq(state["activeSeq"], "toolHistory.activeSeq")
    require_dict(state["declared"], (), "toolHistory.declared")
    require_list(state["available"], "toolHistory.available")
    if not all(isinstance(n, str) for n in state["available"]):
        raise ValueError("toolHistory.available must be tool names")
    validate_view(state["series"])
    if state["fallback"] is not None:
        validate_view(state["fallback"])


TOOL_HISTORY = ProjectionDefinition(
    key=KEY,
    state_version=3,
    init=init,
    apply=apply,
    validate_state=validate,
    wire=WireView(view=view, validate_view=validate_view),
    event_types=frozenset({"request/header", "developer/message"}),
)
