"""``inbox``: the agent's two pending-input queues, folded from the log.

The runtime keeps user input that waits for a turn or a step in two queues and
logs every change to them as an ``agent/inbox/spliced`` event::

    {"target": "next-turn" | "next-step", "start": int, "removedCount"?: int,
     "inserted": [user message, ...], "outcome"?: "canceled"}

which applies ``queue[start:start + removedCount] = inserted`` (sending a
message inserts it; claiming it at a step boundary, or cancelling it, removes
it).  The queues are therefore a fold of the log: pending input survives a
crash and every reader sees the runtime's queues.

State and view (the same deep-frozen JSON object)::

    {"next-turn": [message, ...], "next-step": [message, ...]}

Decisions where the runtime's load path is silent (it does not check log-only
payloads): a splice that is not of that shape, or whose ``start`` /
``removedCount`` fall outside its queue, leaves the state unchanged (the
event stays in the log; the agent itself refuses such a log on resume).
Irrelevant events and splices that change nothing return the same object
(P-1).  stateVersion 3: version 2 folded our earlier ``{delivery, messages}``
payload.
"""

from __future__ import annotations

from typing import Any

from processor.core.builtin._common import identity, require_dict, require_list
from processor.core.events import Event, is_seq
from processor.core.frozen import freeze
from processor.core.log import SessionHeader
from processor.core.projections import ProjectionDefinition, WireView

KEY = "inbox"
TARGETS = ("next-turn", "next-step")


def init(header: SessionHeader, inherited: int) -> Any:
    return freeze({t: [] for t in TARGETS})


def _count(value: Any) -> int | None:
    return value if type(value) is int and is_seq(value) else None


def apply(state: Any, event: Event) -> Any:
    if event.type != "agent/inbox/spliced":
        return state
    data = event.data
    if not isinstance(data, dict) or data.get("target") not in TARGETS:
        return state
    target = data["target"]
    queue = state[target]
    start, removed = _count(data.get("start")), _count(data.get("removedCount", 0))
    inserted = data.get("inserted")
    if (
        start is None
        or removed is None
        or start + removed > len(queue)
        or not isinstance(inserted, list)
    ):
        return state
    if removed == 0 and not inserted:
        return state
    return freeze({**state, target: [*queue[:start], *inserted, *queue[start + removed :]]})


def validate(state: Any) -> None:
    require_dict(state, TARGETS, "inbox state")
    for target in TARGETS:
        require_list(state[target], f"inbox.{target}")


INBOX = ProjectionDefinition(
    key=KEY,
    state_version=3,
    init=init,
    apply=apply,
    validate_state=validate,
    wire=WireView(view=identity, validate_view=validate),
    event_types=frozenset({"agent/inbox/spliced"}),
)
