"""``inbox``: messages spliced in for a later turn or step, not yet delivered.

``agent/inbox/spliced`` data::

    {"delivery": "next-turn" | "next-step", "messages": [message, ...]}

adds each message (with the seq that spliced it) to ``pending``.  A later
``user/message`` with the same message id delivers it and removes it.
State and view: ``{"pending": [{"seq": int, "delivery": str, "message": {...}}]}``.
Malformed payloads are ignored by this unit (the event stays in the log).
"""

from __future__ import annotations

from typing import Any

from processor.core.builtin._common import identity, require_dict
from processor.core.events import Event
from processor.core.log import SessionHeader
from processor.core.projections import ProjectionDefinition, WireView

DELIVERIES = ("next-turn", "next-step")


def init(header: SessionHeader, inherited: int) -> dict[str, Any]:
    return {"pending": []}


def apply(state: dict[str, Any], event: Event) -> dict[str, Any]:
    if event.type == "agent/inbox/spliced":
        data = event.data
        messages = data.get("messages")
        if data.get("delivery") not in DELIVERIES or not isinstance(messages, list):
            return state
        added = [{"seq": event.seq, "delivery": data["delivery"], "message": m}
                 for m in messages if isinstance(m, dict) and isinstance(m.get("id"), str)]
        return {"pending": [*state["pending"], *added]} if added else state
    if event.type == "user/message" and state["pending"]:
        mid = event.data.get("id")
        kept = [p for p in state["pending"] if p["message"]["id"] != mid]
        return {"pending": kept} if len(kept) != len(state["pending"]) else state
    return state


def validate(state: Any) -> None:
    require_dict(state, ("pending",), "inbox state")
    if not isinstance(state["pending"], list):
        raise ValueError("inbox.pending must be a list")


INBOX = ProjectionDefinition(
    key="inbox", state_version=1, init=init, apply=apply, validate_state=validate,
    wire=WireView(view=identity, validate_view=validate))
