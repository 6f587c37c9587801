"""Retry policy and step-loop plugins (docs/session-semantics.md §10, F-1..F-3).

A plugin sees the running step through :class:`StepContext` and writes only
through :meth:`StepContext.commit`, so everything it does is in the log.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from processor.agent.adapters import ModelFailure, PreparedRoute, Request
from processor.agent.context import EventDraft, IdFactory, message_text
from processor.core.events import Event
from processor.core.session import Session

__all__ = [
    "CompactionPlugin",
    "LoopPlugin",
    "RetryDecision",
    "RetryPolicy",
    "StepContext",
    "StepHost",
    "Summarizer",
    "default_retry_policy",
    "default_summarizer",
]


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


# ------------------------------------------------------------------ plugins


class StepHost(Protocol):
    """What a step context reaches of the loop running it (``loop.StepLoop``).

    A protocol rather than the loop's class, so plugins do not import the
    loop that imports them.
    """

    series_requested: bool

    @property
    def session(self) -> Session: ...

    @property
    def new_id(self) -> IdFactory: ...

    def commit(self, draft: EventDraft) -> Event: ...


class StepContext:
    """What a plugin sees of the running step; it writes only through :meth:`commit`."""

    def __init__(self, loop: StepHost, turn: int, step: int) -> None:
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
    """On a context-window overflow, compact a surface range the runtime's way.

    The range starts after the system head (S-6 protects node 0) and ends
    before the last ``keep_last`` nodes; the first kept node is never a
    ``tool/result`` (its tool call would be summarised away).  The
    transaction is the runtime's compaction bracket, inside the open turn::

        compaction/start   {compactionId, turn}
        compaction/summary {compactionId, summary: [blocks], shadowedRange: {start, end},
                            shadowedSeqs, shadowedTokenCount, provider, model}
        user/message       checkpoint, source {kind: "compact-checkpoint", compactionId},
                           replace start..end citing [start seq, summary seq, *shadowed]
        compaction/end     {compactionId, turn}

    The rewrite bumps the content generation, so the retry starts a new
    series and consolidates the system prompt (R-4).  A handled overflow is
    retried without ``llm/retry`` events (the runtime's compaction answers
    the request error itself).  Returns False when there is nothing to
    compact.
    """

    def __init__(
        self, *, keep_last: int = 2, summarize: Summarizer = default_summarizer, min_nodes: int = 2
    ) -> None:
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
        text = self.summarize(messages)
        compaction_id = ctx.new_id("compaction")
        lifecycle = {"compactionId": compaction_id, "turn": ctx.turn}
        start = ctx.commit(EventDraft("compaction/start", lifecycle))
        route = ctx.route
        summary = ctx.commit(
            EventDraft(
                "compaction/summary",
                {
                    "compactionId": compaction_id,
                    "summary": [{"type": "text", "text": text}],
                    "shadowedRange": {"start": shadowed[0], "end": shadowed[-1]},
                    "shadowedSeqs": shadowed,
                    "shadowedTokenCount": sum(len(message_text(m)) for m in messages) // 4,
                    "provider": route.provider if route is not None else "unknown",
                    "model": route.model if route is not None else "unknown",
                },
            )
        )
        checkpoint = {
            "id": ctx.new_id("user"),
            "role": "user",
            "content": [
                {"type": "text", "text": f"<compacted-summary>\n{text}\n</compacted-summary>"}
            ],
            "source": {"kind": "compact-checkpoint", "compactionId": compaction_id},
        }
        ctx.commit(
            EventDraft(
                "user/message",
                checkpoint,
                surface_op={"op": "replace", "startSeq": shadowed[0], "endSeq": shadowed[-1]},
                source_event_seqs=[start.seq, summary.seq, *shadowed],
            )
        )
        ctx.commit(EventDraft("compaction/end", lifecycle))
        self.compactions += 1
        return True
