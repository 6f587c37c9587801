"""The reference agent runtime: prompt, projections, requests, step loop, adapters.

Pure (no I/O): the session log is the only state that matters, and every
model request is rebuilt from it.  See ``docs/agent-api.md`` for how agent
authors register sections, contexts, variables, tools and projections.
"""

from __future__ import annotations

from processor.agent.adapters import (
    CONTEXT_WINDOW_EXCEEDED,
    ModelAdapter,
    ModelFailure,
    ModelReply,
    ModelResult,
    PreparedRoute,
    RequestContext,
)
from processor.agent.context import (
    RUNTIME_CONTEXT_KIND,
    EventDraft,
    RuntimeContextProjection,
    SystemPromptProjection,
    message_text,
    runtime_context_source,
)
from processor.agent.inbox import InboxFold
from processor.agent.loop import (
    Agent,
    CompactionPlugin,
    IdSequence,
    LogicalClock,
    LoopPlugin,
    RetryDecision,
    RetryPolicy,
    RouteUnavailable,
    StepContext,
    StepLoop,
    ToolContext,
    ToolHandler,
    ToolOutput,
    TurnResult,
    default_retry_policy,
    user_message,
    wall_clock,
)
from processor.agent.prompt import (
    RUNTIME_CONTEXT_CLEARED,
    RUNTIME_CONTEXT_FRAMING,
    UNLISTED_TOOLS,
    Assembly,
    ContextSection,
    PromptError,
    Registration,
    Scope,
    Section,
    SystemPrompt,
    ToolSpec,
    join_context_sections,
    render_contexts,
    render_prompt,
)
from processor.agent.repair import interrupted_turn_closers
from processor.agent.request import (
    CancelHandle,
    Request,
    RequestState,
    build_request,
    rebuild_from_log,
    request_mismatches,
)
from processor.agent.tool_history import tool_history
from processor.core.header import call_config_equals, canonical_header, header_equals

__all__ = [
    "CONTEXT_WINDOW_EXCEEDED",
    "RUNTIME_CONTEXT_CLEARED",
    "RUNTIME_CONTEXT_FRAMING",
    "RUNTIME_CONTEXT_KIND",
    "UNLISTED_TOOLS",
    "Agent",
    "Assembly",
    "CancelHandle",
    "CompactionPlugin",
    "ContextSection",
    "EventDraft",
    "IdSequence",
    "InboxFold",
    "LogicalClock",
    "LoopPlugin",
    "ModelAdapter",
    "ModelFailure",
    "ModelReply",
    "ModelResult",
    "PreparedRoute",
    "PromptError",
    "Registration",
    "Request",
    "RequestContext",
    "RequestState",
    "RetryDecision",
    "RetryPolicy",
    "RouteUnavailable",
    "RuntimeContextProjection",
    "Scope",
    "Section",
    "StepContext",
    "StepLoop",
    "SystemPrompt",
    "SystemPromptProjection",
    "ToolContext",
    "ToolHandler",
    "ToolOutput",
    "ToolSpec",
    "TurnResult",
    "build_request",
    "call_config_equals",
    "canonical_header",
    "default_retry_policy",
    "header_equals",
    "interrupted_turn_closers",
    "join_context_sections",
    "message_text",
    "rebuild_from_log",
    "render_contexts",
    "render_prompt",
    "request_mismatches",
    "runtime_context_source",
    "tool_history",
    "user_message",
    "wall_clock",
]
