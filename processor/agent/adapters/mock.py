"""A deterministic, scripted model adapter for tests, examples and demos.

:class:`MockModelAdapter` answers every ``stream`` call with the next item of
its script and records every request it received (``adapter.requests``), so
a test can rebuild each request from the log prefix and compare (F-3).

Script items
------------
* :class:`Say` — a reply: text and/or :class:`ToolCall` s (stop reason
  ``tool-calls`` when there are calls, else ``stop``);
* :class:`MaxTokens` — a reply cut off at the token limit;
* :class:`Fail` — a failed attempt (``retryable`` by default);
* :class:`Overflow` — a context-window overflow (not retryable as is).

Every item may name the ``route`` (a key of ``routes``) that ``prepare_call``
must return for the attempt that receives the item, which is how a script
switches models or capabilities between attempts.  ``prepare_call`` peeks at
the next item; ``stream`` consumes it.

Routes
------
A :class:`MockRoute` describes a provider/model with its context window, its
capabilities (``in_history_system_prompt``, ``tool_updates``) and adapter
defaults: config keys the agent did not set are filled from ``defaults``;
the ones the runtime knows as adapter defaults (``maxTokens``,
``reasoningEffort``) are flagged in ``adapterDefaults``.

Usage is computed from the request (about four characters per token), so
replays are byte-identical.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from processor.agent.adapters import (
    CONTEXT_WINDOW_EXCEEDED,
    ModelFailure,
    ModelReply,
    ModelResult,
    PreparedRoute,
    RequestContext,
)
from processor.agent.request import Request
from processor.core.errors import InvalidInput
from processor.core.frozen import thaw
from processor.core.header import ADAPTER_DEFAULT_FLAGS, js_json

__all__ = [
    "DEFAULT_ROUTE",
    "Fail",
    "MaxTokens",
    "MockModelAdapter",
    "MockRoute",
    "MockScriptExhausted",
    "Overflow",
    "Say",
    "ScriptItem",
    "ToolCall",
]

DEFAULT_ROUTE = "default"


class MockScriptExhausted(InvalidInput, RuntimeError):
    """``stream`` was called after the last script item (and no default reply)."""


@dataclass(frozen=True, slots=True)
class MockRoute:
    """A scripted provider/model and what it supports."""

    provider: str = "mock"
    model: str = "mock-1"
    context_window: int | None = 200_000
    in_history_system_prompt: bool = True
    tool_updates: bool = True
    defaults: Mapping[str, Any] = field(default_factory=lambda: {"maxTokens": 4096})
    #: the declared mode (PreparedRoute.system_prompt_update); by default it
    #: follows ``in_history_system_prompt``
    system_prompt_update: str | None = "from-capability"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call the scripted model makes; ``id`` defaults to ``call-<n>``.

    ``arguments`` is a JSON value (serialised as ``JSON.stringify`` would) or
    the raw argument text itself (e.g. invalid JSON, to script a bad call).
    """

    name: str
    arguments: Any = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True, slots=True)
class Say:
    text: str = ""
    tool_calls: Sequence[ToolCall] = ()
    route: str | None = None


@dataclass(frozen=True, slots=True)
class MaxTokens:
    text: str = "…"
    route: str | None = None


@dataclass(frozen=True, slots=True)
class Fail:
    code: str = "overloaded"
    message: str = "the model is overloaded"
    retryable: bool = True
    route: str | None = None


@dataclass(frozen=True, slots=True)
class Overflow:
    route: str | None = None


ScriptItem = Say | MaxTokens | Fail | Overflow


