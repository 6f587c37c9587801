"""The retained part of one session's event log.

Offline and in the agent the whole log is kept (``base_seq == 0``).  The
service keeps only the tail after its last checkpoint: a log restored from a
checkpoint starts at ``base_seq > 0`` and every reader that needs an earlier
event must say so instead of pretending it saw the prefix (P-7).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from processor.core.events import Event

#: The metadata a session starts with (the session file's header line).
SessionHeader = dict[str, Any]


def inherited_event_count(events: Sequence[Event]) -> int:
    """The cut of a forked session: 1 + seq of the last inherited end-seed (§11)."""
    count = 0
    for ev in events:
        if (
            ev.type == "session/end-seed"
            and isinstance(ev.data, dict)
            and ev.data.get("inherited") is True
        ):
            count = ev.seq + 1
    return count


class SessionLog:
    """Contiguous events ``base_seq .. end_seq`` of one session."""

    __slots__ = ("_base", "_events")

    def __init__(self, base_seq: int = 0, events: Sequence[Event] = ()) -> None:
        self._base = base_seq
        self._events: list[Event] = []
        for ev in events:
            self.append(ev)

    @property
    def base_seq(self) -> int:
        return self._base

    @property
    def next_seq(self) -> int:
        return self._base + len(self._events)

    @property
    def end_seq(self) -> int:
        """Seq of the last event, or ``base_seq - 1`` when empty."""
        return self.next_seq - 1

    def __len__(self) -> int:
        return len(self._events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self._events)

    def append(self, event: Event) -> None:
        if event.seq != self._base + len(self._events):  # next_seq, inline: runs per event
            raise ValueError(f"log append out of order: {event.seq} != {self.next_seq}")
        self._events.append(event)

    def get(self, seq: int) -> Event | None:
        i = seq - self._base
        return self._events[i] if 0 <= i < len(self._events) else None

    def events_from(self, seq: int) -> Sequence[Event]:
        """Events with seq >= ``seq`` (seq below base_seq: from base_seq)."""
        return self._events[max(seq - self._base, 0) :]

    def trim_before(self, seq: int) -> None:
        """Forget events below ``seq`` (the service does this after a checkpoint)."""
        drop = min(max(seq - self._base, 0), len(self._events))
        if drop:
            del self._events[:drop]
            self._base += drop
