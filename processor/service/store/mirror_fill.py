"""A mirror's fill: its partitions read from a position to the topic's end, in slices.

The one fill of both mirrors of a compacted topic: the checkpoint store
(``partitions/background_fill.py``, driven by the poll loop) and the query
cache (``queries/query_cache.py``, driven by its fill thread).  A
:class:`FillJob` per partition reads from the mirror's position up to the
topic's committed end read when it opened; :meth:`MirrorFill.step` reads one
bounded slice (``FILL_SLICE`` records or ``SLICE_S``) with the fill's own
consumer and hands each partition's records to the mirror
(:meth:`MirrorFill._write`), which applies them with the position they
reach; a job that reached the end is handed back.

A fill that stalls (no progress for ``stall_s``: the broker stopped serving
the partition) or whose read fails with a transient error is *put off*: the
partition is held (nothing read), named and counted, and tried again after a
back-off (``WAIT_FIRST_S`` doubling to ``WAIT_MAX_S``) with a new consumer
(one that lost its fetch state in a broker restart may stay stuck).  The
retries are unbounded in count (a broker outage of any length must not end
the member: its successor would fill into the same outage); only a permanent
read error ends the fill, after ``MAX_ATTEMPTS``, as the mirror says
(:meth:`MirrorFill._failed_for_good`).

Records are read with the one read helper (``kafka/reads.records``); an
end-of-partition event below the end read before (a new leader's high
watermark catching up) is not the end, or the mirror would skip what lies
between.  One thread drives a fill (no locks): its consumer, its jobs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from processor.kafka.reads import raise_unless_transient, records
from processor.kafka.retry import is_transient, kafka_error
from processor.kafka.transport import Msg, Reader

log = logging.getLogger(__name__)

#: Records read per slice (bounded memory and bounded pause of the loop).
FILL_SLICE = 20_000
#: Time one slice may take before it hands the driver back.
SLICE_S = 0.1
#: A fill without progress this long is put off (tried again after a back-off);
#: the default of the service's ``fill_stall_s``.
STALL_S = 120.0
#: Attempts per fill failing with a permanent read error before it fails for good.
MAX_ATTEMPTS = 3
#: The first and the longest pause before a fill put off is tried again: a
#: broker back within seconds is seen soon, one that stays away costs a retry
#: deadline (or a stall) per minute, not a busy loop.
WAIT_FIRST_S = 5.0
WAIT_MAX_S = 60.0


@dataclass
class FillJob:
    """One partition's fill: from the mirror's position to the topic's end."""

    partition: int
    next_offset: int  # the mirror's position (what the slices applied)
    high: int  # the topic's committed end when the fill opened
    kept_from: int | None  # the verified stored position (None: from zero)
    started: float = 0.0  # (MirrorFill.clock)
    progress_at: float = 0.0  # the last slice applied, or the start
    read: int = 0
    attempts: int = 1
    problem: str | None = None
    #: put off (the broker did not answer, or the fill stalled): tried again at
    #: this clock time; nothing is read meanwhile
    retry_at: float | None = None
    waits: int = 0  # put off in a row without progress (the back-off doubles with each)
    put_off: str | None = None  # why it was last put off (named until it progresses)
    #: ``next_offset`` was read from the topic (its log start or a verified
    #: position): assigned as it is.  Else 0 means the beginning, which a new
    #: consumer looks up first (0.5 s: :meth:`MirrorFill._assign`).
    absolute: bool = False


