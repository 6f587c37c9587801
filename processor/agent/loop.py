"""The reference step loop (SESSION-SEMANTICS.md §10, rules F-1..F-3).

The loop turns user input into logged events and model calls.  The session
*is* the log: every event is written through :meth:`Session.validate` and
:meth:`Session.append` (then handed to the optional ``sink``, e.g. a Kafka
writer), and every request is read back from the session, so what the model
received can always be rebuilt from the log prefix (F-3).

One turn::

    turn/start {turn}
    step/start {turn, step}                     -- per step
      assemble the prompt, admit user messages  -- once per step (F-1)
      per attempt:                              -- every attempt (F-1)
        prepare the route (adapter.prepare_call)
        system/message ...                      -- reconcile the prompt (R-4, R-5)
        user/message (runtime context, inputs)  -- first prepared attempt only (R-3)
        request/header, developer/message, request/context   -- only on change (H-2..H-4)
        dispatch to route.adapter               -- the adapter that prepared it (F-2)
        assistant/attempt {turn, step, stream, error}         -- failure (F-3)
          [plugins, e.g. compaction]  llm/retry, llm/retry-started
        assistant/message {turn, step, stream, message, usage} -- success (F-3)
      tool/call, tool/result ...                -- for each tool call
    step/end {turn, step}
    ... more steps while the model calls tools ...
    turn/end {turn, reason}

Retries do not redo the step's assembly or re-add its user messages: those
were decided for the step, and a retry only asks again (F-1).  But each
attempt prepares its route anew — a fallback may switch model or
capabilities — so the system prompt is reconciled against *that* route and a
new frozen request is built; headers and contexts are logged only when they
changed.

Request series
--------------
A *series* is a run of requests whose histories extend each other (one
provider cache lineage, one tool-update baseline).  An attempt starts a new
series when a plugin asked for one (:meth:`StepContext.request_new_series`),
when the surface content was rewritten since the previous request (a
compaction, a message projection, a consolidated system head), when the route
switched provider or model, or when the tool names changed on a route that
cannot take tool-update messages.  A new series consolidates the system
prompt (R-4) and is marked on the header (H-2).

Decisions where the spec and seed are silent
--------------------------------------------
* A "loop" (H-2's "first request of a loop") is one :class:`StepLoop`
  instance; a new instance on a session that already has a header resumes.
* Within an attempt: system reconcile, then (first prepared attempt only) the
  runtime-context message, then the admitted user messages, then the header
  records.  The prompt goes first so a fresh session's system node is node 0;
  the runtime context precedes the user's words so the latest user message is
  the last thing the model reads.
* ``prepare_call`` raising :class:`RouteUnavailable` is a failed attempt
  (logged as ``assistant/attempt`` with code ``route-unavailable``); any other
  exception is a bug and propagates.
* ``max_attempts`` bounds every attempt of a step, retries and compaction
  retries alike, so an overflow that compaction cannot fix ends the turn
  (reason ``error``) instead of looping.
* A reply cut off at the token limit without tool calls ends the turn with
  reason ``max-tokens``; tool calls in it are still run (they are complete
  blocks).  ``turn/end`` reasons: ``stop``, ``max-tokens``, ``max-steps``,
  ``error``; a turn a crashed loop left open is closed with ``interrupted``
  before the next one starts (:meth:`StepLoop.close_interrupted_turn`).
* The delay of a retry is recorded in ``llm/retry`` and passed to the ``sleep``
  hook (a no-op by default: the core does no I/O and no waiting).
* Tool handler exceptions become ``tool/result`` errors
  (``{name: <exception type>, code: "tool-failed", reason}``) so the model
  can react; a call of a tool that is not in the step's assembly gets
  ``code: "unknown-tool"``.
* Message ids: ``<kind>-<base>-<n>`` where ``base`` is the session's next seq
  when the loop was created (unique across resumed loops); inject ``new_id``
  for another scheme.  Time comes from an injected clock; the default
  :class:`LogicalClock` is deterministic.
"""

