"""Message projections — rule M.

A message projection rewrites the *content* of messages already on the
surface (image offload, redaction) in response to a durable event.  It never
adds or removes surface nodes and never changes a message's identity, so the
model context stays explainable from the log: the override is keyed by the
original seq and the event that caused it is in the log.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Protocol

from processor.core.errors import SessionError
from processor.core.events import Event


@dataclass(frozen=True, slots=True)
class ProjectionContext:
    """What a message projection may look at (M-1); all read-only.

    ``nodes`` are the current surface seqs, ``event_of(seq)`` returns an
    earlier event that is still known (every current node and every
    ``request/header``; after a checkpoint restore shadowed history is not
    retained), ``message_of(seq)`` the current (possibly already projected)
    message of a node, ``projected`` the earlier overrides.
    """

    nodes: Sequence[int]
    event_of: Callable[[int], Event | None]
    message_of: Callable[[int], Any]
    projected: Mapping[int, Any]


class MessageProjection(Protocol):
    """``{type, project(event, ctx) -> {seq: message}}`` (M-1)."""

    @property
    def type(self) -> str: ...

    def project(self, event: Event, ctx: ProjectionContext) -> Mapping[int, Any]:
        """Validate the whole decision, then return new messages by original seq.

        Raise :class:`SessionError` (with the event's seq) to reject; never
        mutate ``event`` or anything reachable from ``ctx``.
        """
        ...


class MessageProjectionRegistry:
    """One registry per session store (M-4): at most one projection per type."""

    __slots__ = ("_by_type", "removals")

    def __init__(self, projections: Sequence[MessageProjection] = ()) -> None:
        self._by_type: dict[str, MessageProjection] = {}
        #: Bumped by every unregister: only a removal can make M-4 fail, so a
        #: session that checked at this count need not check again.
        self.removals = 0
        for projection in projections:
            self.register(projection)

    def register(self, projection: MessageProjection) -> None:
        if projection.type in self._by_type:
            raise SessionError(
                None, "M-4", f"a message projection for {projection.type!r} is already registered"
            )
        self._by_type[projection.type] = projection

    def unregister(self, etype: str) -> None:
        self._by_type.pop(etype, None)
        self.removals += 1

    def get(self, etype: str) -> MessageProjection | None:
        return self._by_type.get(etype)

    def types(self) -> frozenset[str]:
        return frozenset(self._by_type)

    def has_all(self, types: AbstractSet[str]) -> bool:
        """Every type in ``types`` is registered (no set built: runs per commit)."""
        return self._by_type.keys() >= types
