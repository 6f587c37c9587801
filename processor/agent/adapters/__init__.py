"""The model-adapter contract of the step loop (docs/session-semantics.md §10, F-2).

An adapter is called in two phases per attempt:

1. ``prepare_call(RequestContext) -> PreparedRoute``: pick the provider and
   model for *this* attempt, resolve the request config (including the
   adapter's own defaults) and say what the route can do
   (``in_history_system_prompt``, ``tool_updates``).  The loop uses these
   capabilities to admit the system prompt (R-4, R-5) and to decide whether
   a tool change starts a new request series.
2. ``stream(Request) -> ModelResult``: run the model on the frozen request.

The route remembers the adapter that prepared it and the loop dispatches to
``route.adapter`` — never to whatever adapter the agent holds at dispatch time
— so the config, the logged header and the actual call of one attempt always
belong to the same provider (F-2).

Results are plain frozen values: :class:`ModelReply` (the assistant message
content, usage, stop reason) or :class:`ModelFailure` (what went wrong, and
whether trying again can help).  Adapters are synchronous here because the
core is pure; a network adapter would wrap its stream the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol

from processor.core.frozen import FrozenDict, FrozenList, freeze

__all__ = [
    "CONTEXT_WINDOW_EXCEEDED",
    "CancelHandle",
    "ModelAdapter",
    "ModelFailure",
    "ModelReply",
    "ModelResult",
    "PreparedRoute",
    "Request",
    "RequestContext",
    "StopReason",
    "SystemPromptUpdate",
]

CONTEXT_WINDOW_EXCEEDED: Final = "context-window-exceeded"
"""``ModelFailure.code`` of a request that does not fit the route's context window."""

StopReason = str

SystemPromptUpdate = Literal["in-history", "consolidate"]
"""How a route takes a changed system prompt: appended later in the history, or
consolidated into the head (the runtime's ``PreparedLlmCall.systemPromptUpdate``)."""

_FROM_CAPABILITY: Final = "from-capability"
"""``"stop"`` (final answer), ``"tool-calls"`` or ``"max-tokens"`` (truncated)."""


def _frozen_mapping(value: Mapping[str, Any]) -> FrozenDict:
    frozen = freeze(dict(value))
    assert isinstance(frozen, FrozenDict)
    return frozen


@dataclass(frozen=True, slots=True)
class RequestContext:
    """What the loop tells ``prepare_call`` about the attempt it is preparing.

    ``config`` is the agent's requested model config (camelCase keys of the
    header config: ``provider``, ``model``, ``reasoningEffort``,
    ``temperature``, ``maxTokens``, ``stop``), any of them absent; the
    adapter fills in the rest.  ``previous_failure`` is the failure of the
    preceding attempt of the same step, so a router can fall back.
    """

    turn: int
    step: int
    attempt: int
    config: Mapping[str, Any] = field(default_factory=dict)
    previous_failure: ModelFailure | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "config", _frozen_mapping(self.config))


@dataclass(frozen=True, slots=True, eq=False)
class PreparedRoute:
    """One attempt's route: where the call goes and what that route supports.

    ``config`` is the resolved header config (always with ``provider`` and
    ``model``); ``adapter_defaults`` the adapter-default flags of the header
    (H-1: only true flags are kept there).  ``in_history_system_prompt``:
    the provider accepts system messages later in the history (so a changed
    prompt can be appended, R-4).  ``tool_updates``: the provider accepts
    tool-addition/removal developer messages (so a tool change need not
    restart the request series).  ``context_window`` is logged in
    ``request/context`` (H-4).  ``system_prompt_update`` is the mode the
    route declares and ``request/context`` records (H-4): ``"in-history"``,
    ``"consolidate"``, or ``None`` for a route that declares none (then the
    prompt consolidates); left out, it follows ``in_history_system_prompt``.
    """

    adapter: ModelAdapter
    config: Mapping[str, Any]
    adapter_defaults: Mapping[str, bool] = field(default_factory=dict)
    context_window: int | None = None
    in_history_system_prompt: bool = True
    tool_updates: bool = True
    name: str = ""
    system_prompt_update: SystemPromptUpdate | Literal["from-capability"] | None = _FROM_CAPABILITY

    def __post_init__(self) -> None:
        mode = self.system_prompt_update
        if mode == _FROM_CAPABILITY:
            mode = "in-history" if self.in_history_system_prompt else "consolidate"
        elif mode not in ("in-history", "consolidate", None):
            raise ValueError(
                f"system_prompt_update must be in-history or consolidate, not {mode!r}"
            )
        object.__setattr__(self, "system_prompt_update", mode)
        # the runtime's inHistory is exactly systemPromptUpdate === 'in-history'
        object.__setattr__(self, "in_history_system_prompt", mode == "in-history")
        config = _frozen_mapping(self.config)
        if not isinstance(config.get("provider"), str) or not isinstance(config.get("model"), str):
            raise ValueError("a prepared route's config needs string provider and model")
        object.__setattr__(self, "config", config)
        object.__setattr__(self, "adapter_defaults", _frozen_mapping(self.adapter_defaults))

    @property
    def provider(self) -> str:
        provider: str = self.config["provider"]
        return provider

    @property
    def model(self) -> str:
        model: str = self.config["model"]
        return model


