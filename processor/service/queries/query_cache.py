"""The views of the owned partitions, held for queries by session (issue 13).

Why a copy of the committed view records and not the engine's sessions:
the engine forgets a transcript entry once its view record is published
(``Session.drop_transcript_before``), and its sessions run ahead of the
views topic by the open batch.  A query must answer exactly what a
``read_committed`` reader of the views topic assembles, so this cache holds
the latest committed record of every views key of the owned partitions —
what the compacted topic holds — and a query feeds the session's records,
in the order they were written, to the readers' own assembly
(``views_reader``): the same code, the same records, the same value.

Where: a mirror's SQLite file (``store/mirror_db.py``: WAL, so queries
read while the writer writes; a fixed page cache, so memory does not grow
with the sessions held).  It is rebuilt on every start and every
assignment, never trusted across runs: nothing here needs the store's
proof against the topic.

Filled per assigned partition by a background thread from the views topic
(the session's views live in its events partition number) with the
mirror's fill (``store/mirror_fill.py``: bounded slices, a stalled or
failing read put off and tried again after a back-off, counted in
``processor_query_cache_fill_failures_total``), then kept current by the
runner handing over the view records of each committed transaction
(:meth:`QueryCache.committed`).  A thread, not the loop's slices as the
checkpoint store's fill: nothing waits for this fill — the partition folds
at once and only its queries answer "restoring" — so it need not cost the
loop a slice.  Commits arriving while a fill runs are buffered and applied
after it; re-applying records the fill already read is harmless, since a
key's latest write wins and moves it to the end (``seq``).

Threads: the loop thread calls :meth:`assigned`, :meth:`revoked` and
:meth:`committed`, which only queues the records for the mirror's writer
thread (``store/mirror_writer.py``; measured: a SQLite write per commit on
the loop cost 8.5% of fold + output, bench/lab/query_cache.py), which
applies them, up to 64 commits per transaction; the fill
thread writes its partition in small chunks; both write under the lock
(the states and the rows change together); HTTP threads read on their own
connections, outside it (WAL: a reader sees whole write transactions).  So
a query sees a committed state, at most the writer's queue behind the
newest commit.

Bounded: the live bytes of the file are capped at ``budget_bytes``
(``mirror_db.ByteBudget``, reported in ``processor_query_cache_bytes``); a
partition whose write would pass it is given up (deleted, counted,
answered 503 naming the bound) rather than served partially — a partial
session would assemble a wrong value.  A session's records are the keys
that start with ``<id>/`` (ids extending ``<id>/`` share the range; the
decoded record says whose it is).
"""

from __future__ import annotations

import itertools
import logging
import queue
import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge

from processor.client.views_reader import Materializer, ViewRecord
from processor.codec import Codec
from processor.kafka.owners import session_partition
from processor.kafka.reads import watermarks
from processor.kafka.transport import Msg, Reader
from processor.service.queries.queries import GivenUp, NotRestored
from processor.service.store import mirror_db
from processor.service.store.mirror_db import transaction
from processor.service.store.mirror_fill import STALL_S, FillJob, MirrorFill
from processor.service.store.mirror_writer import MirrorWriter

log = logging.getLogger(__name__)

#: Default bound of the live bytes of the cache file.
DEFAULT_BUDGET_BYTES = 1024 * 1024 * 1024
#: Records per fill transaction: a commit's write waits at most one of them.
FILL_CHUNK = 500
#: Longest wait of the fill thread for work while every fill is put off.
IDLE_S = 0.2
#: SQLite page cache per connection (negative: KiB): the memory bound.
CACHE_KIB = 4 * 1024
#: Commits queued for the writer thread before the loop waits for it.
MAX_QUEUED_COMMITS = 1_000
#: Commits the writer thread applies in one SQLite transaction at most.
COMMITS_PER_WRITE = 64
#: Records buffered per partition while its fill runs (past it: given up).
MAX_BUFFERED = 200_000

