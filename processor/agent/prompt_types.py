"""The values of prompt assembly (rule Y): sections, contexts, tools, the
assembly and its rendering inputs, and the one error type.

Kept apart from the registration logic (``prompt.py``) so the renderer and
the tool ordering can use them without importing the registry.  A tool is
projected to ``{name, description, parameters, deferLoading?}`` here, where
its shape is defined (Y-2).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeAlias

from processor.core.errors import InvalidInput

UNLISTED_TOOLS = "<unlisted-tools>"
"""Marker in a tool order that expands to every tool not listed, sorted by name (Y-3)."""

RUNTIME_CONTEXT_FRAMING = (
    "Current runtime context. This snapshot supersedes earlier runtime-context snapshots."
)
"""First line of a joined runtime-context snapshot (Y-5): tells the model older ones are stale."""

RUNTIME_CONTEXT_CLEARED = (
    "Current runtime context: none. Earlier runtime-context snapshots no longer apply."
)
"""Sent when the context goes from non-empty to empty (R-1), so stale snapshots are revoked."""

NAME_RE = re.compile(r"[a-z][a-z0-9_]*")

VariableValue: TypeAlias = str | int | float | bool | None
JsonObject: TypeAlias = dict[str, Any]


class PromptError(InvalidInput, ValueError):
    """A rule of section 7 was violated.

    ``rule`` is the rule id (``"Y-1"`` .. ``"Y-5"``); ``section`` and
    ``variable`` name the offending section/context and variable when known, so
    a failing prompt points at the contribution to fix.  ``str(err)`` is
    ``"<reason> (RULE)"``, like :class:`processor.core.errors.SessionError`.
    """

    def __init__(
        self,
        rule: str,
        reason: str,
        *,
        section: str | None = None,
        variable: str | None = None,
    ) -> None:
        self.rule = rule
        self.reason = reason
        self.section = section
        self.variable = variable
        super().__init__(f"{reason} ({rule})")


def code_unit_key(s: str) -> bytes:
    """Sort key comparing strings by UTF-16 code units, as JavaScript does.

    Python compares code points, which orders astral characters (U+10000+)
    after U+E000..U+FFFF; the reference harness compares UTF-16 code units,
    where surrogates (0xD800..) sort *before* U+E000.  Big-endian UTF-16 bytes
    compare exactly like code-unit sequences.  ``surrogatepass`` keeps lone
    surrogates sortable instead of crashing.
    """
    return s.encode("utf-16-be", "surrogatepass")


@dataclass(frozen=True)
class AssembleContext:
    """What a dynamic text sees: the assembled scope and the merged variables.

    ``scope_chain`` is far-to-near (root scope first, the assembled scope
    last); it is empty for the global assembly.
    """

    scope: str | None
    scope_chain: tuple[str, ...]
    variables: Mapping[str, VariableValue]


DynamicText: TypeAlias = Callable[[AssembleContext], str]


def _check_order(kind: str, name: str, order: float) -> None:
    """Orders must be real numbers: NaN would make the sort non-deterministic."""
    if isinstance(order, bool) or not isinstance(order, int | float):
        raise TypeError(f"{kind} {name!r}: order must be a number, got {order!r}")
    if isinstance(order, float) and not math.isfinite(order):
        raise ValueError(f"{kind} {name!r}: order must be a finite number")


def _check_text(kind: str, name: str, text: object) -> None:
    if not (isinstance(text, str) or callable(text)):
        raise TypeError(f"{kind} {name!r}: text must be a str or a callable")


@dataclass(frozen=True)
class Section:
    """A system-prompt section contribution (Y-1).

    ``text`` is a str or a callable evaluated once per assemble (Y-2).
    ``interpolate=False`` keeps the text literal (Y-4), for prose that shows
    ``{{...}}`` on purpose.  ``complete=True`` means "this section is the whole
    prompt" (e.g. a sub-agent with a self-contained prompt); at most one may be
    active (Y-3).
    """

    name: str
    order: float
    text: str | DynamicText
    interpolate: bool = True
    complete: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"section name must be a non-empty str, got {self.name!r}")
        _check_order("section", self.name, self.order)
        _check_text("section", self.name, self.text)


@dataclass(frozen=True)
class ContextSection:
    """A runtime-context contribution (Y-1, Y-5): rendered as user-role input.

    Contexts are always interpolated (there is no literal flag in the spec).
    """

    name: str
    order: float
    text: str | DynamicText

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"context name must be a non-empty str, got {self.name!r}")
        _check_order("context", self.name, self.order)
        _check_text("context", self.name, self.text)


@dataclass(frozen=True)
class ToolSpec:
    """A tool definition offered by a tools provider.

    ``defer_loading`` maps to the wire key ``deferLoading`` and is written only
    when ``True`` (``False`` means the default, as for the runtime).
    """

    name: str
    description: str
    parameters: Mapping[str, Any] = field(default_factory=dict)
    defer_loading: bool | None = None

    def to_json(self) -> JsonObject:
        """The projected wire form (Y-2): only the four keys, parameters deep-copied."""
        return project_tool(
            {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
                "deferLoading": self.defer_loading,
            }
        )


ToolLike: TypeAlias = ToolSpec | Mapping[str, Any]
ToolsProvider: TypeAlias = Callable[[], Iterable[ToolLike]]


@dataclass(frozen=True)
class AssembledSection:
    """A section in an :class:`Assembly`: its dynamic text already evaluated."""

    name: str
    order: float
    text: str
    interpolate: bool = True
    complete: bool = False


@dataclass(frozen=True)
class AssembledContext:
    """A context in an :class:`Assembly`: its dynamic text already evaluated."""

    name: str
    order: float
    text: str


@dataclass(frozen=True)
class Assembly:
    """The result of :meth:`SystemPrompt.assemble` (Y-2).

    Immutable so a hook cannot mutate an assembly another hook (or a cache)
    still holds: hooks return a new one (``dataclasses.replace``).  ``tools``
    are plain JSON dicts ready for the request header (fresh copies per
    assemble); ``variables`` is a read-only mapping.
    """

    sections: tuple[AssembledSection, ...] = ()
    contexts: tuple[AssembledContext, ...] = ()
    tools: tuple[JsonObject, ...] = ()
    variables: Mapping[str, VariableValue] = field(default_factory=lambda: MappingProxyType({}))


AssembleHook: TypeAlias = Callable[[Assembly], Assembly]


def project_tool(tool: object) -> JsonObject:
    """Keep only name/description/parameters/deferLoading, parameters deep-copied (Y-2).

    Providers may hand over live objects (with handlers and caches); the header
    must be plain JSON that no later mutation of the provider can change.
    """
    if not isinstance(tool, Mapping):
        raise TypeError(f"a tool must be a ToolSpec or a mapping, got {type(tool).__name__}")
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise PromptError("Y-2", f"tool name must be a non-empty str, got {name!r}")
    description = tool.get("description")
    if not isinstance(description, str):
        raise PromptError("Y-2", f"tool {name!r}: description must be a str")
    parameters = tool.get("parameters")
    if not isinstance(parameters, Mapping):
        raise PromptError("Y-2", f"tool {name!r}: parameters must be a JSON object")
    defer = tool.get("deferLoading")
    if defer is not None and not isinstance(defer, bool):
        raise PromptError("Y-2", f"tool {name!r}: deferLoading must be a bool")
    out: JsonObject = {
        "name": name,
        "description": description,
        "parameters": _clone_json(parameters, name),
    }
    if defer is True:  # only a true flag is kept (issue 17 item 2, the runtime's projection)
        out["deferLoading"] = True
    return out


def _clone_json(value: object, tool: str) -> Any:
    """Deep copy into plain JSON (the structuredClone of the reference)."""
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PromptError("Y-2", f"tool {tool!r}: parameters contain a non-finite number")
        return value
    if isinstance(value, Mapping):
        out: JsonObject = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise PromptError("Y-2", f"tool {tool!r}: parameters have a non-str key {key!r}")
            out[key] = _clone_json(item, tool)
        return out
    if isinstance(value, list | tuple):
        return [_clone_json(item, tool) for item in value]
    raise PromptError(
        "Y-2", f"tool {tool!r}: parameters contain a non-JSON value ({type(value).__name__})"
    )
