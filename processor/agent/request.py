"""Building the next request from the log (docs/session-semantics.md §9 H-2..H-4, §10 F-2).

:func:`build_request` is the last thing an attempt does before dispatch.  It
logs what the model is about to be told that is not already in the log —

* a full ``request/header`` on the first request of a loop (``initial``, or
  ``resume`` when the log already has one), on a header change (``change``)
  or on a new request series with an unchanged header (``series``) — H-2;
* one ``developer/message`` with ``tool-addition``/``tool-removal`` blocks
  when tool *names* changed against the previous header, additions pointing
  at the new header through ``headerSeq`` and never inlining a schema — H-3;
* a ``request/context`` record when provider, model, context window or the
  route's system-prompt update mode changed — H-4;

and then reads the request back from the session: the derived messages, the
``toolHistory`` view and the canonical header in effect.  Nothing in a
:class:`Request` comes from anywhere but the log prefix up to
``Request.as_of_seq``, which is what makes the acceptance equality of F-3
hold by construction.

The request is immutable end to end (F-2): header, every message, the message
list, the tool history and the envelope itself.  Messages are borrowed from
the session (event data is frozen once when it is parsed), so freezing costs
nothing per request and each message keeps its identity across requests.
Only :class:`CancelHandle` stays live: cancelling an in-flight call is not a
change of what was asked.

Decisions (the runtime's ``buildRequest`` is the reference)
------------------------------------------------------------
* Header reasons: the loop's first request logs ``initial`` (no header in
  the log) or ``resume``; later, a header that differs from the log's last
  one (:func:`processor.core.header.header_equals`) logs ``change``; an
  unchanged header logs ``series`` only when the request starts a series.
* ``startsSeries: true`` is written on ``initial``, ``resume`` and ``change``
  whenever the request starts a series (issue 17 item 8); ``series`` says so
  by its reason.  A request starts a series when the step asked for one or
  the surface content was rewritten since the loop's previous request (or
  since the loop was created).  A model or tool change alone does not.
* The H-3 developer message follows every ``initial``/``resume``/``change``
  header that has a previous header to diff against; its source is
  ``{"kind": "tool-registry"}`` (item 7); blocks list additions in the new
  header's order, then removals in the previous header's order; ``headerSeq``
  only when something was added.
* ``request/context`` is ``{provider, model, contextWindow?,
  systemPromptUpdate?}`` (``systemPromptUpdate`` is the route's declared
  mode, ``"in-history"`` or ``"consolidate"``, absent when it declares none:
  the runtime's ``buildRequest`` writes ``preparedCall.systemPromptUpdate``
  as is) and is logged when any of the four differs from the log's last
  record (H-4).
* ``Request.tool_history`` is the runtime's tool-history snapshot
  (:mod:`processor.agent.tool_history`), what its provider would replay.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from processor.agent.adapters import CancelHandle, PreparedRoute, Request  # re-exported
from processor.agent.context import EventDraft, IdFactory
from processor.agent.tool_history import tool_history
from processor.core.defaults import fold_session
from processor.core.events import Event
from processor.core.frozen import FrozenDict, FrozenList, freeze, thaw
from processor.core.header import ADAPTER_DEFAULT_FLAGS, canonical_header, header_equals
from processor.core.log import SessionHeader
from processor.core.message_projections import MessageProjectionRegistry
from processor.core.projections import ProjectionRegistry
from processor.core.session import Session

__all__ = [
    "TOOL_HISTORY_KEY",
    "TOOL_REGISTRY_KIND",
    "CancelHandle",
    "Commit",
    "Request",
    "RequestState",
    "build_request",
    "context_record",
    "header_of",
    "rebuild_from_log",
    "request_mismatches",
    "tool_history_of",
    "tool_names",
]

TOOL_HISTORY_KEY: Final = "toolHistory"
"""Key of the built-in tool-history domain projection (H-5)."""

TOOL_REGISTRY_KIND: Final = "tool-registry"
"""``source.kind`` of the developer message announcing tool changes (H-3)."""

Commit = Callable[[EventDraft], Event]
"""Validate-and-append a draft as the next event of the session; returns the event."""


def tool_names(header: Mapping[str, Any] | None) -> list[str]:
    """Tool names of a header in header order (``[]`` for none).

    A persisted header's ``tools`` may be any value but ``[]`` (D-4, as the
    runtime loads it): only the named tools of a list count.
    """
    tools = header.get("tools") if header is not None else None
    if not isinstance(tools, list | tuple):
        return []
    return [t["name"] for t in tools if isinstance(t, Mapping) and isinstance(t.get("name"), str)]


def header_of(route: PreparedRoute, tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The canonical header of a route and a tool set (H-1, the runtime's form).

    The runtime's ``buildRequest`` passes the route's config, adapter defaults
    and non-empty tools through ``canonicalHeader`` and appends the result
    without the load checks (D-4), so it can write a header its own loader
    refuses.  We write the loadable form of the same header instead of
    failing: only the known markers, only ``true`` ones (item 10), only for a
    config field the route actually has, and no empty ``reasoningEffort``
    (see docs/runtime-load-checks.md, "Request building").
    """
    config = dict(route.config)
    effort = config.get("reasoningEffort")
    if "reasoningEffort" in config and not (isinstance(effort, str) and effort):
        del config["reasoningEffort"]
    raw: dict[str, Any] = {"config": config}
    flags = {
        k: True
        for k in ADAPTER_DEFAULT_FLAGS
        if route.adapter_defaults.get(k) is True and k in config
    }
    if flags:
        raw["adapterDefaults"] = flags
    if tools:
        raw["tools"] = [dict(t) for t in tools]
    return canonical_header(raw)


