"""``inbox``: user messages spliced in for a later turn or step, not yet delivered.

Accepted ``agent/inbox/spliced`` payload::

    {"delivery": "next-turn" | "next-step", "messages": [message, ...]}

where each message is a user message object (``role: "user"``, non-empty
string ``id``, ``content`` list) — exactly what the step loop later commits
as a ``user/message``.

State and view (the same deep-frozen JSON object)::

    {"pending": [{"seq": int,              # seq of the agent/inbox/spliced event
                  "delivery": "next-turn" | "next-step",
                  "message": {...}}]}      # in splice order

Folding: a splice appends its messages to ``pending``; a later
``user/message`` whose ``id`` equals a pending message's id delivers it and
removes it.  Nothing else removes a pending message — in particular not
``turn/start``: a crash between the turn start and the admission must not
lose a message (the loop admits ``next-turn`` messages at step 1 of a turn
and ``next-step`` ones at any step start).

Decisions where the spec is silent: a malformed splice (unknown delivery,
``messages`` not a list) is ignored by this unit (the event stays in the
log, and a log-only payload is not checked by rule D); so is every message
that is not a user message with a string id and a content list (it could
never be delivered, and would stay pending forever); a message whose id is
already pending is ignored (the first splice wins: re-splicing is
idempotent).  Irrelevant events return the same object (P-1).
"""

from __future__ import annotations

from typing import Any

from processor.core.builtin._common import identity, require_dict, require_list, require_seq
from processor.core.events import Event
from processor.core.frozen import freeze
from processor.core.log import SessionHeader
from processor.core.projections import ProjectionDefinition, WireView

KEY = "inbox"
DELIVERIES = ("next-turn", "next-step")


def init(header: SessionHeader, inherited: int) -> Any:
    return freeze({"pending": []})


def _deliverable(message: Any) -> bool:
    return (isinstance(message, dict) and message.get("role") == "user"
            and isinstance(message.get("id"), str) and bool(message["id"])
            and isinstance(message.get("content"), list))


def _on_splice(state: Any, event: Event) -> Any:
    data = event.data
    if not isinstance(data, dict):
        return state
    messages = data.get("messages")
    delivery = data.get("delivery")
    if delivery not in DELIVERIES or not isinstance(messages, list):
        return state
    seen = {p["message"]["id"] for p in state["pending"]}
    added = []
    for message in messages:
        if _deliverable(message) and message["id"] not in seen:
            seen.add(message["id"])
            added.append({"seq": event.seq, "delivery": delivery, "message": message})
    return freeze({"pending": [*state["pending"], *added]}) if added else state


def apply(state: Any, event: Event) -> Any:
    if event.type == "agent/inbox/spliced":
        return _on_splice(state, event)
    if event.type == "user/message" and state["pending"]:
        mid = event.data.get("id")
        kept = [p for p in state["pending"] if p["message"]["id"] != mid]
        return freeze({"pending": kept}) if len(kept) != len(state["pending"]) else state
    return state


def validate(state: Any) -> None:
    require_dict(state, ("pending",), "inbox state")
    require_list(state["pending"], "inbox.pending")
    for entry in state["pending"]:
        require_dict(entry, ("seq", "delivery", "message"), "inbox entry")
        require_seq(entry["seq"], "inbox entry seq", optional=False)
        if entry["delivery"] not in DELIVERIES:
            raise ValueError("inbox entry delivery must be next-turn or next-step")
        if not _deliverable(entry["message"]):
            raise ValueError("inbox entry message must be a user message with an id")


INBOX = ProjectionDefinition(
    key=KEY, state_version=2, init=init, apply=apply, validate_state=validate,
    wire=WireView(view=identity, validate_view=validate))
