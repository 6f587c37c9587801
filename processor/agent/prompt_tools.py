"""Tools of an assembly: merged from the layers, then put in order (Y-2, Y-3)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from processor.agent.prompt_types import (
    UNLISTED_TOOLS,
    JsonObject,
    PromptError,
    ToolSpec,
    ToolsProvider,
    code_unit_key,
    project_tool,
)

_log = logging.getLogger(__name__)


def collect_tools(providers: Iterable[ToolsProvider]) -> list[JsonObject]:
    """Tools from every layer of the chain, in provider order.

    Two providers offering the same tool name both stay, in provider order,
    as the runtime's assembly keeps them (``SystemPrompt.assemble`` collects
    every schema; issue 36 item 3); a warning names the tool.
    """
    tools: list[JsonObject] = []
    seen: set[str] = set()
    for provider in providers:
        offered = provider()
        if isinstance(offered, str | bytes | Mapping) or not isinstance(offered, Iterable):
            raise TypeError("a tools provider must return an iterable of tools")
        for tool in offered:
            projected = tool.to_json() if isinstance(tool, ToolSpec) else project_tool(tool)
            name = projected["name"]
            if name == UNLISTED_TOOLS:
                raise PromptError(
                    "Y-3", f"a tool must not be named {UNLISTED_TOOLS!r} (reserved marker)"
                )
            if name in seen:
                _log.warning("Y-2: tool %r is offered more than once; keeping each", name)
            seen.add(name)
            tools.append(projected)
    return tools


def order_tools(tools: list[JsonObject], order: tuple[str, ...] | None) -> list[JsonObject]:
    """Sort tools by name, or by an explicit order with the unlisted marker (Y-2, Y-3).

    A deterministic order keeps header equality and provider prompt-cache
    prefixes stable (it does not guarantee a cache hit).  Tools of one name
    keep their provider order (the runtime's sort is stable).
    """
    by_name: dict[str, list[JsonObject]] = {}
    for tool in tools:
        by_name.setdefault(tool["name"], []).append(tool)
    if order is None:
        return [t for n in sorted(by_name, key=code_unit_key) for t in by_name[n]]
    markers = order.count(UNLISTED_TOOLS)
    if markers != 1:
        raise PromptError(
            "Y-3", f"tool order must contain {UNLISTED_TOOLS!r} exactly once, found {markers}"
        )
    seen: set[str] = set()
    for name in order:
        if name in seen:
            raise PromptError("Y-3", f"tool order lists {name!r} more than once")
        seen.add(name)
        if name != UNLISTED_TOOLS and name not in by_name:
            raise PromptError("Y-3", f"tool order names unknown tool {name!r}")
    unlisted = sorted((n for n in by_name if n not in seen), key=code_unit_key)
    result: list[JsonObject] = []
    for name in order:
        if name == UNLISTED_TOOLS:
            result.extend(t for n in unlisted for t in by_name[n])
        else:
            result.extend(by_name[name])
    return result