#: (partition, key, value) of one committed views record (value None: tombstone).
ViewWrite = tuple[int, bytes, bytes | None]
#: (partition, its assignment epoch, key, value): a committed record as queued.
_Tagged = tuple[int, int, bytes, bytes | None]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS record (
    partition INTEGER NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL, seq INTEGER NOT NULL,
    PRIMARY KEY (partition, key)
) WITHOUT ROWID;
"""


@dataclass(slots=True)
class _Partition:
    epoch: int
    ready: bool = False
    buffer: list[tuple[bytes, bytes | None]] = field(default_factory=list)
    dropped: str | None = None  # why the partition was given up


class QueryCache:
    """A :class:`~processor.service.queries.queries.SessionSource` over committed view records."""

    def __init__(
        self,
        codec: Codec,
        *,
        topic: str,
        reader: Callable[[], Reader],
        partition_count: Callable[[Reader], int],
        budget_bytes: int = DEFAULT_BUDGET_BYTES,
        directory: str | Path | None = None,
        registry: CollectorRegistry | None = None,
        stall_s: float | None = None,
    ) -> None:
        """``topic``: the views topic; ``reader()``: a new consumer without a group
        (the fill's, and one for the partitions' ends); ``partition_count(r)``:
        partitions of the events topic, asked with such a consumer.  All run on
        the fill thread.  ``directory``: where the file lives (default: the
        system's temp dir); ``stall_s``: a fill without progress this long is
        put off (default: the mirror's)."""
        self.codec = codec
        self.topic = topic
        self._new_reader = reader
        self._count_of = partition_count
        self._stall_s = stall_s
        self._count: int | None = None
        self.budget_bytes = budget_bytes
        self._dir = tempfile.mkdtemp(prefix="processor-queries-", dir=directory)
        self.path = Path(self._dir) / "views.sqlite"
        self._lock = threading.Lock()
        self._parts: dict[int, _Partition] = {}
        self._epoch = 0
        self._seq = itertools.count()  # next() is atomic: fill and loop both draw
        self._db = self._connect()  # writes of the writer and loop threads (under the lock)
        self._db.executescript(_SCHEMA)
        self._readers = threading.local()
        self._jobs: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        #: the committed records' writer (started with the first assignment)
        self._writer: MirrorWriter[list[_Tagged]] | None = None
        self._closed = False
        r = registry if registry is not None else CollectorRegistry()
        self.held_bytes = Gauge(
            "processor_query_cache_bytes", "Live bytes of the query cache file", registry=r
        )
        self._budget = mirror_db.ByteBudget(budget_bytes, self.held_bytes)
        self.dropped = Counter(
            "processor_query_cache_dropped_total",
            "Partitions given up by the query cache over its byte budget",
            registry=r,
        )
        self.fill_failures = Counter(
            "processor_query_cache_fill_failures_total",
            "Failed reads of a views partition (retried)",
            registry=r,
        )
        self.queue_full = Counter(
            "processor_query_cache_queue_full_total",
            "Commits that waited for room in the query cache's write queue "
            "(MAX_QUEUED_COMMITS; the loop waits, nothing is dropped)",
            registry=r,
        )

    def _connect(self) -> sqlite3.Connection:
        # not durable: rebuilt on every start, no fsync needed
        return mirror_db.connect(
            self.path, cache_kib=CACHE_KIB, durable=False, autocommit=True, busy_timeout_ms=60000
        )

    # ------------------------------------------------------------ loop thread

    def assigned(self, partitions: Iterable[int]) -> None:
        with self._lock:
            for p in partitions:
                self._epoch += 1
                self._forget(p)
                self._parts[p] = _Partition(self._epoch)
                self._jobs.put((p, self._epoch))
        if self._worker is None:
            self._worker = threading.Thread(target=self._fill_loop, name="query-fill", daemon=True)
            self._worker.start()
            self._writer = MirrorWriter(
                "query cache",
                self._write_queued,
                depth=MAX_QUEUED_COMMITS,
                batch=COMMITS_PER_WRITE,
                on_full=self.queue_full.inc,
                on_error=self._write_failed,
                thread="query-writer",
            )

    def revoked(self, partitions: Iterable[int]) -> None:
        with self._lock:
            for p in partitions:
                self._forget(p)

    def committed(self, writes: Iterable[ViewWrite]) -> None:
        """The views records of a committed transaction, in produce order.

        Only queued here (the writer thread applies them): the loop pays a list,
        not a SQLite write.  Each record carries its partition's assignment
        epoch, so a record queued before a revoke is never applied to a later
        assignment of the same partition.  A full queue blocks the loop
        (backpressure) rather than lose a record.
        """
        parts = self._parts  # changed by this (the loop) thread only
        tagged = [(p, parts[p].epoch, key, value) for p, key, value in writes if p in parts]
        if tagged and self._writer is not None:
            # a full queue: reported, then the loop waits (back-pressure, mirror_writer.py)
            self._writer.put(tagged)

    def sync(self) -> None:
        """Wait until every queued commit is applied (tests, benches)."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Stop the threads, release the reader and remove the file."""
        self._closed = True
        self._jobs.put(None)
        if self._writer is not None:
            self._writer.close(10)  # what is queued first, as before a stop
        if self._worker is not None and self._worker is not threading.current_thread():
            self._worker.join(10)  # a fill in its middle ends at its next chunk
        self._remove()

    def _write_queued(self, commits: list[list[_Tagged]]) -> None:
        """The writer thread: queued commits in order, in one SQLite transaction."""
        with self._lock:
            self._apply_commits([r for commit in commits for r in commit])

    def _write_failed(self, exc: Exception) -> None:
        """A cache failure must never end the member: its partitions are given up."""
        log.error("query cache: applying a commit failed; giving the partitions up", exc_info=exc)
        with self._lock:
            for p, part in list(self._parts.items()):
                if part.dropped is None:
                    self._give_up(p, part, "a write to the cache file failed")

    def _apply_commits(self, records: list[_Tagged]) -> None:
        """Write the records of ready partitions, buffer the filling ones (lock held)."""
        ready: dict[int, list[tuple[bytes | None, bytes | None]]] = {}
        for p, epoch, key, value in records:
            part = self._parts.get(p)
            if part is None or part.epoch != epoch or part.dropped is not None:
                continue
            if part.ready:
                ready.setdefault(p, []).append((key, value))
            elif len(part.buffer) < MAX_BUFFERED:
                part.buffer.append((key, value))
            else:
                self._give_up(p, part, f"{MAX_BUFFERED} commits buffered during its fill")
        for p, chunk in ready.items():
            self._write(self._db, p, chunk)
            self._check_budget(p)

    # ------------------------------------------------------------ SessionSource

    def owns(self, session_id: str) -> bool | None:
        count = self._count
        if count is None or self._closed:  # closed: the member is leaving
            return None
        return session_partition(session_id, count) in self._parts

    def session_views(self, session_id: str) -> Mapping[str, ViewRecord] | None:
        count = self._count
        if count is None or self._closed:
            raise NotRestored("partition count not known yet, or the member is stopping")
        p = session_partition(session_id, count)
        epoch = self._usable(p).epoch
        # every key of the session starts with "<id>/": a range of the primary
        # key ("0" follows "/"), shared only with ids that extend "<id>/"
        prefix = session_id.encode()
        rows = (
            self._reader()
            .execute(
                "SELECT key, value FROM record WHERE partition = ? AND key >= ? AND key < ? "
                "ORDER BY seq",
                (p, prefix + b"/", prefix + b"0"),
            )
            .fetchall()
        )
        if self._usable(p).epoch != epoch:  # revoked and reassigned while reading
            raise NotRestored(f"partition {p} was reassigned")
        state = Materializer(self.codec, session_id, None)
        for key, value in rows:
            state.apply(bytes(key), bytes(value))
        return state.views.get(session_id)

    def _usable(self, p: int) -> _Partition:
        with self._lock:
            part = self._parts.get(p)
        if part is None:
            raise NotRestored(f"partition {p} is not assigned here")
        if part.dropped is not None:
            raise GivenUp(part.dropped)
        if not part.ready:
            raise NotRestored(f"the views of partition {p} are loading")
        return part

    def _reader(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._readers, "db", None)
        if db is None:
            db = self._readers.db = sqlite3.connect(self.path, isolation_level=None)
            db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
            db.execute("PRAGMA busy_timeout=60000")
        return db

    # ------------------------------------------------------------ fill thread

    def _fill_loop(self) -> None:
        """Open the assigned partitions' fills, drive them slice by slice."""
        db = self._connect()
        fill = _ViewsFill(self, db)
        try:
            while not self._closed:
                if not self._take_jobs(fill):
                    return
                try:
                    for p in fill.due():
                        fill.add(p, fill.epochs[p])
                    fill.drop_stale()
                    for p, job in fill.step().items():
                        self._filled(db, p, fill.epochs.pop(p, -1), job)
                except Exception as exc:  # a cache failure must never end the member
                    log.error("query cache: a fill failed; giving its partitions up", exc_info=exc)
                    fill.give_up_all(f"its fill failed ({exc})")
                fill.drop_stale()
        finally:
            fill.close()
            db.close()

    def _take_jobs(self, fill: _ViewsFill) -> bool:
        """Open the newly assigned partitions' fills; waits while there is nothing
        to read.  False: the cache is closing."""
        live = [j for j in fill.jobs.values() if j.retry_at is None]
        wait: float | None = None  # nothing to fill: until a partition is assigned
        if live:
            wait = 0.0
        elif fill.jobs:  # every fill put off: until the first is due
            due = min(j.retry_at or 0.0 for j in fill.jobs.values()) - fill.clock()
            wait = min(IDLE_S, max(0.0, due))
        while True:
            try:
                job = self._jobs.get(timeout=wait) if wait != 0.0 else self._jobs.get_nowait()
            except queue.Empty:
                return True
            if job is None:
                return False
            fill.add(*job)
            wait = 0.0

    def _current(self, p: int, epoch: int) -> _Partition | None:
        part = self._parts.get(p)
        return part if part is not None and part.epoch == epoch else None

    def _filled(self, db: sqlite3.Connection, p: int, epoch: int, job: FillJob) -> None:
        """The fill reached the end: the commits buffered meanwhile, then ready."""
        with self._lock:
            part = self._current(p, epoch)
            if part is None or part.dropped is not None:
                return
            self._write(db, p, part.buffer)
            part.buffer = []
            part.ready = True
            self._check_budget(p)
        log.info(
            "query cache: views partition %d loaded (%d records read in %.2f s)",
            p,
            job.read,
            time.monotonic() - job.started,
        )

    # ------------------------------------------------------------ storage

    def _write(
        self, db: sqlite3.Connection, p: int, records: Iterable[tuple[bytes | None, bytes | None]]
    ) -> None:
        """Latest write of a key wins and gets the next ``seq`` (one transaction)."""
        final: dict[bytes, tuple[bytes | None, int]] = {}
        for key, value in records:
            if key is not None:
                final.pop(key, None)  # keep the order of last writes
                final[key] = (value, next(self._seq))
        upserts = [(p, k, v, s) for k, (v, s) in final.items() if v is not None]
        deletes = [(p, k) for k, (v, _) in final.items() if v is None]
        with transaction(db):
            db.executemany("DELETE FROM record WHERE partition = ? AND key = ?", deletes)
            db.executemany(
                "INSERT OR REPLACE INTO record (partition, key, value, seq) VALUES (?, ?, ?, ?)",
                upserts,
            )

    def _check_budget(self, p: int) -> None:
        """Give ``p`` up when the file's live bytes pass the budget (lock held)."""
        part = self._parts.get(p)
        if self._budget.passed(self._db) and part is not None and part.dropped is None:
            why = f"the cache passed its budget of {self.budget_bytes} bytes (query_cache_bytes)"
            self._give_up(p, part, why)

    def _give_up(self, p: int, part: _Partition, why: str) -> None:
        part.dropped = (
            f"the query cache gave up partition {p}: {why}; "
            "read the views topic (`processor views --session ... --from-topic`)"
        )
        log.warning("%s", part.dropped)
        self.dropped.inc()
        part.buffer = []
        self._delete(self._db, p)
        self._budget.measure(self._db)

    def _forget(self, p: int) -> None:
        """Forget partition ``p`` (lock held)."""
        if self._parts.pop(p, None) is not None:
            self._delete(self._db, p)

    def _delete(self, db: sqlite3.Connection, p: int) -> None:
        with transaction(db):
            db.execute("DELETE FROM record WHERE partition = ?", (p,))

    def _remove(self) -> None:
        with self._lock:
            self._db.close()
        shutil.rmtree(self._dir, ignore_errors=True)


class _ViewsFill(MirrorFill):
    """The cache's fill of its assigned views partitions (the fill thread's)."""

    def __init__(self, cache: QueryCache, db: sqlite3.Connection) -> None:
        stall = STALL_S if cache._stall_s is None else cache._stall_s
        super().__init__(cache.topic, cache._new_reader, stall_s=stall)
        self.cache = cache
        self.db = db
        self.epochs: dict[int, int] = {}  # each job's assignment epoch
        self._meta: Reader | None = None  # the partitions' ends, the partition count

    def add(self, p: int, epoch: int) -> None:
        """Open ``p``'s fill from the start of the views partition to its end now."""
        cache = self.cache
        if self.epochs.get(p, epoch) != epoch:
            self.cancel([p])  # reassigned: the new assignment's fill from the start
        self.epochs[p] = epoch
        with cache._lock:
            if cache._current(p, epoch) is None:
                self.epochs.pop(p, None)
                return  # revoked (or reassigned) before its turn
        now = self.clock()
        try:
            if self._meta is None:
                self._meta = cache._new_reader()
            if cache._count is None:
                cache._count = cache._count_of(self._meta)
            low, high = watermarks(self._meta, self.topic, p)  # high: the stable end
        except Exception as exc:  # a cache failure never ends the member: tried again
            log.warning("query cache: reading views partition %d failed: %s", p, exc)
            self.wait([p], f"its end could not be read: {exc}", kind="fill")
            return
        job = FillJob(p, max(low, 0), high, None, started=now, progress_at=now, absolute=low >= 0)
        self.open([job])

    def drop_stale(self) -> None:
        """Cancel the fills of partitions revoked, reassigned or given up meanwhile."""
        cache = self.cache
        with cache._lock:
            stale = [
                p
                for p, epoch in self.epochs.items()
                if (part := cache._current(p, epoch)) is None or part.dropped is not None
            ]
        for p in stale:
            self.epochs.pop(p, None)
        self.cancel(stale)  # a put-off one too

    def _write(self, job: FillJob, batch: list[Msg], next_offset: int) -> bool:
        cache, p = self.cache, job.partition
        epoch = self.epochs.get(p, -1)
        pairs = [(m.key(), m.value()) for m in batch]
        for i in range(0, len(pairs), FILL_CHUNK):
            # under the lock, so a revoke cannot land between the check and the
            # write (stale rows); a chunk is small, a commit's write waits little
            with cache._lock:
                part = cache._current(p, epoch)
                if part is None or part.dropped is not None or cache._closed:
                    return True  # dropped after the slice (drop_stale)
                try:
                    cache._write(self.db, p, pairs[i : i + FILL_CHUNK])
                except sqlite3.Error as exc:  # a full disk: given up, never served partially
                    cache._give_up(p, part, f"a write to the cache file failed ({exc})")
                    return True
                cache._check_budget(p)
        return True

    def give_up_all(self, why: str) -> None:
        """Give up every partition being filled (an unforeseen failure)."""
        cache = self.cache
        with cache._lock:
            for p, epoch in self.epochs.items():
                part = cache._current(p, epoch)
                if part is not None and part.dropped is None:
                    cache._give_up(p, part, why)

    def _counted_waits(self, count: int) -> None:
        self.cache.fill_failures.inc(count)

    def _counted_failure(self) -> None:
        self.cache.fill_failures.inc()

    def _failed_for_good(self, partition: int, why: str) -> None:
        cache = self.cache
        with cache._lock:
            part = cache._parts.get(partition)
            if part is not None and part.dropped is None:
                cache._give_up(partition, part, why)
        self.cancel([partition])

    def close(self) -> None:
        super().close()
        meta, self._meta = self._meta, None
        if meta is not None:
            meta.close()
