"""A newly assigned partition's store fill, off the assignment callback (issue 13).

The assignment only verifies each partition's stored position (one record
read) and opens a :class:`FillJob`; the group consumer assigns the partition
*paused*.  The poll loop then calls :meth:`BackgroundFill.step` once per
iteration: a bounded slice (``FILL_SLICE`` records or ``SLICE_S``) read by
the fill's own consumer and applied to the store.  A partition whose job
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
the partition) or whose read fails with a transient error is *put off* like
a restore the broker did not answer (``rebalance.py``): the partition stays
assigned and paused, ``/readyz`` names it and why, and after a back-off the
whole restore runs again — the store's position verified anew, a new fill
consumer (one that lost its fetch state in a broker restart may stay stuck).
The retries are unbounded in count: a broker outage of any length must not
end the member (its successor would fill into the same outage); each one is
logged and counted in ``processor_restore_waits_total``, whose alert fires
when they go on.  Only a permanent read error ends the run, after
``MAX_ATTEMPTS``.

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
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from processor.kafka.reads import raise_unless_transient, records
from processor.kafka.retry import is_transient, kafka_error
from processor.kafka.transport import Msg, Reader
from processor.service.store.checkpoint_store import (
    CheckpointStore,
    Filled,
    StoreUnusable,
    is_corrupt,
    stored_records,
)
from processor.service.store.local_store import StoredRecord
from processor.telemetry.metrics import Metrics
from processor.testing import faultpoints

log = logging.getLogger(__name__)

#: Records read per slice (bounded memory and bounded pause of the loop).
FILL_SLICE = 20_000
#: Time one slice may take before it hands the loop back.
SLICE_S = 0.1
#: A fill without progress this long is put off (tried again after a back-off);
#: the default of the service's ``fill_stall_s``.
STALL_S = 120.0
#: Attempts per fill failing with a permanent read error before the run fails
#: (the process restart retries it).
MAX_ATTEMPTS = 3
#: The first and the longest pause before a restore or a fill put off
#: (:meth:`BackgroundFill.wait`, :meth:`BackgroundFill.step`) is tried again:
#: a broker back within seconds is seen soon, one that stays away costs a
#: retry deadline (or a stall) per minute, not a busy loop.
WAIT_FIRST_S = 5.0
WAIT_MAX_S = 60.0


@dataclass
class FillJob:
    """One partition's fill: from the store's position to the topic's end."""

    partition: int
    next_offset: int  # the store's position (what the slices applied)
    high: int  # the topic's committed end when the assignment came
    kept_from: int | None  # the verified stored position (None: from zero)
    started: float = 0.0  # (BackgroundFill.clock)
    progress_at: float = 0.0  # the last slice applied, or the start
    read: int = 0
    attempts: int = 1
    problem: str | None = None
    #: put off (the broker did not answer its restore, or its fill stalled): tried
    #: again at this clock time; nothing is read meanwhile
    retry_at: float | None = None
    waits: int = 0  # put off in a row without progress (the back-off doubles with each)
    put_off: str | None = None  # why it was last put off (named until it progresses)


