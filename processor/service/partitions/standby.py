"""Warm standby copies: the local store of partitions this member does not own (issue 37).

A partition that moves to a member restores from that member's local store
and then reads the checkpoints topic from where the store stands
(``background_fill.py``).  A member that never owned it, or owned it long
ago, reads the whole checkpoints partition: most of each partition move in
a rolling restart (0.75-1.3 s of a ~2 s stall, BENCHMARKS.md "Failover").
With ``standby_s`` > 0 the member catches the stores of the partitions it
does not own up every ``standby_s`` seconds, in the same bounded slices as
an assignment's fill (one slice per loop iteration while no assignment fills
and the loop is not behind), so a move reads only what came since the last
catch-up.  Like Kafka Streams' ``num.standby.replicas`` set to the members
less one: every member keeps every partition.

The copies are a cache like the rest of the store: an assignment cancels the
partition's standby fill and verifies the stored position before it trusts
it (``CheckpointStore.positions``).  A standby fill never ends the run: one
that fails is dropped for ``standby_s`` with a warning, and the partitions
are tried again later; its progress is not reported on ``/readyz``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from confluent_kafka import KafkaException

from processor.core.errors import ProcessorError
from processor.kafka.transport import Reader
from processor.service.partitions.background_fill import BackgroundFill

log = logging.getLogger(__name__)


class Standby:
    """The standby fills of one member; driven by the poll loop (see the docstring)."""

    def __init__(
        self,
        fill: BackgroundFill,
        every_s: float,
        unowned: Callable[[], list[int]],
        verifier: Callable[[], Reader | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fill = fill
        self.every_s = every_s
        self.unowned = unowned  # the partitions to keep warm now ([]: none, or not yet known)
        self.verifier = verifier  # the reader that verifies stored positions
        self.clock = clock
        self.next_at = 0.0
        self.rounds = 0  # catch-ups begun (tests)

    def step(self, behind: bool) -> None:
        """One slice of the open catch-up, or begin one when due (never while behind)."""
        try:
            if self.fill.jobs:
                self.fill.step()
                return
            now = self.clock()
            reader = self.verifier()
            if behind or now < self.next_at or reader is None:
                return
            self.next_at = now + self.every_s
            parts = self.unowned()
            if parts:
                self.rounds += 1
                self.fill.start(reader, parts)
        except (KafkaException, ProcessorError, OSError) as exc:
            log.warning("standby fill failed (%s); trying again in %.0f s", exc, self.every_s)
            self.fill.close()
            self.next_at = self.clock() + self.every_s

    def cancel(self, partitions: Iterable[int]) -> None:
        """Assigned: the assignment's own fill takes the partitions over."""
        self.fill.cancel(partitions)

    def close(self) -> None:
        self.fill.close()
