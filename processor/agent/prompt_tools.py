"""Tools of an assembly: merged from the layers, then put in order (Y-2, Y-3)."""

from __future__ import annotations

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


def collect_tools(providers: Iterable[ToolsProvider]) -> list[JsonObject]:
    """Tools from every layer of the chain, merged; duplicate names are an error.

    Duplicates are refused rather than shadowed because two providers offering
    the same tool name would give the model two schemas for one call (kept on
    purpose, unlike the runtime: see prompt.py's docstring, issue 17 item 3).
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
                raise PromptError("Y-2", f"tool {name!r} is offered by more than one provider")
            seen.add(name)
            tools.append(projected)
    return tools


def order_tools(tools: list[JsonObject], order: tuple[str, ...] | None) -> list[JsonObject]:
    """Sort tools by name, or by an explicit order with the unlisted marker (Y-2, Y-3).

    A deterministic order keeps header equality and provider prompt-cache
    prefixes stable (it does not guarantee a cache hit).
    """
    by_name = {t["name"]: t for t in tools}
    if order is None:
        return [by_name[n] for n in sorted(by_name, key=code_unit_key)]
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
            result.extend(by_name[n] for n in unlisted)
        else:
            result.append(by_name[name])
    return result
