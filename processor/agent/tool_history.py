"""The tool history a request carries, folded as the runtime folds it (H-5).

A provider that keeps a cached prefix replays the tools of the header that
started the series plus every later addition; ``Request.tool_history`` is
that value.  The runtime's ``ToolHistoryProjection`` computes it, and the
request must carry exactly what the runtime would hand its provider for the
same log, so this fold follows it:

* ``request/header``: remember its tools by seq; start a new series (its
  tools become the baseline, no updates) when there is no baseline yet, the
  reason is ``series``, ``startsSeries`` is set, or a name already declared
  in the series comes back with a different JSON serialisation; the header's
  tools become the active set;
* ``developer/message``: resolve each ``tool-addition`` against the header
  named by ``headerSeq`` (a missing definition is an error), mark it declared,
  update the available names, and append ``{messageId, additions}`` -- for
  *every* developer message, also one without tool blocks (issue 17 item 12:
  the update list mirrors the developer messages of the series);
* snapshot: ``{tools, updates}``; when the active names differ from the
  available ones (logs written before tool updates existed) it is
  ``{tools: active, updates: []}``.

Pure: a function of the event list, nothing cached across calls.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from processor.core.errors import InvalidInput
from processor.core.events import Event
from processor.core.frozen import freeze, thaw
from processor.core.header import js_json

__all__ = ["ToolHistoryError", "ToolHistoryFold", "tool_history"]


class ToolHistoryError(InvalidInput, ValueError):
    """A ``tool-addition`` names a tool its header does not declare (H-5)."""

    def __init__(self, seq: int, name: str) -> None:
        self.seq = seq
        super().__init__(f"seq {seq}: tool history: missing definition for {name!r} (H-5)")


class ToolHistoryFold:
    """Incremental form of :func:`tool_history` (apply events in log order)."""

    __slots__ = (
        "_active",
        "_available",
        "_baseline",
        "_declared",
        "_headers",
        "_tools",
        "_updates",
    )

    def __init__(self) -> None:
        self._headers: dict[int, list[Any]] = {}
        self._declared: dict[str, Any] = {}
        self._active: list[Any] = []
        self._available: set[Any] = set()
        self._baseline: int | None = None
        self._tools: list[Any] = []
        self._updates: list[dict[str, Any]] = []

    def apply(self, event: Event) -> None:
        data = event.data
        if event.type == "request/header" and isinstance(data, dict):
            header = data.get("header")
            raw = header.get("tools") if isinstance(header, dict) else None
            tools = [thaw(t) for t in raw] if isinstance(raw, list | tuple) else []
            self._headers[event.seq] = tools
            redeclared = any(
                _name(t) in self._declared and js_json(self._declared[_name(t)]) != js_json(t)
                for t in tools
            )
            if (
                self._baseline is None
                or data.get("reason") == "series"
                or bool(data.get("startsSeries"))
                or redeclared
            ):
                self._baseline = event.seq
                self._declared = {_name(t): t for t in tools}
                self._tools = tools
                self._updates = []
                self._available = {_name(t) for t in tools}
            self._active = tools
        elif event.type == "developer/message" and isinstance(data, dict):
            message = data.get("message")
            content = message.get("content") if isinstance(message, dict) else None
            blocks = (
                [b for b in content if isinstance(b, dict)]
                if isinstance(content, list | tuple)
                else []
            )
            header_seq = data.get("headerSeq")
            definitions = self._headers.get(header_seq, []) if isinstance(header_seq, int) else []
            additions: list[Any] = []
            for block in blocks:
                if block.get("type") != "tool-addition":
                    continue
                name = block.get("toolName")
                tool = next((t for t in definitions if _name(t) == name), None)
                if tool is None:
                    raise ToolHistoryError(event.seq, str(name))
                additions.append(tool)
            for tool in additions:
                self._declared[_name(tool)] = tool
            for block in blocks:
                name = block.get("toolName")
                if not isinstance(name, str | int | float | bool | None):
                    continue  # not a name any header tool can carry
                if block.get("type") == "tool-addition":
                    self._available.add(name)
                elif block.get("type") == "tool-removal":
                    self._available.discard(name)
            message_id = message.get("id") if isinstance(message, dict) else None
            self._updates = [*self._updates, {"messageId": message_id, "additions": additions}]

    def snapshot(self) -> Any:
        active_names = [_name(t) for t in self._active]
        if len(active_names) != len(self._available) or any(
            n not in self._available for n in active_names
        ):
            return freeze({"tools": self._active, "updates": []})
        return freeze({"tools": self._tools, "updates": self._updates})


def _name(tool: Any) -> Any:
    return tool.get("name") if isinstance(tool, dict) else None


def tool_history(events: Iterable[Event]) -> Any:
    """The runtime's tool-history snapshot after ``events`` (deep-frozen)."""
    fold = ToolHistoryFold()
    for event in events:
        fold.apply(event)
    return fold.snapshot()
