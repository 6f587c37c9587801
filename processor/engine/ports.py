"""What the engine asks of its host: feeds in the middle of a fold, and checkpoints."""

from __future__ import annotations

from typing import Protocol

from processor.codec import Checkpoint
from processor.engine.commands import Command
from processor.engine.records import Record


class Feeds(Protocol):
    """What the engine may need from the transport in the middle of a fold."""

    def control_backlog(self, partition: int) -> list[Record]:
        """Every command of ``partition`` committed so far (bounded wait)."""
        ...

    def session_history(
        self, partition: int, start: int, end: int, key: bytes
    ) -> list[Record] | None:
        """The events of ``key`` in offsets [start, end); None when unreadable."""
        ...

    def check_route(self, command: Command, partition: int) -> None:
        """Raise CommandError when a command is in a partition its key does not hash to."""
        ...


class NoFeeds:
    """No transport behind the engine: no backlog, no history, no route check."""

    def control_backlog(self, partition: int) -> list[Record]:
        return []

    def session_history(
        self, partition: int, start: int, end: int, key: bytes
    ) -> list[Record] | None:
        return None

    def check_route(self, command: Command, partition: int) -> None:
        return None


class CheckpointSource(Protocol):
    """Where a session's checkpoint is loaded from when its first event arrives
    (the local store, ``service/store/checkpoint_store.py``)."""

    def load(self, partition: int, session_id: str) -> tuple[Checkpoint | None, int]:
        """The session's newest checkpoint (None: it has none) and its encoded size."""
        ...