@dataclass(frozen=True, slots=True)
class ModelReply:
    """A finished model stream: assistant content blocks, usage and stop reason.

    ``content`` holds ``text`` and ``tool-call {id, name, arguments}`` blocks
    (any other block passes through to the logged message untouched).
    """

    content: tuple[Any, ...]
    usage: Mapping[str, int] | None = None
    stop_reason: StopReason = "stop"

    def __post_init__(self) -> None:
        object.__setattr__(self, "content", tuple(freeze(b) for b in self.content))
        if self.usage is not None:
            object.__setattr__(self, "usage", _frozen_mapping(self.usage))

    @property
    def tool_calls(self) -> tuple[Any, ...]:
        return tuple(
            b for b in self.content if isinstance(b, dict) and b.get("type") == "tool-call"
        )


@dataclass(frozen=True, slots=True)
class ModelFailure:
    """A failed attempt: logged as ``assistant/attempt`` (F-3).

    ``retryable`` is the adapter's opinion (overloaded, rate limited, network);
    the loop's retry policy has the last word.  A context-window overflow has
    ``code == CONTEXT_WINDOW_EXCEEDED`` and is not retryable as is — only a
    compaction plugin that shrinks the surface makes a retry meaningful.
    """

    code: str
    message: str = ""
    retryable: bool = True

    @property
    def context_overflow(self) -> bool:
        return self.code == CONTEXT_WINDOW_EXCEEDED

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "retryable": self.retryable}


ModelResult = ModelReply | ModelFailure


class CancelHandle:
    """The one live part of a request: a flag the adapter may poll (F-2)."""

    __slots__ = ("_cancelled",)

    def __init__(self) -> None:
        self._cancelled = False

    def cancel(self) -> None:
        self._cancelled = True

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def __repr__(self) -> str:
        return f"CancelHandle(cancelled={self._cancelled})"


@dataclass(frozen=True, slots=True, eq=False)
class Request:
    """One attempt's request; immutable end to end (F-2).

    ``header`` is the canonical header in effect (the last ``request/header``
    of the prefix, H-1) and ``header_seq`` its seq; ``messages`` the derived
    model messages (G-2); ``tool_history`` the ``toolHistory`` view (H-5), the
    input of a provider's tool projection, not interchangeable with
    ``header["tools"]`` (the current set); ``context`` the
    ``request/context`` values of this route.  ``as_of_seq`` is the last seq
    of the log prefix the request was built from: the next event of the log is
    this attempt's ``assistant/attempt`` or ``assistant/message``.
    """

    header: Any
    header_seq: int
    messages: Any
    tool_history: Any
    context: Any
    route: PreparedRoute
    as_of_seq: int
    turn: int
    step: int
    attempt: int
    stream: str
    starts_series: bool = False
    cancel: CancelHandle = field(default_factory=CancelHandle)

    def __post_init__(self) -> None:
        for name in ("header", "messages", "tool_history", "context"):
            object.__setattr__(self, name, freeze(getattr(self, name)))
        if not isinstance(self.messages, FrozenList):
            raise TypeError("request messages must be a list")

    @property
    def tools(self) -> Any:
        """The tools of the header in effect (``[]`` when there are none)."""
        return self.header.get("tools", FrozenList())


class ModelAdapter(Protocol):
    """The two calls the loop makes per attempt (see the module docstring)."""

    def prepare_call(self, context: RequestContext) -> PreparedRoute:
        """Choose and describe the route of one attempt; may raise to fail it."""
        ...

    def stream(self, request: Request) -> ModelResult:
        """Run the model on a frozen request prepared by this adapter."""
        ...