from __future__ import annotations

import time as _time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from processor.agent.adapters import (
    ModelAdapter,
    ModelFailure,
    ModelReply,
    PreparedRoute,
    RequestContext,
)
from processor.agent.context import (
    EventDraft,
    IdFactory,
    RuntimeContextProjection,
    SystemPromptProjection,
    message_text,
)
from processor.agent.header import canonical_header, header_equals
from processor.agent.prompt import (
    Assembly,
    Registration,
    Scope,
    SystemPrompt,
    ToolSpec,
    render_contexts,
    render_prompt,
)
from processor.agent.request import Request, RequestState, build_request
from processor.agent.stream import failure_stream, reply_stream
from processor.core.events import Event, make_event
from processor.core.frozen import thaw
from processor.core.log import SessionHeader
from processor.core.message_projections import (
    MessageProjection,
    MessageProjectionRegistry,
    default_message_projections,
)
from processor.core.projections import ProjectionRegistry
from processor.core.session import Session

__all__ = [
    "Agent",
    "CompactionPlugin",
    "IdSequence",
    "LogicalClock",
    "LoopPlugin",
    "RetryDecision",
    "RetryPolicy",
    "RouteUnavailable",
    "StepContext",
    "StepLoop",
    "ToolContext",
    "ToolHandler",
    "ToolOutput",
    "TurnResult",
    "default_retry_policy",
    "user_message",
    "wall_clock",
]


# ------------------------------------------------------------------ small parts


class RouteUnavailable(Exception):
    """Raised by ``prepare_call`` when no route can serve the attempt (a failure)."""


class LogicalClock:
    """Deterministic epoch-ms clock: ``start``, then +1 ms per reading."""

    def __init__(self, start: int = 1_700_000_000_000) -> None:
        self._now = start - 1

    def __call__(self) -> int:
        self._now += 1
        return self._now


def wall_clock() -> int:
    """The real time in epoch ms (pass as ``clock=`` in production)."""
    return _time.time_ns() // 1_000_000


class IdSequence:
    """Default message ids: ``<kind>-<base>-<n>`` (see the module docstring)."""

    def __init__(self, base: int) -> None:
        self._base = base
        self._n = 0

    def __call__(self, kind: str) -> str:
        self._n += 1
        return f"{kind}-{self._base}-{self._n}"


def user_message(text: str, new_id: IdFactory, source: Any = None) -> dict[str, Any]:
    """A user message ``{id, role, content, source}`` with one text block."""
    return {
        "id": new_id("user"),
        "role": "user",
        "content": [{"type": "text", "text": text}] if text else [],
        "source": source if source is not None else {"kind": "user"},
    }


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """Retry after ``delay_ms`` (recorded in ``llm/retry``)."""

    delay_ms: int = 0
    reason: str = ""


RetryPolicy = Callable[[ModelFailure, int], RetryDecision | None]
"""``policy(failure, attempt) -> RetryDecision | None`` (None: give up)."""


def default_retry_policy(base_delay_ms: int = 500) -> RetryPolicy:
    """Retry retryable failures with exponential backoff (attempt 1 -> base)."""

    def policy(failure: ModelFailure, attempt: int) -> RetryDecision | None:
        if not failure.retryable:
            return None
        return RetryDecision(base_delay_ms * 2 ** (attempt - 1), failure.code)

    return policy


