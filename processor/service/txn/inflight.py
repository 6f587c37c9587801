"""What the committer hands on: a batch committing on the helper thread, and
who rewinds partitions after an abort (``commit.py``)."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

from processor.engine import Batch, Tally
from processor.service.queries.query_cache import ViewWrite


class Rewinder(Protocol):
    """Who restores partitions after an abort (the rebalance, through the processor)."""

    def rewind(self, numbers: list[int]) -> None:
        """Restore these partitions and seek them back to the committed offsets."""
        ...


@dataclass
class InFlight:
    """A batch whose ``commit_transaction`` runs on the helper thread."""

    batch: Batch
    views: list[ViewWrite]
    tally: Tally  # the batch's decisions: counted once it committed
    t0: float  # perf_counter at the commit's start
    opened: float  # monotonic time the transaction began
    future: Future[None] = field(default_factory=Future)
    done_at: float = 0.0  # perf_counter when commit_transaction returned (helper thread)
    #: monotonic times of the commit's steps, when ``timeline`` logs (else empty)
    marks: list[tuple[str, float]] = field(default_factory=list)
    #: ms the threads were runnable but not running (``schedstat``), with ``marks``
    sched: list[tuple[str, float]] = field(default_factory=list)
