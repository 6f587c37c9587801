"""The agent inbox as the runtime keeps it: pending input folded from the log.

User input reaches a turn through the inbox: sending a message logs an
``agent/inbox/spliced`` event that inserts it into one of two queues,
``next-turn`` (a prompt that opens a turn) or ``next-step`` (input for the
next step boundary), and claiming it at a step boundary logs another splice
that removes it.  The queues are therefore a fold of the log, so pending
input survives a crash and every reader sees the same queue.

Event data (the runtime's ``SessionEventMap['agent/inbox/spliced']``)::

    {"target": "next-turn" | "next-step", "start": int, "removedCount"?: int,
     "inserted": [user message, ...], "outcome"?: "canceled"}

The fold applies ``queue[start:start+removedCount] = inserted``; a start or
count outside the queue, or a message id pending twice across both queues, is
an error (the runtime refuses such a log).  Claiming at a step takes every
``next-step`` message and, at a turn's first step, the *first* ``next-turn``
message (one prompt per turn, as the runtime's driver does).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from processor.core.errors import InvalidInput
from processor.core.events import Event
from processor.core.frozen import thaw

__all__ = ["TARGETS", "InboxError", "InboxFold"]

TARGETS: Final = ("next-turn", "next-step")


class InboxError(InvalidInput, ValueError):
    """An ``agent/inbox/spliced`` event the runtime would refuse."""

    def __init__(self, seq: int, reason: str) -> None:
        self.seq = seq
        super().__init__(f"seq {seq}: invalid persisted inbox splice: {reason}")


def _is_count(value: Any) -> bool:
    return type(value) is int and 0 <= value <= 2**53 - 1


class InboxFold:
    """Both pending queues, folded from ``agent/inbox/spliced`` events."""

    __slots__ = ("queues",)

    def __init__(self, events: Iterable[Event] = ()) -> None:
        self.queues: dict[str, list[dict[str, Any]]] = {t: [] for t in TARGETS}
        for event in events:
            self.apply(event)

    @property
    def has_pending(self) -> bool:
        return any(self.queues[t] for t in TARGETS)

    def apply(self, event: Event) -> None:
        if event.type != "agent/inbox/spliced":
            return
        data = event.data
        if not isinstance(data, dict) or data.get("target") not in TARGETS:
            raise InboxError(event.seq, "target must be next-turn or next-step")
        target: str = data["target"]
        queue = self.queues[target]
        start, removed = data.get("start"), data.get("removedCount", 0)
        inserted = data.get("inserted")
        if not _is_count(start) or not _is_count(removed) or start + removed > len(queue):
            raise InboxError(event.seq, "start/removedCount outside the pending queue")
        if not isinstance(inserted, list):
            raise InboxError(event.seq, "inserted must be a list")
        new = queue[:start] + [thaw(m) for m in inserted] + queue[start + removed :]
        other = self.queues["next-step" if target == "next-turn" else "next-turn"]
        ids: set[Any] = set()
        for message in (*new, *other):
            mid = message.get("id") if isinstance(message, dict) else None
            if mid in ids:
                raise InboxError(event.seq, f"message {mid!r} is already pending")
            ids.add(mid)
        self.queues[target] = new

    def splice_data(
        self,
        target: str,
        start: int,
        delete_count: int,
        inserted: list[dict[str, Any]],
        *,
        discard: bool,
    ) -> dict[str, Any] | None:
        """The event data of a normalized splice, or None when it changes nothing.

        ``start`` past the end means the end (the runtime's splice
        normalisation); ``discard`` marks removed messages ``canceled``.
        """
        queue = self.queues[target]
        start = min(max(start, 0), len(queue))
        delete_count = min(max(delete_count, 0), len(queue) - start)
        if delete_count == 0 and not inserted:
            return None
        data: dict[str, Any] = {"target": target, "start": start}
        if delete_count:
            data["removedCount"] = delete_count
        data["inserted"] = inserted
        if discard and delete_count:
            data["outcome"] = "canceled"
        return data