# ------------------------------------------------------------------ tools


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool handler may know about its call."""

    turn: int
    step: int
    call_id: str
    name: str
    session: Session


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """A tool's result: text (or content blocks) and an optional error.

    ``error`` is ``{name, code, reason?}``; it marks the message ``isError``
    (D-5).
    """

    content: str | Sequence[Any]
    error: Mapping[str, Any] | None = None
    meta: Mapping[str, Any] | None = None


ToolHandler = Callable[[Any, ToolContext], "ToolOutput | str"]


class _ToolProvider:
    """A tools provider on the prompt whose set the agent can change."""

    def __init__(self) -> None:
        self.specs: dict[str, ToolSpec | Mapping[str, Any]] = {}

    def __call__(self) -> list[ToolSpec | Mapping[str, Any]]:
        return list(self.specs.values())


# ------------------------------------------------------------------ the agent


class Agent:
    """What an agent author registers: prompt, tools, projections, model config.

    * ``agent.prompt`` (or ``agent.layer``, the agent's scope when ``scope``
      is given) takes sections, contexts, variables, tool providers (rule Y);
    * :meth:`add_tool` registers a tool schema *and* its handler (one
      :class:`Registration` removes both);
    * :meth:`register_projection` / :meth:`register_message_projection` add
      domain projections (P) and message projections (M) to every session
      this agent creates with :meth:`new_session`;
    * ``config`` is the requested model config (``temperature``,
      ``maxTokens``, ``reasoningEffort``, ``stop``...), resolved per attempt
      by the adapter.
    """

    def __init__(
        self,
        prompt: SystemPrompt | None = None,
        *,
        scope: str | None = None,
        config: Mapping[str, Any] | None = None,
        projections: ProjectionRegistry | None = None,
        message_projections: MessageProjectionRegistry | None = None,
    ) -> None:
        self.prompt = prompt if prompt is not None else SystemPrompt()
        self.scope = scope
        self.config: dict[str, Any] = dict(config or {})
        self.projections = projections if projections is not None else _builtin_registry()
        self.message_projections = (
            message_projections
            if message_projections is not None
            else default_message_projections()
        )
        self._handlers: dict[str, ToolHandler] = {}
        self._provider = _ToolProvider()
        self.layer.add_tools(self._provider)

    @property
    def layer(self) -> SystemPrompt | Scope:
        """The layer the agent's own contributions go to (its scope, or global)."""
        if self.scope is None:
            return self.prompt
        return self.prompt.get_scope(self.scope)

    def assemble(self) -> Assembly:
        return self.prompt.assemble(self.scope)

    def add_tool(self, spec: ToolSpec | Mapping[str, Any], handler: ToolHandler) -> Registration:
        """Offer a tool to the model and handle its calls; ``remove()`` undoes both."""
        name = spec.name if isinstance(spec, ToolSpec) else spec["name"]
        if name in self._provider.specs:
            raise ValueError(f"tool {name!r} is already registered on this agent")
        self._provider.specs[name] = spec
        self._handlers[name] = handler

        def remove() -> None:
            self._provider.specs.pop(name, None)
            self._handlers.pop(name, None)

        return Registration(remove)

    def handler(self, name: str) -> ToolHandler | None:
        return self._handlers.get(name)

    def register_projection(self, definition: Any) -> Any:
        """Register a domain projection definition (P-2) for this agent's sessions."""
        return self.projections.register(definition)

    def register_message_projection(self, projection: MessageProjection) -> None:
        """Register a message projection (M-1, M-4) for this agent's sessions."""
        self.message_projections.register(projection)

    def new_session(self, header: SessionHeader | None = None) -> Session:
        """An empty session with this agent's projections."""
        return Session(
            header, message_projections=self.message_projections, projections=self.projections
        )


def _builtin_registry() -> ProjectionRegistry:
    from processor.core.builtin import register_builtins

    registry = ProjectionRegistry()
    register_builtins(registry)
    return registry


# ------------------------------------------------------------------ plugins


class StepContext:
    """What a plugin sees of the running step; it writes only through :meth:`commit`."""

    def __init__(self, loop: StepLoop, turn: int, step: int) -> None:
        self._loop = loop
        self.turn = turn
        self.step = step
        self.attempt = 0
        self.route: PreparedRoute | None = None
        self.request: Request | None = None

    @property
    def session(self) -> Session:
        return self._loop.session

    def new_id(self, kind: str) -> str:
        return self._loop.new_id(kind)

    def commit(self, draft: EventDraft) -> Event:
        """Validate and append ``draft`` as the next event (the only way to write)."""
        return self._loop.commit(draft)

    def request_new_series(self) -> None:
        """Make the next request start a new series (H-2, R-4 consolidation)."""
        self._loop.series_requested = True


