"""A newly assigned partition's store fill, off the assignment callback (issue 13).

The assignment only verifies each partition's stored position (one record
read) and opens a :class:`FillJob`; the group consumer assigns the partition
*paused*.  The poll loop then calls :meth:`BackgroundFill.step` once per
iteration: a bounded slice (``FILL_SLICE`` records or ``SLICE_S``) read by
the fill's own consumer and applied to the store — the mirror's fill
(``store/mirror_fill.py``, which the query cache's fill is too).  A partition whose job
reached the end is handed back (``rebalance.py`` runs the anchor check and
the start-offset override, then resumes it): until then it folds nothing,
while every other partition keeps folding between slices.

Why slices in the poll loop, not a thread: the fill's network reads already
happen in the client's own (C) threads — its prefetch queue fills while the
loop folds — so a Python thread would only move the decode-and-apply of the
slice, which holds the GIL anyway.  Slices keep one thread owning the engine,
the group consumer and the fill consumer, need no result queue and no
cross-thread cancel: a revoke, run on the loop thread inside ``consume``,
just drops the job (:meth:`cancel`) between two slices.  The cost is the
slice's time added to the other partitions' poll interval (bounded by
``SLICE_S``).

The store stays a verified cache: each slice's records and the position
they reach are one store transaction, so a cancelled (revoked, lost, crashed)
fill leaves a shorter but consistent store that the next assignment
verifies and catches up.

A fill that stalls (no progress for ``STALL_S``: the broker stopped serving
the partition) or whose read fails with a transient error is *put off*
(``mirror_fill.py``) like a restore the broker did not answer
(``rebalance.py``): the partition stays assigned and paused, ``/readyz``
names it and why, and after a back-off the whole restore runs again — the
store's position verified anew, a new fill consumer.  The retries are
unbounded in count; each one is logged and counted in
``processor_restore_waits_total``, whose alert fires when they go on.  Only
a permanent read error ends the run, after ``MAX_ATTEMPTS``.

Why a session is not folded before its partition's fill ends (issue 13 asks
"as soon as the session is loaded"): a compacted topic is read oldest
first, and a session's newest checkpoint can be any record up to the end, so
until the end is read no session is known to be complete; the anchor check
needs the partition's newest checkpoint, the last record read; and the
events behind the committed offset are consumed in partition order, so one
unloaded session would hold back every later event of the partition anyway.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Iterable

from confluent_kafka import KafkaError, KafkaException

from processor.kafka.transport import Msg, Reader
from processor.service.store.checkpoint_store import (
    CheckpointStore,
    Filled,
    StoreUnusable,
    is_corrupt,
    stored_records,
)
from processor.service.store.local_store import StoredRecord
from processor.service.store.mirror_fill import STALL_S as STALL_S
from processor.service.store.mirror_fill import FillJob as FillJob
from processor.service.store.mirror_fill import MirrorFill
from processor.telemetry.metrics import Metrics
from processor.testing import faultpoints

log = logging.getLogger(__name__)


def newest(batch: list[Msg]) -> list[Msg]:
    """The slice's newest record of each key, in offset order.

    The checkpoints topic is compacted and the store keeps one record per key:
    applying a key's newest record of a contiguous range leaves the store as
    applying all of them in order would (a tombstone last deletes, a value
    last replaces), and the range's last record is among them (the store's
    digest of it).  A busy session writes its checkpoint at every commit, so
    a store behind by a minute read thousands of records for a few dozen keys:
    each decoded (its quarantine flag) and written before the partition could
    fold (the rolling restart's longest restores, issue 37).
    """
    last: dict[bytes | None, Msg] = {}
    for m in batch:
        last[m.key()] = m
    if len(last) == len(batch):
        return batch
    return sorted(last.values(), key=lambda m: m.offset() or 0)


class BackgroundFill(MirrorFill):
    """The store's open fill jobs and their consumer; driven by the poll loop (see
    the docstring)."""

    def __init__(
        self,
        store: CheckpointStore,
        metrics: Metrics,
        reader: Callable[[], Reader],
        clock: Callable[[], float] = time.monotonic,
        stall_s: float = STALL_S,
        *,
        reports: bool = True,
    ) -> None:
        """``reports``: the jobs are the member's background fill, named on
        ``/readyz`` and in the gauges (not a rewind's fill, :meth:`run`)."""
        super().__init__(store.topic, reader, clock, stall_s)
        self.store = store
        self.metrics = metrics
        self.reports = reports
        self._big_cache = False  # the store's larger page cache while filling from zero

    def start(self, verify_reader: Reader, partitions: list[int]) -> None:
        """Verify the partitions' stored positions and open their jobs."""
        positions = self.store.positions(verify_reader, partitions)
        now = self.clock()
        jobs = []
        for p in partitions:
            start, high, kept = positions[p]
            job = FillJob(p, start, high, kept, started=now, progress_at=now, absolute=True)
            jobs.append(job)
            if kept is None and not self._big_cache and self.store.store is not None:
                self.store.store.filling(True)
                self._big_cache = True
        self.open(jobs)

    def run(self, verify_reader: Reader, partitions: list[int]) -> dict[int, Filled]:
        """Fill ``partitions`` to the end at once: the rewind after an abort (its
        partitions fold nothing meanwhile), with a fill of its own.  A stall or a
        transient read error raises the transient error the rewind puts its
        restore off with (``rebalance.py``), as a restore the broker did not answer."""
        try:
            self.start(verify_reader, partitions)
            done: dict[int, Filled] = {}
            while self.jobs:
                done.update(self.step())
                off = [j.put_off for j in self.jobs.values() if j.retry_at is not None]
                if off:
                    raise KafkaException(KafkaError(KafkaError._TIMED_OUT, off[0]))
            return done
        finally:
            self.close()

    def step(self) -> dict[int, Filled]:  # type: ignore[override]
        """One bounded slice of every open job; the jobs that reached the end."""
        return {p: Filled(j.kept_from, j.read) for p, j in super().step().items()}

    def _write(self, job: FillJob, batch: list[Msg], next_offset: int) -> bool:
        """Apply one slice; False: the write failed and the job starts over in memory."""
        records: Iterable[StoredRecord] = stored_records(
            self.store.codec, ((m.offset() or 0, m.key(), m.value()) for m in newest(batch))
        )
        db = self.store.db(job.partition)
        try:
            db.apply(
                self.store.topic,
                job.partition,
                self.store.topic_id,
                records,
                next_offset,
                recount=True,
            )
        except sqlite3.Error as exc:
            # sessions would load from a store missing records: never guess.  A
            # full disk (or an I/O error) moves the partition to memory — nothing
            # of it is folded yet — and fills it again from zero; a corrupt file
            # ends the run, removed (checkpoint_store.py)
            why = f"write failed while filling: {exc}"
            if is_corrupt(exc) or not self.store.move_to_memory(job.partition, why):
                raise self.store.unusable(exc, f"filling partition {job.partition}") from exc
            self.restart(job, f"{why}; refilling in memory")
            return False
        return True

    def _counted_waits(self, count: int) -> None:
        if self.reports:  # a rewind's is counted once, when the restore is put off
            self.metrics.restore_waits.inc(count)

    def _counted_failure(self) -> None:
        self.metrics.fill_failures.inc()

    def _counted_read(self, count: int) -> None:
        self.metrics.store_records_read.inc(count)

    def _failed_for_good(self, partition: int, why: str) -> None:
        raise StoreUnusable(why)

    def _before_read(self) -> None:
        if self.reports:  # the member's background fill (not a rewind's)
            faultpoints.hit(faultpoints.BEFORE_FILL_READ)

    def _slice_applied(self) -> None:
        if self.reports:
            faultpoints.hit(faultpoints.FILL_SLICE_APPLIED)

    def _report(self) -> None:
        if self.reports:
            self.metrics.partitions_filling.set(len(self.jobs))
            health = self.metrics.health
            # every partition's, not the first: /readyz names each (bounded there)
            health.fill_problems = tuple(
                j.problem for _, j in sorted(self.jobs.items()) if j.problem is not None
            )
            health.filling = len(self.jobs)
        if not self.jobs and self._big_cache and self.store.store is not None:
            self.store.store.filling(False)
            self._big_cache = False
