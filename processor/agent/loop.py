"""The reference step loop (docs/session-semantics.md §10, rules F-1..F-3).

The loop writes what the runtime's ``ReactLoopAgent`` writes for the same
script.  Every event goes through :meth:`Session.validate` and
:meth:`Session.append` (then the optional ``sink``), and every request is
read back from the session, so it can be rebuilt from the log prefix (F-3).

One ``run_turn(text)``::

    agent/inbox/spliced {target: next-turn, inserted: [prompt]}   -- queue it
    turn/start {turn}
      agent/inbox/spliced {..., removedCount}     -- claim (next-step all, one next-turn)
      step/start {turn, step}
        per attempt: prepare the route; system/message (R-4, R-5);
          user/message claimed..., runtime context  -- first prepared attempt (R-3)
          request/header, developer/message, request/context  -- on change (H-2..H-4)
          assistant/attempt {turn, step, stream}          -- failure
            [plugins]  llm/retry, llm/retry-started
          assistant/message {turn, step, message, usage?, stream}   -- success
        tool/call, tool/result ...               -- unless the reply hit max-tokens
      step/end {turn, step}
      ... more steps while the model calls tools or next-step input is queued ...
    turn/end {turn, reason: {kind, ...}}
    ... another turn while a next-turn prompt is queued ...

A retry does not redo the step's assembly or re-add its user messages (F-1);
each attempt prepares its route anew and builds a new frozen request.

Request series (the runtime's rules)
------------------------------------
A request starts a series when a plugin asked for one
(:meth:`StepContext.request_new_series`) or the surface content was
rewritten since the previous request or since the loop was created (a
compaction, a message projection, a consolidated system head); the header
says so (H-2).  The system prompt consolidates (R-4) in those cases and also
when the tool names changed on a route that takes no tool updates; a model
or tool change alone starts no series (issue 17 item 8).

Decisions
---------
* A "loop" (H-2's "first request of a loop") is one :class:`StepLoop`
  instance; a new instance on a session that already has a header resumes.
* ``turn/end`` reasons are the runtime's objects: ``{kind: completed}``,
  ``{kind: max-tokens}`` (sticky; a cut-off reply's tool calls are not run),
  ``{kind: error, error: {message, code}}`` (the driver stops),
  ``{kind: interrupted}`` (closing a turn a crash left open); ours adds
  ``{kind: max-steps}`` for the ``max_steps`` bound the runtime lacks.
* ``prepare_call`` raising :class:`RouteUnavailable` is a failed attempt
  (``assistant/attempt`` whose stream ends in an error finish with code
  ``route-unavailable``); any other exception is a bug and propagates.
* ``max_attempts`` bounds every attempt of a step, so an overflow that
  compaction cannot fix ends the turn with an error instead of looping.
* The delay of a retry is recorded in ``llm/retry`` and passed to ``sleep``.
* Message ids: ``<kind>-<base>-<n>`` where ``base`` is the session's next seq
  when the loop was created (the runtime uses random UUIDs; ids are opaque);
  inject ``new_id`` for another scheme.  Time comes from an injected clock;
  the default :class:`LogicalClock` is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from processor.agent.adapters import (
    ModelAdapter,
    ModelFailure,
    ModelReply,
    RequestContext,
)
from processor.agent.agent import Agent, ToolContext, ToolHandler, ToolOutput
from processor.agent.clock import IdSequence, LogicalClock, wall_clock
from processor.agent.context import (
    EventDraft,
    IdFactory,
    RuntimeContextProjection,
    SystemPromptProjection,
)
from processor.agent.inbox import TARGETS, InboxFold
from processor.agent.plugins import (
    CompactionPlugin,
    LoopPlugin,
    RetryDecision,
    RetryPolicy,
    StepContext,
    default_retry_policy,
)
from processor.agent.prompt import (
    Assembly,
    render_contexts,
    render_prompt,
)
from processor.agent.repair import last_turn, resume_closers
from processor.agent.request import Request, RequestState, build_request
from processor.agent.stream import failure_stream, reply_stream
from processor.agent.tools import run_tool
from processor.core.errors import Unavailable
from processor.core.events import Event, make_event
from processor.core.frozen import thaw
from processor.core.header import canonical_header, header_equals
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


class RouteUnavailable(Unavailable):
    """Raised by ``prepare_call`` when no route can serve the attempt (a failure)."""


def user_message(text: str, new_id: IdFactory, source: Any = None) -> dict[str, Any]:
    """A user message ``{id, role, content, source}`` with one text block."""
    return {
        "id": new_id("user"),
        "role": "user",
        "content": [{"type": "text", "text": text}] if text else [],
        "source": source if source is not None else {"kind": "user"},
    }


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
class _TurnOutcome:
    turn: int
    reason: dict[str, Any]
    steps: int
    reply: Any
    more: bool  # input is still pending: the driver runs another turn


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
        self.inbox = InboxFold(session.log)
        self.runtime_context = RuntimeContextProjection()
        self.runtime_context.restore(list(session.log), session.surface.state)
        self.system_prompt = SystemPromptProjection(self.new_id)
        self._turn = last_turn(session)

    # -------------------------------------------------------------- writing

    def commit(self, draft: EventDraft, *, time: int | None = None) -> Event:
        """Make ``draft`` the next event: validate, append, observe, sink."""
        event = make_event(
            draft.type,
            self.session.next_seq,
            draft.data,
            time=self.clock() if time is None else time,
            surface_op=draft.surface_op,
            source_event_seqs=draft.source_event_seqs,
            ignorable=draft.ignorable,
        )
        self.session.validate(event)
        self.session.append(event)
        self.inbox.apply(event)
        self.runtime_context.observe(event, self.session.surface.state)
        if self.sink is not None:
            self.sink(event)
        return event

    def _log(self, etype: str, data: Mapping[str, Any]) -> Event:
        return self.commit(EventDraft(etype, dict(data)))

    # -------------------------------------------------------------- inbox

    def splice(
        self, *messages: str | Mapping[str, Any], delivery: str = "next-step"
    ) -> Event | None:
        """Queue user messages for a later step or turn (``agent/inbox/spliced``).

        The messages are appended to the ``next-step`` or ``next-turn``
        queue (:mod:`processor.agent.inbox`); the loop claims ``next-step``
        input at the next step boundary and one ``next-turn`` prompt per turn.
        Going through the log (not a private queue) keeps them across a crash
        and visible to every reader of the session.
        """
        if delivery not in TARGETS:
            raise ValueError("delivery must be 'next-step' or 'next-turn'")
        inserted = [self._as_message(m) for m in messages]
        data = self.inbox.splice_data(
            delivery, len(self.inbox.queues[delivery]), 0, inserted, discard=True
        )
        return self._log("agent/inbox/spliced", data) if data is not None else None

    def _claim(self, target: str) -> list[dict[str, Any]]:
        """Remove and return the step's input: all ``next-step``, then one ``next-turn``."""
        claimed: list[dict[str, Any]] = []
        sources = [("next-step", len(self.inbox.queues["next-step"]))]
        if target == "next-turn":
            sources.append(("next-turn", 1))
        for queue, count in sources:
            data = self.inbox.splice_data(queue, 0, count, [], discard=False)
            if data is not None:
                removed = self.inbox.queues[queue][: data.get("removedCount", 0)]
                self._log("agent/inbox/spliced", data)
                claimed.extend(removed)
        return claimed

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
        to the old one (:func:`processor.agent.repair.resume_closers`).
        """
        drafts, time = resume_closers(self.session, self._turn)
        for draft in drafts:
            self.commit(draft, time=time)
        return bool(drafts)

    def run_turn(self, *inputs: str | Mapping[str, Any]) -> TurnResult:
        """Send ``inputs`` and drive turns until no input is pending.

        As the runtime's driver: each input is queued as one ``next-turn``
        prompt (one ``agent/inbox/spliced`` event each, before ``turn/start``),
        and each turn claims one prompt (plus every ``next-step`` message), so
        several inputs, or a prompt queued earlier with :meth:`splice`, make
        several turns.  The result describes the last turn; ``events`` holds
        everything this call logged.  A turn whose first step would admit
        nothing (no input, no runtime-context update) ends ``completed``
        without a step: it spends no model call.
        """
        self.close_interrupted_turn()
        first = self.session.next_seq
        for value in inputs:
            self.splice(value, delivery="next-turn")
        while True:
            outcome = self._run_turn_once()
            if not outcome.more:
                break
        events = tuple(e for e in self.session.log.events_from(first))
        return TurnResult(
            outcome.turn, str(outcome.reason["kind"]), outcome.steps, outcome.reply, events
        )

    def _run_turn_once(self) -> _TurnOutcome:
        """One turn of the runtime's driver (``turn()``): claim, step, repeat."""
        self._turn += 1
        turn = self._turn
        self._log("turn/start", {"turn": turn})
        target, step, reply, stop = "next-turn", 0, None, False
        ends: dict[str, Any] | None = None
        while True:
            inputs, assembly = self._pre_step(target)
            if ends is not None and not inputs:
                break
            if step == 0 and not inputs:
                ends, stop = {"kind": "completed"}, True
                break
            if step >= self.max_steps:  # our bound; the runtime has none
                ends, stop = {"kind": "max-steps"}, True
                break
            step += 1
            outcome = self._run_step(turn, step, inputs, assembly)
            reply = outcome.reply if outcome.reply is not None else reply
            if outcome.reason is not None and outcome.reason["kind"] == "error":
                ends, stop = outcome.reason, True  # the runtime's driver stops on an error
                break
            if ends is None or ends["kind"] != "max-tokens":  # max-tokens is sticky
                ends = outcome.reason
            if ends is not None and not self.inbox.queues["next-step"]:
                break
            target = "next-step"
        assert ends is not None
        self._log("turn/end", {"turn": turn, "reason": ends})
        return _TurnOutcome(turn, ends, step, reply, not stop and self.inbox.has_pending)

    # -------------------------------------------------------------- steps

    def _pre_step(self, target: str) -> tuple[list[EventDraft], Assembly]:
        """Claim the step's input, assemble once, project the runtime context (F-1).

        The user messages are the claimed messages, then the runtime-context
        update (issue 17 item 13: the runtime appends the snapshot after the
        admitted messages).
        """
        claimed = self._claim(target)
        assembly = self.agent.assemble()
        rendered_context = render_contexts(assembly)
        context_draft = self.runtime_context.project(
            rendered_context, self.session.surface.state, self.new_id
        )
        inputs = [EventDraft("user/message", m, surface_op="append") for m in claimed]
        if context_draft is not None:
            inputs.append(context_draft)
        return inputs, assembly

    def _run_step(
        self, turn: int, step: int, inputs: list[EventDraft], assembly: Assembly
    ) -> _StepOutcome:
        """F-1: the step's assembly and inputs are decided; attempt until success or give-up."""
        self._log("step/start", {"turn": turn, "step": step})
        prompt_text = render_prompt(assembly)
        ctx = StepContext(self, turn, step)
        tools = [dict(t) for t in assembly.tools]
        failure: ModelFailure | None = None
        retries: dict[str, int] = {}
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
                {
                    "turn": turn,
                    "step": step,
                    "stream": failure_stream(self._stream_time(), failure.code, failure.message),
                },
            )
            if any(
                getattr(p, "on_failure", None) is not None and p.on_failure(ctx, failure)
                for p in self.plugins
            ):
                if attempt == self.max_attempts:
                    break
                continue  # a plugin answered the error (e.g. compaction): retry at once
            decision = self.retry_policy(failure, attempt)
            if decision is None or attempt == self.max_attempts:
                break
            self._log_retry(ctx, failure, decision, retries)
        self._log("step/end", {"turn": turn, "step": step})
        error = (
            {"message": failure.message, "code": failure.code}
            if failure is not None
            else {"message": "no attempt", "code": "UNKNOWN"}
        )
        return _StepOutcome({"kind": "error", "error": error})

    def _log_retry(
        self,
        ctx: StepContext,
        failure: ModelFailure,
        decision: RetryDecision,
        retries: dict[str, int],
    ) -> None:
        """The runtime's retry records: ``llm/retry`` (planned), wait, ``llm/retry-started``.

        ``retry`` counts the retries of this step per provider (the runtime
        counts per provider and policy within a step); ``policyKey`` names our
        policy and the attempt bound.
        """
        provider = (
            ctx.route.provider
            if ctx.route is not None
            else str(self.agent.config.get("provider", "unknown"))
        )
        retry = retries[provider] = retries.get(provider, 0) + 1
        retry_id = f"llm-retry:{provider}:{ctx.turn}:{ctx.step}:{retry}"
        self._log(
            "llm/retry",
            {
                "retryId": retry_id,
                "turn": ctx.turn,
                "step": ctx.step,
                "provider": provider,
                "mode": "normal",
                "policyKey": f'["normal",{self.max_attempts - 1}]',
                "retry": retry,
                "maxRetries": self.max_attempts - 1,
                "delayMs": decision.delay_ms,
                "failure": {"message": failure.message, "code": failure.code},
            },
        )
        self.sleep(decision.delay_ms)
        self._log(
            "llm/retry-started",
            {"retryId": retry_id, "turn": ctx.turn, "step": ctx.step, "retry": retry},
        )

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
        data["stream"] = reply_stream(
            self._stream_time(), message["content"], reply.usage, reply.stop_reason
        )
        logged = self.commit(EventDraft("assistant/message", data, surface_op="append"))
        if reply.stop_reason == "max-tokens":
            # The runtime ends the turn on a cut-off answer without running its
            # tool calls (they may be truncated).
            self._log("step/end", {"turn": ctx.turn, "step": ctx.step})
            return _StepOutcome({"kind": "max-tokens"}, logged.data["message"])
        offered = {t["name"] for t in assembly.tools}
        for call in reply.tool_calls:
            run_tool(
                ctx, call, self.agent.handler(call["name"]) if call["name"] in offered else None
            )
        self._log("step/end", {"turn": ctx.turn, "step": ctx.step})
        if reply.tool_calls:
            return _StepOutcome(None, logged.data["message"])
        return _StepOutcome({"kind": "completed"}, logged.data["message"])
