"""What an agent author registers: prompt, tools and their handlers, projections.

:class:`Agent` bundles the system prompt (rule Y), the tools it offers with
the handlers that answer their calls, the domain and message projections its
sessions install, and the requested model config.  The step loop
(:mod:`processor.agent.loop`) reads it once per step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from processor.agent.prompt import Assembly, Registration, Scope, SystemPrompt, ToolSpec
from processor.core.defaults import default_message_projections, default_registry
from processor.core.log import SessionHeader
from processor.core.message_projections import MessageProjection, MessageProjectionRegistry
from processor.core.projections import ProjectionRegistry
from processor.core.session import Session

__all__ = ["Agent", "ToolContext", "ToolHandler", "ToolOutput"]


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
        self.projections = projections if projections is not None else default_registry()
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
