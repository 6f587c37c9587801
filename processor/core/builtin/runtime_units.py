"""Domain units the agent runtime itself registers, with the same state and view.

A subscriber of these views sees what the runtime's own UI shows.  Keys and
``stateVersion`` are the runtime's:

* ``title`` (v1, wire) — the latest ``session/title`` event's ``data.title``
  (last wins), ``None`` before the first.  View: the state.
* ``titleInput`` (v3, no wire) — the eligible human prompts the title service
  reads: ``{"first": {"seq", "text"} | None, "count": int, "lastSeq": int | None}``.
  A ``user/message`` is eligible when its source kind is ``user`` and the
  newline-joined text of its text blocks is not blank.
* ``todos`` (v2, wire) — the latest ``todo/write`` ``data.todos`` list, cleared
  to ``None`` by ``turn/start`` (``turn/end`` keeps the finished list).  View:
  ``[{"content", "status"}]`` (unknown item keys are dropped, as the runtime's
  view schema does) or ``None``.
* ``plan`` (v3, wire) — plan mode: ``{"active", "wanted", "running",
  "activeAtLastHeader"}`` folded from ``plan/mode`` (``{active}``), the
  ``/plan`` command (``command/run`` named ``plan`` with ``args``, and its
  ``command/done``) and ``request/header``.  View: ``{"active", "pending"}``.

Where a payload is not the shape the runtime writes (its type checks would
have refused it at the writer), the unit keeps its state: an invalid event
never poisons the view.  That is our choice; the runtime trusts its writers.
"""

from __future__ import annotations

from typing import Any

from processor.core.builtin._common import is_int, require_dict
from processor.core.events import Event
from processor.core.frozen import FrozenDict, freeze
from processor.core.log import SessionHeader
from processor.core.projections import ProjectionDefinition, WireView

_TODO_STATUSES = ("pending", "in_progress", "completed")


def _data(event: Event) -> Any:
    return event.data if isinstance(event.data, dict) else {}


# ------------------------------------------------------------------ title


def _title_init(header: SessionHeader, inherited: int) -> Any:
    return None


def _title_apply(state: Any, event: Event) -> Any:
    if event.type != "session/title":
        return state
    title = _data(event).get("title")
    if not isinstance(title, str) or not title or title == state:
        return state
    return title


def _title_validate(state: Any) -> None:
    if state is not None and (not isinstance(state, str) or not state):
        raise ValueError("title must be a non-empty string or null")


TITLE = ProjectionDefinition(
    key="title",
    state_version=1,
    init=_title_init,
    apply=_title_apply,
    validate_state=_title_validate,
    wire=WireView(view=lambda state: state, validate_view=_title_validate),
    event_types=frozenset({"session/title"}),
)


# ------------------------------------------------------------------ titleInput

_EMPTY_INPUT: Any = freeze({"first": None, "count": 0, "lastSeq": None})


def _prompt_blocks(event: Event) -> list[Any] | None:
    """The content blocks of a human prompt (a user-sourced user/message), or None."""
    data = event.data
    if event.type != "user/message" or not isinstance(data, dict):
        return None
    source = data.get("source")
    if not isinstance(source, dict) or source.get("kind") != "user":
        return None
    blocks = data.get("content")
    return blocks if isinstance(blocks, list) else []


def _prompt_text(event: Event) -> str | None:
    """The text of a human prompt the title service would read, or None."""
    blocks = _prompt_blocks(event)
    if blocks is None:
        return None
    texts = [
        b["text"]
        for b in blocks
        if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
    ]
    text = "\n".join(texts)
    # Not blank: some character outside Unicode whitespace.  str.strip() and
    # the former re.sub(r"\s+", "") judge by the same predicate
    # (Py_UNICODE_ISSPACE) without building a string per prompt.
    return text if text.strip() else None


def _is_prompt(event: Event) -> bool:
    """``_prompt_text(event) is not None``, without joining the text.

    The joined text is blank exactly when every text block is (the joints are
    newlines): the first block with a non-whitespace character decides.
    """
    for b in _prompt_blocks(event) or ():
        if isinstance(b, dict) and b.get("type") == "text":
            text = b.get("text")
            if isinstance(text, str) and text.strip():
                return True
    return False


def _input_init(header: SessionHeader, inherited: int) -> Any:
    return _EMPTY_INPUT


def _input_apply(state: Any, event: Event) -> Any:
    first = state["first"]
    if first is None:
        text = _prompt_text(event)
        if text is None:
            return state
        first = FrozenDict({"seq": event.seq, "text": text})
    elif not _is_prompt(event):  # the text is kept only for the first prompt
        return state
    elif type(first) is not FrozenDict:
        first = freeze(first)
    # every value is a scalar or already frozen: the same as freeze() of it
    return FrozenDict({"first": first, "count": state["count"] + 1, "lastSeq": event.seq})


def _input_apply_all(state: Any, events: list[Event]) -> Any:
    """:func:`_input_apply` over ``events``: one new state per batch."""
    first, count, last = state["first"], state["count"], state["lastSeq"]
    changed = False
    for event in events:
        if first is None:
            text = _prompt_text(event)
            if text is None:
                continue
            first = FrozenDict({"seq": event.seq, "text": text})
        elif not _is_prompt(event):  # the text is kept only for the first prompt
            continue
        count += 1
        last = event.seq
        changed = True
    if not changed:
        return state
    if type(first) is not FrozenDict:
        first = freeze(first)
    return FrozenDict({"first": first, "count": count, "lastSeq": last})