class LoopPlugin(Protocol):
    """A step-loop plugin; every hook is optional (see :class:`CompactionPlugin`)."""

    def on_failure(self, ctx: StepContext, failure: ModelFailure) -> bool:
        """React to a failed attempt; True: handled, retry now (no policy delay)."""
        ...


Summarizer = Callable[[Sequence[Any]], str]


def default_summarizer(messages: Sequence[Any]) -> str:
    """A deterministic summary: one line per message, role and first 60 characters."""
    lines = [f"Summary of {len(messages)} earlier messages:"]
    for message in messages:
        text = message_text(message).replace("\n", " ")
        lines.append(f"- {message.get('role')}: {text[:60]}")
    return "\n".join(lines)


class CompactionPlugin:
    """On a context-window overflow, replace a surface range with a summary.

    The range starts after the system head (S-6 protects node 0) and ends
    before the last ``keep_last`` nodes; the first kept node is never a
    ``tool/result`` (its tool call would be summarised away).  The summary is
    a ``user/message`` replace citing every shadowed node (S-4), with
    ``source: {kind: "compaction", shadowed: [...]}``.  The rewrite bumps the
    content generation, so the retry starts a new series and consolidates the
    system prompt (R-4).  Returns False when there is nothing to compact.
    """

    def __init__(self, *, keep_last: int = 2, summarize: Summarizer = default_summarizer,
                 min_nodes: int = 2) -> None:
        self.keep_last = keep_last
        self.summarize = summarize
        self.min_nodes = min_nodes
        self.compactions = 0

    def on_failure(self, ctx: StepContext, failure: ModelFailure) -> bool:
        if not failure.context_overflow:
            return False
        state = ctx.session.surface.state
        nodes = list(state.nodes)
        lo = 1 if nodes and state.node_events[nodes[0]].type == "system/message" else 0
        cut = len(nodes) - self.keep_last
        while cut > lo and state.node_events[nodes[cut]].type == "tool/result":
            cut -= 1
        shadowed = nodes[lo:cut]
        if len(shadowed) < self.min_nodes:
            return False
        messages = [m for m in (state.message_of(s) for s in shadowed) if m is not None]
        message = {
            "id": ctx.new_id("user"),
            "role": "user",
            "content": [{"type": "text", "text": self.summarize(messages)}],
            "source": {"kind": "compaction", "shadowed": shadowed},
        }
        ctx.commit(
            EventDraft(
                "user/message",
                message,
                surface_op={"op": "replace", "startSeq": shadowed[0], "endSeq": shadowed[-1]},
                source_event_seqs=shadowed,
            )
        )
        self.compactions += 1
        return True


# ------------------------------------------------------------------ the loop


@dataclass(frozen=True, slots=True)
class TurnResult:
    """How a turn ended: its number, ``turn/end`` reason, steps and last reply."""

    turn: int
    reason: str
    steps: int
    reply: Any = None
    events: tuple[Event, ...] = field(default=())


@dataclass(slots=True)
class _StepOutcome:
    reason: dict[str, Any] | None  # the turn/end reason; None: continue with another step
    reply: Any = None


