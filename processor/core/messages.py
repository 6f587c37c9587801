"""Deriving model messages and the human transcript — rule G.

The model context is derived from the surface, the human transcript from the
append-origin events.  Both borrow the frozen message objects of the events
(or of a projected override): nothing here copies or wraps content (G-3) —
framing belongs to whoever produced the message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from processor.core.events import Event
from processor.core.surface import SurfaceState

_CONTENT_OPTIONAL = frozenset({"system/message", "developer/message", "assistant/message"})


def derive_event_message(event: Event, overrides: Mapping[int, Any] | None = None) -> Any:
    """G-1: the wire message of one surface event, or None.

    A projected override wins; ``user/message`` data is the message;
    system/developer/assistant yield nothing when their content is empty (an
    empty system head keeps node 0 reserved but sends no message);
    ``tool/result`` yields its message; every other event yields nothing.
    """
    if overrides and event.seq in overrides:
        return overrides[event.seq]
    etype = event.type
    if etype == "user/message":
        return event.data
    if etype == "tool/result":
        return event.data["message"]
    if etype in _CONTENT_OPTIONAL:
        message = event.data["message"]
        return message if message["content"] else None
    return None


class DerivedMessages:
    """G-2: the derived message list, cached by ``contentGeneration``.

    Appends only extend the surface, so the cache derives just the new tail
    nodes; a rewrite (replace or projection) bumps the generation and drops the
    cache.  Every call returns a fresh list of shared immutable messages.
    """

    __slots__ = ("_derived", "_generation", "_nodes_done")

    def __init__(self) -> None:
        self._generation = -1
        self._nodes_done = 0
        self._derived: list[Any] = []

    def derive(self, state: SurfaceState) -> list[Any]:
        if state.content_generation != self._generation:
            self._generation = state.content_generation
            self._nodes_done = 0
            self._derived = []
        nodes = state.nodes
        if self._nodes_done < len(nodes):
            overrides, events = state.overrides, state.node_events
            for seq in nodes[self._nodes_done :]:
                message = derive_event_message(events[seq], overrides)
                if message is not None:
                    self._derived.append(message)
            self._nodes_done = len(nodes)
        return list(self._derived)


def transcript_entry(event: Event) -> dict[str, Any] | None:
    """G-4: the transcript entry of an append-origin surface event, or None.

    The transcript shows what a human saw when it happened, so it uses the
    event's own message (no later projection) and survives compaction.
    """
    if event.surface_op != "append":
        return None
    message = derive_event_message(event)
    if message is None:
        return None
    return {"seq": event.seq, "message": message}