def context_record(route: PreparedRoute) -> dict[str, Any]:
    """The ``request/context`` data of a route (H-4)."""
    record: dict[str, Any] = {"provider": route.provider, "model": route.model}
    if route.context_window is not None:
        record["contextWindow"] = route.context_window
    if route.system_prompt_update is not None:  # "in-history" or "consolidate", as declared
        record["systemPromptUpdate"] = route.system_prompt_update
    return record


def _context_equal(a: Any, b: Mapping[str, Any]) -> bool:
    """H-4: provider, model, contextWindow and systemPromptUpdate all equal."""
    if not isinstance(a, Mapping):
        return False
    return all(
        a.get(k) == b.get(k) and (k in a) == (k in b)
        for k in ("provider", "model", "contextWindow", "systemPromptUpdate")
    )


def tool_history_of(session: Session) -> Any:
    """The runtime's tool-history snapshot of the session's log (H-5), deep-frozen."""
    return tool_history(session.log)


@dataclass(slots=True)
class RequestState:
    """What one loop remembers between its requests (H-2..H-4).

    ``header``/``header_seq`` are the last ``request/header`` of the log and
    ``context`` the last ``request/context`` values, both restored from the
    session when the loop starts, so a resumed loop diffs against what the
    log says rather than against nothing.  ``logged`` tells whether this loop
    already wrote its ``initial``/``resume`` header (H-2).  ``generation`` is
    the surface content generation when the loop was created or its previous
    request was built: a rewrite since then starts a new series.
    """

    header: Any = None
    header_seq: int | None = None
    context: Any = None
    logged: bool = False
    generation: int = 0

    @property
    def requests(self) -> int:
        """1 once this loop logged its first header, else 0 (kept for callers)."""
        return 1 if self.logged else 0

    @classmethod
    def from_session(cls, session: Session) -> RequestState:
        state = cls(generation=session.surface.state.content_generation)
        headers = session.surface.state.headers
        if headers:
            seq = max(headers)
            state.header = freeze(canonical_header(headers[seq].data["header"]))
            state.header_seq = seq
        for event in reversed(list(session.log)):
            if event.type == "request/context":
                state.context = event.data
                break
        return state


def _tool_update(
    previous: Any,
    current: Mapping[str, Any],
    header_seq: int,
    *,
    turn: int,
    step: int,
    new_id: IdFactory,
) -> EventDraft | None:
    """H-3: the developer message announcing tool name changes, or None."""
    before, after = tool_names(previous), tool_names(current)
    added = [n for n in after if n not in before]
    removed = [n for n in before if n not in after]
    if not added and not removed:
        return None
    blocks = [{"type": "tool-addition", "toolName": n} for n in added]
    blocks += [{"type": "tool-removal", "toolName": n} for n in removed]
    data: dict[str, Any] = {
        "turn": turn,
        "step": step,
        "message": {
            "id": new_id("developer"),
            "role": "developer",
            "content": blocks,
            "source": {"kind": TOOL_REGISTRY_KIND},
        },
    }
    if added:
        data["headerSeq"] = header_seq
    return EventDraft("developer/message", data, surface_op="append")