class StepLoop:
    """Drives one session: ``run_turn(*inputs)`` (see the module docstring).

    ``adapter`` may be reassigned between attempts (e.g. by a plugin); each
    attempt calls the adapter that prepared its route (F-2).  ``sink``
    receives every committed event, after it was appended to the session.
    """

    def __init__(
        self,
        agent: Agent,
        session: Session,
        adapter: ModelAdapter,
        *,
        sink: Callable[[Event], None] | None = None,
        clock: Callable[[], int] | None = None,
        new_id: IdFactory | None = None,
        retry_policy: RetryPolicy | None = None,
        plugins: Iterable[Any] = (),
        max_attempts: int = 4,
        max_steps: int = 16,
        sleep: Callable[[int], None] | None = None,
    ) -> None:
        self.agent = agent
        self.session = session
        self.adapter = adapter
        self.sink = sink
        self.clock = clock if clock is not None else LogicalClock()
        self.new_id: IdFactory = new_id if new_id is not None else IdSequence(session.next_seq)
        self.retry_policy = retry_policy if retry_policy is not None else default_retry_policy()
        self.plugins: list[Any] = list(plugins)
        self.max_attempts = max_attempts
        self.max_steps = max_steps
        self.sleep = sleep if sleep is not None else (lambda _ms: None)
        self.series_requested = False
        self.requests: list[Request] = []
        self.request_state = RequestState.from_session(session)
        self.runtime_context = RuntimeContextProjection()
        self.runtime_context.restore(list(session.log), session.surface.state)
        self.system_prompt = SystemPromptProjection(self.new_id)
        self._turn = _last_turn(session)

    # -------------------------------------------------------------- writing

    def commit(self, draft: EventDraft) -> Event:
        """Make ``draft`` the next event: validate, append, observe, sink."""
        event = make_event(
            draft.type,
            self.session.next_seq,
            draft.data,
            time=self.clock(),
            surface_op=draft.surface_op,
            source_event_seqs=draft.source_event_seqs,
            ignorable=draft.ignorable,
        )
        self.session.validate(event)
        self.session.append(event)
        self.runtime_context.observe(event, self.session.surface.state)
        if self.sink is not None:
            self.sink(event)
        return event

    def _log(self, etype: str, data: Mapping[str, Any]) -> Event:
        return self.commit(EventDraft(etype, dict(data)))

    def splice(
        self, *messages: str | Mapping[str, Any], delivery: str = "next-step"
    ) -> Event:
        """Log user messages for a later step or turn (``agent/inbox/spliced``).

        The ``inbox`` unit keeps them pending until a ``user/message`` with the
        same id delivers them; the loop admits them at the start of the next
        step (``next-step``) or the next turn (``next-turn``).  Going through
        the log (not a private queue) keeps them across a crash and visible
        to every reader of the session.
        """
        if delivery not in ("next-step", "next-turn"):
            raise ValueError("delivery must be 'next-step' or 'next-turn'")
        return self._log(
            "agent/inbox/spliced",
            {"delivery": delivery, "messages": [self._as_message(m) for m in messages]},
        )

    def _inbox_messages(self, first_step: bool) -> list[dict[str, Any]]:
        """Pending inbox messages due now (step start; next-turn ones only at step 1).

        Only well-formed user messages are admitted; anything else stays
        pending in the ``inbox`` unit rather than failing the step.
        """
        state = self.session.projections.state_of("inbox")
        if not isinstance(state, dict):
            return []
        due: list[dict[str, Any]] = []
        seen: set[str] = set()
        for entry in state.get("pending", []):
            message = entry.get("message")
            if entry.get("delivery") == "next-turn" and not first_step:
                continue
            if (
                isinstance(message, dict)
                and message.get("role") == "user"
                and isinstance(message.get("content"), list)
                and message["id"] not in seen
            ):
                seen.add(message["id"])
                due.append(thaw(message))
        return due

    def _as_message(self, value: str | Mapping[str, Any]) -> dict[str, Any]:
        if isinstance(value, str):
            return user_message(value, self.new_id)
        message = thaw(value)
        if message.get("role") != "user":
            raise ValueError("admitted messages must have role 'user'")
        message.setdefault("id", self.new_id("user"))
        message.setdefault("source", {"kind": "user"})
        return dict(message)

    # -------------------------------------------------------------- turns

    def close_interrupted_turn(self) -> bool:
        """Close a turn a crashed loop left open; True if there was one.

        A resumed loop must not nest a new turn inside an open one: readers
        (``turnBoundary``, transcripts) would attribute the new turn's events
        to the old one.  The open step gets its ``step/end`` and the turn a
        ``turn/end`` with reason ``interrupted``.  Called by :meth:`run_turn`.
        """
        boundary = _turn_boundary(self.session)
        if boundary.get("openTurnStartSeq") is None:
            return False
        turn = self._turn
        last = boundary.get("lastStepBoundary")
        if isinstance(last, dict) and last.get("kind") == "start":
            opened = self.session.log.get(last["seq"])
            step = opened.data.get("step") if opened is not None else last.get("step")
            self._log("step/end", {"turn": turn, "step": step if isinstance(step, int) else 0})
        self._log("turn/end", {"turn": turn, "reason": {"kind": "interrupted"}})
        return True

    def run_turn(self, *inputs: str | Mapping[str, Any]) -> TurnResult:
        """Run one turn: admit ``inputs`` in its first step, step until done.

        As in the runtime, a turn whose first step would admit nothing (no
        input, no inbox message, no runtime-context update) ends
        ``completed`` without a step: it spends no model call.
        """
        self.close_interrupted_turn()
        first = self.session.next_seq
        self._turn += 1
        turn = self._turn
        self._log("turn/start", {"turn": turn})
        given = [self._as_message(i) for i in inputs]
        reason: dict[str, Any] = {"kind": "max-steps"}
        reply, step = None, 0
        for n in range(1, self.max_steps + 1):
            outcome = self._run_step(turn, n, given)
            given = []
            if outcome is None:  # nothing to admit in the first step
                reason = {"kind": "completed"}
                break
            step = n
            reply = outcome.reply if outcome.reply is not None else reply
            if outcome.reason is not None:
                reason = outcome.reason
                break
        self._log("turn/end", {"turn": turn, "reason": reason})
        events = tuple(e for e in self.session.log.events_from(first))
        return TurnResult(turn, str(reason["kind"]), step, reply, events)

    # -------------------------------------------------------------- steps

    def _run_step(
        self, turn: int, step: int, admitted: list[dict[str, Any]]
    ) -> _StepOutcome | None:
        """F-1: decide assembly and inputs once, then attempt until success or give-up.

        The step's user messages are the claimed inbox messages, then the
        given inputs, then the runtime-context update (issue 17 item 13: the
        runtime appends the context after the admitted messages, so the
        snapshot is the newest thing the model reads before answering).
        """
        admitted = self._inbox_messages(step == 1) + admitted
        assembly = self.agent.assemble()
        prompt_text = render_prompt(assembly)
        rendered_context = render_contexts(assembly)
        context_draft = self.runtime_context.project(
            rendered_context, self.session.surface.state, self.new_id
        )
        inputs = [EventDraft("user/message", m, surface_op="append") for m in admitted]
        if context_draft is not None:
            inputs.append(context_draft)
        if step == 1 and not inputs:
            return None
        self._log("step/start", {"turn": turn, "step": step})
        ctx = StepContext(self, turn, step)
        tools = [dict(t) for t in assembly.tools]
        failure: ModelFailure | None = None
        for attempt in range(1, self.max_attempts + 1):
            ctx.attempt = attempt
            stream = f"stream-{turn}.{step}.{attempt}"
            result = self._attempt(ctx, stream, prompt_text, tools, inputs, failure)
            if isinstance(result, ModelReply):
                return self._finish_step(ctx, stream, result, assembly)
            inputs = inputs if ctx.route is None else []
            failure = result
            self._log(
                "assistant/attempt",
                {"turn": turn, "step": step,
                 "stream": failure_stream(self._stream_time(), failure.code, failure.message)},
            )
            decision: RetryDecision | None = None
            for plugin in self.plugins:
                hook = getattr(plugin, "on_failure", None)
                if hook is not None and hook(ctx, failure):
                    decision = RetryDecision(0, f"{failure.code}: handled by plugin")
                    break
            if decision is None:
                decision = self.retry_policy(failure, attempt)
            if decision is None or attempt == self.max_attempts:
                break
            self._log(
                "llm/retry",
                {"turn": turn, "step": step, "attempt": attempt + 1,
                 "delayMs": decision.delay_ms, "reason": decision.reason or failure.code},
            )
            self.sleep(decision.delay_ms)
            self._log("llm/retry-started", {"turn": turn, "step": step, "attempt": attempt + 1})
        self._log("step/end", {"turn": turn, "step": step})
        error = {"message": failure.message, "code": failure.code} if failure is not None else {
            "message": "no attempt", "code": "UNKNOWN"}
        return _StepOutcome({"kind": "error", "error": error})

    def _stream_time(self) -> int:
        """The time stamped on an attempt's stream records (the clock's next reading)."""
        return self.clock()

    def _tools_changed(self, tools: Sequence[Mapping[str, Any]]) -> bool:
        """Do the assembled tools differ from the logged header's?  (the runtime's toolsChanged)"""
        baseline = self.request_state.header
        if baseline is None:
            return False
        return not header_equals(baseline, canonical_header({**baseline, "tools": list(tools)}))

    def _attempt(
        self,
        ctx: StepContext,
        stream: str,
        prompt_text: str,
        tools: list[dict[str, Any]],
        inputs: list[EventDraft],
        previous: ModelFailure | None,
    ) -> ModelReply | ModelFailure:
        """One attempt: prepare, reconcile, admit (once), build, dispatch (F-1, F-2)."""
        ctx.route = None
        try:
            route = self.adapter.prepare_call(
                RequestContext(ctx.turn, ctx.step, ctx.attempt, self.agent.config, previous)
            )
        except RouteUnavailable as exc:
            return ModelFailure("route-unavailable", str(exc), retryable=True)
        ctx.route = route
        state = self.request_state
        requested = self.series_requested
        self.series_requested = False
        # R-4's startsSeries: asked for, the surface rewritten since the last
        # request, or a tool change the route cannot take as an update.  Only
        # the first two also mark the header (build_request): a tool change
        # alone does not start a request series (issue 17 item 8).
        consolidate = (
            requested
            or self.session.surface.state.content_generation != state.generation
            or (not route.tool_updates and self._tools_changed(tools))
        )
        for draft in self.system_prompt.project(
            self.session.surface.state,
            prompt_text,
            in_history=route.in_history_system_prompt,  # this attempt's route
            starts_series=consolidate,
            turn=ctx.turn,
            step=ctx.step,
        ):
            self.commit(draft)
        for draft in inputs:  # after entering the step and preparing the route
            self.commit(draft)
        request = build_request(
            self.session,
            state,
            route,
            tools,
            commit=self.commit,
            new_id=self.new_id,
            starts_series=requested,
            turn=ctx.turn,
            step=ctx.step,
            attempt=ctx.attempt,
            stream=stream,
        )
        ctx.request = request
        self.requests.append(request)
        return route.adapter.stream(request)  # F-2: the adapter that prepared the route

    def _finish_step(
        self, ctx: StepContext, stream: str, reply: ModelReply, assembly: Assembly
    ) -> _StepOutcome:
        """F-3 success: log the assistant message, run its tool calls, end the step."""
        route = ctx.route
        assert route is not None
        message: dict[str, Any] = {
            "id": self.new_id("assistant"),
            "role": "assistant",
            "content": [thaw(b) for b in reply.content],
            "source": {"kind": "model", "provider": route.provider, "model": route.model},
        }
        data: dict[str, Any] = {"turn": ctx.turn, "step": ctx.step, "message": message}
        if reply.usage is not None:
            data["usage"] = dict(reply.usage)
        data["stream"] = reply_stream(self._stream_time(), message["content"], reply.usage,
                                      reply.stop_reason)
        logged = self.commit(EventDraft("assistant/message", data, surface_op="append"))
        if reply.stop_reason == "max-tokens":
            # The runtime ends the turn on a cut-off answer without running its
            # tool calls (they may be truncated).
            self._log("step/end", {"turn": ctx.turn, "step": ctx.step})
            return _StepOutcome({"kind": "max-tokens"}, logged.data["message"])
        offered = {t["name"] for t in assembly.tools}
        for call in reply.tool_calls:
            self._run_tool(ctx, call, offered)
        self._log("step/end", {"turn": ctx.turn, "step": ctx.step})
        if reply.tool_calls:
            return _StepOutcome(None, logged.data["message"])
        return _StepOutcome({"kind": "completed"}, logged.data["message"])

    def _run_tool(self, ctx: StepContext, call: Any, offered: set[str]) -> None:
        """Log the call and its result the way the runtime does (format v4).

        ``tool/call`` carries the raw ``arguments`` string; the handler gets
        it parsed (an empty string is ``{}``, invalid JSON stays the string).
        The result is a ``tool`` message ``{role: "tool", content, source:
        {kind: "tool", callId}, toolCallId, isError}`` citing its call.
        """
        call_id, name = call["id"], call["name"]
        raw = call.get("arguments", "")
        arguments = raw if isinstance(raw, str) else orjson.dumps(thaw(raw)).decode()
        call_event = self._log(
            "tool/call",
            {"turn": ctx.turn, "step": ctx.step, "callId": call_id, "name": name,
             "arguments": arguments},
        )
        handler = self.agent.handler(name) if name in offered else None
        if handler is None:
            output = ToolOutput(f"Error: unknown tool {name!r}",
                                error={"name": "UnknownTool", "code": "unknown-tool"})
        else:
            try:
                produced = handler(_parse_arguments(arguments),
                                   ToolContext(ctx.turn, ctx.step, call_id, name, self.session))
                output = ToolOutput(produced) if isinstance(produced, str) else produced
            except Exception as exc:  # a failing tool is reported to the model
                output = ToolOutput(f"Error: {exc}", error={"name": type(exc).__name__,
                                                            "code": "tool-failed"})
        content = (
            [{"type": "text", "text": output.content}]
            if isinstance(output.content, str)
            else [thaw(b) for b in output.content]
        )
        message: dict[str, Any] = {
            "id": self.new_id("tool"),
            "role": "tool",
            "content": content,
            "source": {"kind": "tool", "callId": call_id},
            "toolCallId": call_id,
            "isError": output.error is not None,
        }
        data: dict[str, Any] = {"turn": ctx.turn, "step": ctx.step, "message": message}
        if output.error is not None:
            data["error"] = {"name": output.error["name"], "code": output.error["code"]}
        if output.meta is not None:
            data["meta"] = dict(output.meta)
        self.commit(
            EventDraft("tool/result", data, surface_op="append",
                       source_event_seqs=[call_event.seq])
        )


def _parse_arguments(raw: str) -> Any:
    """The runtime's argument parsing: empty -> ``{}``, invalid JSON stays text."""
    if not raw:
        return {}
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw


def _turn_boundary(session: Session) -> dict[str, Any]:
    """The ``turnBoundary`` state (built-in unit), or one scanned from the retained log.

    The unit survives a checkpoint restore (the log prefix may be gone); the
    scan is the fallback for registries without the built-in units.
    """
    state = session.projections.state_of("turnBoundary")
    if isinstance(state, dict):
        return state
    found: dict[str, Any] = {"openTurnStartSeq": None, "lastStepBoundary": None,
                             "lastTurn": None}
    for event in session.log:
        if event.type == "turn/start":
            found["openTurnStartSeq"], found["lastTurn"] = event.seq, event.data.get("turn")
        elif event.type == "turn/end":
            found["openTurnStartSeq"] = None
        elif event.type in ("step/start", "step/end"):
            kind = "start" if event.type == "step/start" else "end"
            found["lastStepBoundary"] = {"kind": kind, "seq": event.seq,
                                         "step": event.data.get("step")}
    return found


def _last_turn(session: Session) -> int:
    turn = _turn_boundary(session).get("lastTurn")
    return turn if isinstance(turn, int) else 0