def _input_validate(state: Any) -> None:
    require_dict(state, ("first", "count", "lastSeq"), "titleInput state")
    empty = state["first"] is None and state["lastSeq"] is None and state["count"] == 0
    first = state["first"]
    populated = (
        isinstance(first, dict)
        and is_int(first.get("seq"))
        and isinstance(first.get("text"), str)
        and is_int(state["lastSeq"])
        and is_int(state["count"])
        and state["count"] > 0
        and first["seq"] <= state["lastSeq"]
    )
    if not (empty or populated):
        raise ValueError("titleInput must pair its count with first and last message seqs")


TITLE_INPUT = ProjectionDefinition(
    key="titleInput",
    state_version=3,
    init=_input_init,
    apply=_input_apply,
    validate_state=_input_validate,
    event_types=frozenset({"user/message"}),
    apply_all=_input_apply_all,
)


# ------------------------------------------------------------------ todos


def _todo_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, dict)
        and isinstance(t.get("content"), str)
        and t.get("status") in _TODO_STATUSES
        for t in value
    )


def _todos_init(header: SessionHeader, inherited: int) -> Any:
    return None


def _todos_apply(state: Any, event: Event) -> Any:
    if event.type == "todo/write":
        todos = _data(event).get("todos")
        return todos if _todo_list(todos) else state
    if event.type == "turn/start":
        return None
    return state


def _todos_validate(state: Any) -> None:
    if state is not None and not _todo_list(state):
        raise ValueError("todos must be a list of {content, status} or null")


def _todos_view(state: Any) -> Any:
    if state is None:
        return None
    if all(set(t) == {"content", "status"} for t in state):
        return state  # already the wire shape: keep its identity (P-1)
    return freeze([{"content": t["content"], "status": t["status"]} for t in state])


TODOS = ProjectionDefinition(
    key="todos",
    state_version=2,
    init=_todos_init,
    apply=_todos_apply,
    validate_state=_todos_validate,
    wire=WireView(view=_todos_view, validate_view=_todos_validate),
    event_types=frozenset({"todo/write", "turn/start"}),
)


# ------------------------------------------------------------------ plan

_PLAN_INIT: Any = freeze(
    {"active": False, "wanted": None, "running": None, "activeAtLastHeader": None}
)
_PLAN_VIEWS: dict[tuple[bool, bool], Any] = {
    (a, p): freeze({"active": a, "pending": p}) for a in (False, True) for p in (False, True)
}


def _plan_init(header: SessionHeader, inherited: int) -> Any:
    return _PLAN_INIT


def _plan_apply(state: Any, event: Event) -> Any:
    t, data = event.type, _data(event)
    if t == "command/run" and data.get("name") == "plan":
        args = data.get("args")
        if not isinstance(args, str):
            return state
        return freeze(
            {
                **state,
                "running": {"commandId": data.get("commandId"), "wanted": args.strip() != "off"},
            }
        )
    running = state["running"]
    if (
        t == "command/done"
        and running is not None
        and data.get("commandId") == running["commandId"]
    ):
        wanted = (
            running["wanted"]
            if (data.get("kind") == "success" and running["wanted"] != state["active"])
            else None
        )
        return freeze({**state, "wanted": wanted, "running": None})
    if t == "plan/mode" and isinstance(data.get("active"), bool):
        return freeze({**state, "active": data["active"], "wanted": None})
    if t == "request/header":
        if state["activeAtLastHeader"] is state["active"]:
            return state
        return freeze({**state, "activeAtLastHeader": state["active"]})
    return state


def _plan_validate(state: Any) -> None:
    require_dict(state, ("active", "wanted", "running", "activeAtLastHeader"), "plan state")
    if not isinstance(state["active"], bool):
        raise ValueError("plan.active must be a boolean")
    if state["wanted"] is not None and not isinstance(state["wanted"], bool):
        raise ValueError("plan.wanted must be a boolean or null")
    running = state["running"]
    if running is not None:
        require_dict(running, ("commandId", "wanted"), "plan.running")


def _plan_view(state: Any) -> Any:
    running = state["running"]
    wanted = running["wanted"] if running is not None else state["wanted"]
    return _PLAN_VIEWS[(state["active"], wanted is not None and wanted != state["active"])]


def _plan_view_validate(view: Any) -> None:
    require_dict(view, ("active", "pending"), "plan view")
    if not isinstance(view["active"], bool) or not isinstance(view["pending"], bool):
        raise ValueError("plan view fields must be booleans")


PLAN = ProjectionDefinition(
    key="plan",
    state_version=3,
    init=_plan_init,
    apply=_plan_apply,
    validate_state=_plan_validate,
    wire=WireView(view=_plan_view, validate_view=_plan_view_validate),
    event_types=frozenset({"command/run", "command/done", "plan/mode", "request/header"}),
)

RUNTIME_UNITS: tuple[ProjectionDefinition, ...] = (TITLE, TITLE_INPUT, TODOS, PLAN)