def _text_len(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_text_len(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_text_len(v) for v in value)
    return 0


class MockModelAdapter:
    """Scripted :class:`~processor.agent.adapters.ModelAdapter` (see module docstring).

    ``requests`` lists every request ``stream`` received, in order;
    ``prepared`` every route ``prepare_call`` returned.  ``stream`` refuses a
    request whose route another adapter prepared (F-2): that would mean the
    loop dispatched somewhere else than where it resolved config and header.
    """

    def __init__(
        self,
        script: Sequence[ScriptItem] = (),
        *,
        routes: Mapping[str, MockRoute] | None = None,
        default_route: str = DEFAULT_ROUTE,
        default_reply: ScriptItem | None = None,
        name: str = "mock",
    ) -> None:
        self.routes: dict[str, MockRoute] = dict(routes or {DEFAULT_ROUTE: MockRoute()})
        if default_route not in self.routes:
            raise ValueError(f"default route {default_route!r} is not in routes")
        self.default_route = default_route
        self.script: list[ScriptItem] = list(script)
        self.default_reply = default_reply
        self.name = name
        self.requests: list[Request] = []
        self.prepared: list[PreparedRoute] = []
        self._calls = 0

    # -------------------------------------------------------------- script

    def push(self, *items: ScriptItem) -> None:
        """Append items to the script (drive a session turn by turn)."""
        self.script.extend(items)

    @property
    def remaining(self) -> int:
        return len(self.script)

    def _peek(self) -> ScriptItem | None:
        return self.script[0] if self.script else self.default_reply

    # -------------------------------------------------------------- adapter

    def prepare_call(self, context: RequestContext) -> PreparedRoute:
        """The route the next script item asks for (or the default route)."""
        item = self._peek()
        route_name = (item.route if item is not None else None) or self.default_route
        if route_name not in self.routes:
            raise KeyError(f"script names unknown route {route_name!r}")
        route = self.routes[route_name]
        config: dict[str, Any] = {
            k: v for k, v in thaw(context.config).items() if k not in ("provider", "model")
        }
        flags: dict[str, bool] = {}
        for key, value in route.defaults.items():
            if key not in config:
                config[key] = value
                if key in ADAPTER_DEFAULT_FLAGS:  # the markers the runtime knows
                    flags[key] = True
        prepared = PreparedRoute(
            adapter=self,
            config={"provider": route.provider, "model": route.model, **config},
            adapter_defaults=flags,
            context_window=route.context_window,
            in_history_system_prompt=route.in_history_system_prompt,
            tool_updates=route.tool_updates,
            system_prompt_update=route.system_prompt_update,  # type: ignore[arg-type]
            name=route_name,
        )
        self.prepared.append(prepared)
        return prepared

    def stream(self, request: Request) -> ModelResult:
        """Answer with the next script item; record the request first."""
        if request.route.adapter is not self:
            raise RuntimeError("F-2: request was prepared by another adapter")
        self.requests.append(request)
        if self.script:
            item = self.script.pop(0)
        elif self.default_reply is not None:
            item = self.default_reply
        else:
            raise MockScriptExhausted(
                f"{self.name}: no script item for request {len(self.requests)}"
            )
        input_tokens = max(1, _text_len(thaw(request.messages)) // 4)
        if isinstance(item, Fail):
            return ModelFailure(item.code, item.message, item.retryable)
        if isinstance(item, Overflow):
            return ModelFailure(
                CONTEXT_WINDOW_EXCEEDED,
                f"request of ~{input_tokens} tokens exceeds the context window",
                retryable=False,
            )
        content: list[Any] = [{"type": "text", "text": item.text}] if item.text else []
        stop = "max-tokens" if isinstance(item, MaxTokens) else "stop"
        if isinstance(item, Say):
            for call in item.tool_calls:
                self._calls += 1
                arguments = (
                    call.arguments if isinstance(call.arguments, str) else js_json(call.arguments)
                )
                content.append(
                    {
                        "type": "tool-call",
                        "id": call.id or f"call-{self._calls}",
                        "name": call.name,
                        "arguments": arguments,  # raw JSON text, as models produce it
                    }
                )
            if item.tool_calls:
                stop = "tool-calls"
        usage = {"inputTokens": input_tokens, "outputTokens": max(1, _text_len(content) // 4)}
        return ModelReply(tuple(content), usage=usage, stop_reason=stop)