class BackgroundFill:
    """The open fill jobs and their consumer; driven by the poll loop (see the docstring)."""

    def __init__(
        self,
        store: CheckpointStore,
        metrics: Metrics,
        reader: Callable[[], Reader],
        clock: Callable[[], float] = time.monotonic,
        stall_s: float = STALL_S,
        report: bool = True,
    ) -> None:
        self.clock = clock
        #: False: a standby fill (standby.py), on no gauge, /readyz line or wait count
        self.report = report
        self.stall_s = stall_s  # no progress this long: the fill is put off
        self.store = store
        self.metrics = metrics
        self._new_reader = reader
        self._reader: Reader | None = None
        self._assigned: set[int] = set()  # partitions the fill consumer reads
        self.jobs: dict[int, FillJob] = {}
        self._big_cache = False  # the store's larger page cache while filling from zero
        #: called with each slice's partitions and records read (tests order on it)
        self.on_slice: Callable[[dict[int, int]], None] | None = None

    @property
    def filling(self) -> set[int]:
        return set(self.jobs)

    def start(self, verify_reader: Reader, partitions: list[int]) -> None:
        """Verify the partitions' stored positions and open their jobs."""
        positions = self.store.positions(verify_reader, partitions)
        now = self.clock()
        for p in partitions:
            start, high, kept = positions[p]
            before = self.jobs.get(p)
            self.jobs[p] = FillJob(p, start, high, kept, started=now, progress_at=now)
            if before is not None and before.put_off is not None:
                # put off before: its back-off goes on, and /readyz names why
                # until the new try makes progress
                job = self.jobs[p]
                job.waits, job.put_off = before.waits, before.put_off
                job.problem = f"{before.put_off}; trying again (put off {before.waits} times)"
            if kept is None and not self._big_cache and self.store.store is not None:
                self.store.store.filling(True)
                self._big_cache = True
        self._assign([self.jobs[p] for p in partitions])
        self._report()

    def _assign(self, jobs: Iterable[FillJob]) -> None:
        todo = [j for j in jobs if j.next_offset < j.high]
        if not todo:
            return
        faultpoints.hit(faultpoints.BEFORE_FILL_READ)
        if self._reader is None:
            self._reader = self._new_reader()
        self._assigned.update(j.partition for j in todo)
        self._reader.incremental_assign(
            [
                TopicPartition(self.store.topic, j.partition, j.next_offset or OFFSET_BEGINNING)
                for j in todo
            ]
        )

    def _unassign(self, partitions: Iterable[int]) -> None:
        # only what was assigned: the client refuses to unassign anything else
        mine = sorted(set(partitions) & self._assigned)
        if self._reader is not None and mine:
            self._assigned.difference_update(mine)
            self._reader.incremental_unassign([TopicPartition(self.store.topic, p) for p in mine])
        if not self._assigned:
            # the consumer lives while it reads something: a revoke or a put-off
            # leaves no idle client (connections, prefetch) behind
            self._close_reader()

    def _close_reader(self) -> None:
        reader, self._reader = self._reader, None
        self._assigned.clear()
        if reader is not None:
            reader.close()

    def _new_reader_for(self, partitions: list[int]) -> None:
        """Put-off partitions leave: the others go on with a new fill consumer, so the
        put-off ones' next try reads with a new one too (never the stuck client)."""
        self._unassign(partitions)
        others = [self.jobs[p] for p in sorted(self._assigned) if p in self.jobs]
        self._close_reader()
        self._assign(others)

    def wait(self, partitions: Iterable[int], why: str) -> None:
        """The restore of ``partitions`` could not read the broker within the retry
        deadline: hold them (paused by the caller, nothing read) and try again
        after a back-off; ``/readyz`` names the partition and the error meanwhile.

        Not an exit: a broker restart outlasting the deadline would otherwise
        end every member restoring then, and their successors would restore
        into the same outage.
        """
        parts = sorted(set(partitions))
        self._put_off(parts, "restore", f"put off: {why}")
        self._unassign(parts)
        self._report()

    def _put_off(self, parts: list[int], kind: str, why: str) -> None:
        """Hold ``parts`` until their back-off is over: "<kind> of <topic>[p] <why>"
        in the log and on ``/readyz``, and counted (each try reported)."""
        now = self.clock()
        if self.report:
            self.metrics.restore_waits.inc(len(parts))
        for p in parts:
            job = self.jobs.get(p) or FillJob(p, 0, 0, None)
            job.waits += 1
            delay = min(WAIT_MAX_S, WAIT_FIRST_S * 2.0 ** (job.waits - 1))
            job.retry_at = now + delay
            job.put_off = f"{kind} of {self.store.topic}[{p}] {why}"
            job.problem = f"{job.put_off}; retrying in {delay:.0f} s (put off {job.waits} times)"
            self.jobs[p] = job
            log.warning("%s", job.problem)

    def due(self) -> list[int]:
        """Partitions put off whose back-off is over (the caller restores them again)."""
        now = self.clock()
        return sorted(
            p for p, j in self.jobs.items() if j.retry_at is not None and j.retry_at <= now
        )

    def cancel(self, partitions: Iterable[int]) -> None:
        """Revoked or lost while filling: stop; the store keeps the applied slices."""
        gone = [p for p in partitions if self.jobs.pop(p, None) is not None]
        if gone:
            self._unassign(gone)
            log.info("fill of partitions %s cancelled; the store keeps what was applied", gone)
            self._report()

    def close(self) -> None:
        self.jobs.clear()
        self._assigned.clear()
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self._report()

    # ------------------------------------------------------------ the slice

    def step(self) -> dict[int, Filled]:
        """One bounded slice of every open job; the jobs that reached the end."""
        live = {p: j for p, j in self.jobs.items() if j.retry_at is None}
        done = {p: j for p, j in live.items() if j.next_offset >= j.high}
        if len(done) < len(live) and self._reader is not None:
            try:
                done.update(self._slice(self._reader))
            except KafkaException as exc:
                reading = sorted(set(live) - set(done))
                if not is_transient(exc):
                    self._failed(reading, str(exc))
                else:  # the broker not answering: as a stall, never the end of the run
                    err = kafka_error(exc)
                    line = f"{err.name()}: {err.str()}" if err is not None else str(exc)
                    self._put_off(reading, "fill", f"put off: read failed: {line}")
                    self._new_reader_for(reading)
                    self._report()
        now = self.clock()
        stalled = sorted(
            p
            for p, j in live.items()
            if p not in done and j.retry_at is None and now - j.progress_at > self.stall_s
        )
        if stalled:
            self._put_off(stalled, "fill", f"stalled: no progress for {self.stall_s:.0f} s")
            self._new_reader_for(stalled)
            self._report()
        finished = {}
        for p, j in done.items():
            self.jobs.pop(p, None)
            finished[p] = Filled(j.kept_from, j.read)
        if done:
            self._unassign([p for p in done])
            self._report()
        return finished

    def _slice(self, reader: Reader) -> dict[int, FillJob]:
        pending: dict[int, list[Msg]] = {}
        ended: dict[int, FillJob] = {}
        deadline = time.monotonic() + SLICE_S
        count = 0

        def live(m: Msg) -> FillJob | None:
            p = m.partition() or 0
            job = self.jobs.get(p)
            if job is None or job.retry_at is not None or p in ended:
                return None  # a cancelled (or put off) job's prefetched records
            return job

        def on_end(m: Msg) -> None:
            job = live(m)
            # the last offsets may be transaction markers: the end is the end; one
            # below the verified end (a new leader's high watermark catching up)
            # is not, or the store skips what lies between
            if job is not None and (m.offset() or 0) >= max(job.next_offset, job.high):
                ended[job.partition] = job

        def on_error(m: Msg, err: KafkaError) -> None:
            if live(m) is not None:
                raise_unless_transient(m, err)

        while count < FILL_SLICE and time.monotonic() < deadline:
            msgs = reader.consume(num_messages=FILL_SLICE - count, timeout=0.01)
            if not msgs:
                break
            for m in records(msgs, on_end=on_end, on_error=on_error):
                job = live(m)
                if job is None:
                    continue
                p = job.partition
                offset = m.offset() or 0
                if offset < job.next_offset:
                    continue
                pending.setdefault(p, []).append(m)
                count += 1
                if offset >= job.high - 1:
                    ended[p] = job
            if len(ended) == sum(j.retry_at is None for j in self.jobs.values()):
                break
        read: dict[int, int] = {}
        for p, batch in pending.items():
            job = self.jobs[p]
            last = (batch[-1].offset() or 0) + 1
            if self._apply(job, batch, max(last, job.high) if p in ended else last):
                read[p] = len(batch)
            else:
                ended.pop(p, None)  # refilled from zero in memory
        for p, job in list(ended.items()):
            if p not in pending and not self._apply(job, [], job.high):
                ended.pop(p)
        if read:
            faultpoints.hit(faultpoints.FILL_SLICE_APPLIED)
            if self.on_slice is not None:
                self.on_slice(read)
        return ended

    def _apply(self, job: FillJob, batch: list[Msg], next_offset: int) -> bool:
        """Apply one slice; False: the write failed and the job starts over in memory."""
        records: Iterable[StoredRecord] = stored_records(
            self.store.codec, ((m.offset() or 0, m.key(), m.value()) for m in batch)
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
            self._restart(job, why)
            return False
        if batch:
            # progress since the last put-off: the next one backs off from the
            # first pause again (a long fill with scattered hiccups waited the
            # longest back-off after each); still counted in restore_waits
            job.waits, job.put_off = 0, None
        job.next_offset = next_offset
        job.read += len(batch)
        job.progress_at = self.clock()
        job.problem = None
        self.metrics.store_records_read.inc(len(batch))
        return True

    def _restart(self, job: FillJob, why: str) -> None:
        """Fill ``job`` again from offset zero (its partition moved stores)."""
        self.metrics.fill_failures.inc()
        job.problem = f"fill of {self.store.topic}[{job.partition}]: {why}; refilling in memory"
        log.warning("%s", job.problem)
        job.next_offset, job.kept_from, job.read = 0, None, 0
        job.progress_at = self.clock()
        self._unassign([job.partition])
        self._assign([job])
        self._report()

    def _failed(self, partitions: list[int], why: str) -> None:
        """A permanent read error: report; retry from the store's position, up to
        ``MAX_ATTEMPTS`` (a misconfiguration, not an outage: waiting would not help)."""
        for p in partitions:
            job = self.jobs[p]
            job.attempts += 1
            self.metrics.fill_failures.inc()
            if job.attempts > MAX_ATTEMPTS:
                raise StoreUnusable(
                    f"fill of {self.store.topic}[{p}] failed {MAX_ATTEMPTS} times: {why}"
                )
            job.problem = (
                f"fill of {self.store.topic}[{p}] failed ({why}); "
                f"retry {job.attempts}/{MAX_ATTEMPTS}"
            )
            log.warning("%s", job.problem)
            job.progress_at = self.clock()
        self._unassign(partitions)
        self._assign(self.jobs[p] for p in partitions)
        self._report()

    def _report(self) -> None:
        if not self.report:
            if not self.jobs and self._big_cache and self.store.store is not None:
                self.store.store.filling(False)
                self._big_cache = False
            return
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