class MirrorFill:
    """The open fill jobs of a mirror and their consumer; see the module docstring.

    A mirror subclasses it: :meth:`_write` applies a slice (required), the
    other hooks report (``_report``, ``_counted_*``) and decide what a
    permanent failure means (``_failed_for_good``)."""

    def __init__(
        self,
        topic: str,
        reader: Callable[[], Reader],
        clock: Callable[[], float] = time.monotonic,
        stall_s: float = STALL_S,
    ) -> None:
        self.topic = topic
        self.clock = clock
        self.stall_s = stall_s  # no progress this long: the fill is put off
        self._new_reader = reader
        self._reader: Reader | None = None
        self._assigned: set[int] = set()  # partitions the fill consumer reads
        self.jobs: dict[int, FillJob] = {}
        #: called with each slice's partitions and records read (tests order on it)
        self.on_slice: Callable[[dict[int, int]], None] | None = None

    @property
    def filling(self) -> set[int]:
        return set(self.jobs)

    # ------------------------------------------------------------ the mirror's hooks

    def _write(self, job: FillJob, batch: list[Msg], next_offset: int) -> bool:
        """Apply ``batch`` (``job``'s next records, maybe none) and move the
        mirror's position to ``next_offset``; False: the job starts over
        (:meth:`restart`)."""
        raise NotImplementedError

    def _report(self) -> None:
        """The jobs changed: report them (gauges, /readyz)."""

    def _counted_waits(self, count: int) -> None:
        """``count`` partitions were put off (each try counted)."""

    def _counted_failure(self) -> None:
        """A read failed (retried) or a job started over."""

    def _counted_read(self, count: int) -> None:
        """``count`` records were applied."""

    def _failed_for_good(self, partition: int, why: str) -> None:
        """A permanent read error outlasted ``MAX_ATTEMPTS`` (may raise)."""
        self.cancel([partition])

    def _before_read(self) -> None:
        """Partitions are about to be assigned to the fill's consumer (fault points)."""

    def _slice_applied(self) -> None:
        """A slice's records were applied (fault points)."""

    # ------------------------------------------------------------ jobs

    def open(self, jobs: Iterable[FillJob]) -> None:
        """Start these jobs (a job put off before keeps its back-off and why)."""
        opened = []
        now = self.clock()
        for job in jobs:
            if not job.progress_at:  # its stall is measured from now
                job.started = job.progress_at = now
            before = self.jobs.get(job.partition)
            if before is not None and before.put_off is not None:
                # its back-off goes on, and the problem is named until the new
                # try makes progress
                job.waits, job.put_off = before.waits, before.put_off
                job.problem = f"{before.put_off}; trying again (put off {before.waits} times)"
            self.jobs[job.partition] = job
            opened.append(job)
        self._assign(opened)
        self._report()

    def _assign(self, jobs: Iterable[FillJob]) -> None:
        todo = [j for j in jobs if j.next_offset < j.high]
        if not todo:
            return
        self._before_read()
        if self._reader is None:
            self._reader = self._new_reader()
        self._assigned.update(j.partition for j in todo)
        # an offset, not OFFSET_BEGINNING where the job knows it: librdkafka
        # resolves a logical offset with a ListOffsets request, which a new
        # consumer (the leader not known yet) retries only after 500 ms
        self._reader.incremental_assign(
            [
                TopicPartition(
                    self.topic,
                    j.partition,
                    j.next_offset if j.absolute else (j.next_offset or OFFSET_BEGINNING),
                )
                for j in todo
            ]
        )

    def _unassign(self, partitions: Iterable[int]) -> None:
        # only what was assigned: the client refuses to unassign anything else
        mine = sorted(set(partitions) & self._assigned)
        if self._reader is not None and mine:
            self._assigned.difference_update(mine)
            self._reader.incremental_unassign([TopicPartition(self.topic, p) for p in mine])
        if not self._assigned:
            # the consumer lives while it reads something: a cancel or a put-off
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

    def wait(self, partitions: Iterable[int], why: str, kind: str = "restore") -> None:
        """``partitions`` could not be opened (the broker did not answer within the
        retry deadline): hold them, nothing read, and try again after a back-off;
        named meanwhile.  Not an exit: a broker restart outlasting the deadline
        would otherwise end every member filling then."""
        parts = sorted(set(partitions))
        self._put_off(parts, kind, f"put off: {why}")
        self._unassign(parts)
        self._report()

    def _put_off(self, parts: list[int], kind: str, why: str) -> None:
        """Hold ``parts`` until their back-off is over: "<kind> of <topic>[p] <why>"
        logged and named, and counted (each try reported)."""
        now = self.clock()
        self._counted_waits(len(parts))
        for p in parts:
            job = self.jobs.get(p) or FillJob(p, 0, 0, None)
            job.waits += 1
            delay = min(WAIT_MAX_S, WAIT_FIRST_S * 2.0 ** (job.waits - 1))
            job.retry_at = now + delay
            job.put_off = f"{kind} of {self.topic}[{p}] {why}"
            job.problem = f"{job.put_off}; retrying in {delay:.0f} s (put off {job.waits} times)"
            self.jobs[p] = job
            log.warning("%s", job.problem)

    def due(self) -> list[int]:
        """Partitions put off whose back-off is over (the driver opens them again)."""
        now = self.clock()
        return sorted(
            p for p, j in self.jobs.items() if j.retry_at is not None and j.retry_at <= now
        )

    def cancel(self, partitions: Iterable[int]) -> None:
        """Revoked or lost while filling: stop; the mirror keeps the applied slices."""
        gone = [p for p in partitions if self.jobs.pop(p, None) is not None]
        if gone:
            self._unassign(gone)
            log.info("fill of %s partitions %s cancelled", self.topic, gone)
            self._report()

    def close(self) -> None:
        self.jobs.clear()
        self._close_reader()
        self._report()

    # ------------------------------------------------------------ the slice

    def step(self) -> dict[int, FillJob]:
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
                    self._hold(reading, f"put off: read failed: {line}")
        now = self.clock()
        stalled = sorted(
            p
            for p, j in live.items()
            if p not in done and j.retry_at is None and now - j.progress_at > self.stall_s
        )
        if stalled:
            self._hold(stalled, f"stalled: no progress for {self.stall_s:.0f} s")
        finished = {}
        for p, j in done.items():
            if self.jobs.get(p) is j:
                finished[p] = self.jobs.pop(p)
        if finished:
            self._unassign(list(finished))
            self._report()
        return finished

    def _hold(self, parts: list[int], why: str) -> None:
        """Put ``parts`` off and read the others with a new consumer."""
        self._put_off(parts, "fill", why)
        self._new_reader_for(parts)
        self._report()

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
            # is not, or the mirror skips what lies between
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
                ended.pop(p, None)  # started over
        for p, job in list(ended.items()):
            if p not in pending and not self._apply(job, [], job.high):
                ended.pop(p)
        if read:
            self._slice_applied()
            if self.on_slice is not None:
                self.on_slice(read)
        return ended

    def _apply(self, job: FillJob, batch: list[Msg], next_offset: int) -> bool:
        """Apply one slice; False: the job started over."""
        if not self._write(job, batch, next_offset):
            return False
        if batch:
            # progress since the last put-off: the next one backs off from the
            # first pause again (a long fill with scattered hiccups waited the
            # longest back-off after each); each put-off still counted
            job.waits, job.put_off = 0, None
        job.next_offset = next_offset
        job.read += len(batch)
        job.progress_at = self.clock()
        job.problem = None
        self._counted_read(len(batch))
        return True

    def restart(self, job: FillJob, why: str) -> None:
        """Fill ``job`` again from offset zero (its mirror partition was emptied)."""
        self._counted_failure()
        job.problem = f"fill of {self.topic}[{job.partition}]: {why}"
        log.warning("%s", job.problem)
        job.next_offset, job.kept_from, job.read, job.absolute = 0, None, 0, False
        job.progress_at = self.clock()
        self._unassign([job.partition])
        self._assign([job])
        self._report()

    def _failed(self, partitions: list[int], why: str) -> None:
        """A permanent read error: report; retry from the mirror's position, up to
        ``MAX_ATTEMPTS`` (a misconfiguration, not an outage: waiting would not help)."""
        for p in partitions:
            job = self.jobs[p]
            job.attempts += 1
            self._counted_failure()
            if job.attempts > MAX_ATTEMPTS:
                self._failed_for_good(
                    p, f"fill of {self.topic}[{p}] failed {MAX_ATTEMPTS} times: {why}"
                )
                continue
            job.problem = (
                f"fill of {self.topic}[{p}] failed ({why}); retry {job.attempts}/{MAX_ATTEMPTS}"
            )
            log.warning("%s", job.problem)
            job.progress_at = self.clock()
        partitions = [p for p in partitions if p in self.jobs]
        self._unassign(partitions)
        self._assign(self.jobs[p] for p in partitions)
        self._report()