def build_request(
    session: Session,
    state: RequestState,
    route: PreparedRoute,
    tools: Sequence[Mapping[str, Any]],
    *,
    commit: Commit,
    new_id: IdFactory,
    starts_series: bool,
    turn: int,
    step: int,
    attempt: int,
    stream: str,
    cancel: CancelHandle | None = None,
) -> Request:
    """Log what changed (H-2..H-4), then read the frozen request back from the log.

    ``tools`` are the step's assembled tools (Y-2); ``route`` is the route
    prepared for this attempt; ``starts_series`` the step's request for a new
    series (only on its first attempt).  A surface rewrite since the previous
    request also starts one.  ``commit`` appends each event through the
    session (validate, then append) and returns it.
    """
    generation = session.surface.state.content_generation
    header = header_of(route, tools)
    baseline = state.header
    starts = starts_series or generation != state.generation
    data: dict[str, Any] | None = None
    if not state.logged:
        data = {"header": header, "reason": "initial" if baseline is None else "resume"}
    elif baseline is None or not header_equals(baseline, header):
        data = {"header": header, "reason": "change"}
    elif starts:
        data = {"header": header, "reason": "series"}
    if data is not None:
        if starts and data["reason"] != "series":
            data["startsSeries"] = True
        logged = commit(EventDraft("request/header", data))
        state.logged = True
        if baseline is not None and data["reason"] != "series":
            update = _tool_update(baseline, header, logged.seq, turn=turn, step=step, new_id=new_id)
            if update is not None:
                commit(update)
        state.header, state.header_seq = freeze(header), logged.seq
    state.generation = generation
    record = context_record(route)
    if not _context_equal(state.context, record):  # H-4
        state.context = commit(EventDraft("request/context", record)).data
    assert state.header_seq is not None
    messages = session.derive_messages()
    request = Request(
        header=state.header,
        header_seq=state.header_seq,
        messages=FrozenList(messages),
        tool_history=tool_history_of(session),
        context=state.context,
        route=route,
        as_of_seq=session.last_seq,
        turn=turn,
        step=step,
        attempt=attempt,
        stream=stream,
        starts_series=starts,
        cancel=cancel if cancel is not None else CancelHandle(),
    )
    assert isinstance(request.header, FrozenDict)
    return request


def rebuild_from_log(
    events: Sequence[Event],
    as_of_seq: int,
    header: SessionHeader | None = None,
    *,
    message_projections: MessageProjectionRegistry | None = None,
    projections: ProjectionRegistry | None = None,
) -> dict[str, Any]:
    """What a request built at ``as_of_seq`` must contain, rebuilt from the log (F-3).

    Folds the prefix ``events[..as_of_seq]`` into a fresh session (built-in
    units and message projections unless given) and returns ``messages``
    (G-2), ``tool_history`` (the ``toolHistory`` view, H-5), ``header`` (the
    canonical last ``request/header``, H-1), ``header_seq`` and ``context``
    (the last ``request/context``).
    """
    prefix = [e for e in events if e.seq <= as_of_seq]
    folded = fold_session(
        prefix, header, message_projections=message_projections, projections=projections
    )
    last_header = next((e for e in reversed(prefix) if e.type == "request/header"), None)
    last_context = next((e for e in reversed(prefix) if e.type == "request/context"), None)
    return {
        "messages": folded.derive_messages(),
        "tool_history": tool_history(prefix),
        "header": canonical_header(last_header.data["header"]) if last_header else None,
        "header_seq": last_header.seq if last_header else None,
        "context": last_context.data if last_context else None,
    }


def request_mismatches(
    requests: Sequence[Request],
    events: Sequence[Event],
    header: SessionHeader | None = None,
    **registries: Any,
) -> list[str]:
    """F-3's acceptance check: every request equals the log rebuild of its prefix.

    Also checks that the event right after the prefix is this attempt's
    outcome (``assistant/attempt`` or ``assistant/message`` of the request's
    turn and step): nothing was logged between building and dispatching.  Returns
    human-readable mismatches (empty when every request matches).
    """
    problems: list[str] = []
    by_seq = {e.seq: e for e in events}
    for n, request in enumerate(requests):
        where = f"request {n} (as of seq {request.as_of_seq}, {request.stream})"
        expected = rebuild_from_log(events, request.as_of_seq, header, **registries)
        actual = {
            "messages": request.messages,
            "tool_history": request.tool_history,
            "header": request.header,
            "header_seq": request.header_seq,
            "context": request.context,
        }
        for key, value in expected.items():
            if thaw(actual[key]) != thaw(value):
                problems.append(f"{where}: {key} differs from the log rebuild")
        outcome = by_seq.get(request.as_of_seq + 1)
        if (
            outcome is None
            or outcome.type not in ("assistant/attempt", "assistant/message")
            or (outcome.data.get("turn"), outcome.data.get("step")) != (request.turn, request.step)
        ):
            problems.append(f"{where}: the next event is not this attempt's outcome")
    return problems
