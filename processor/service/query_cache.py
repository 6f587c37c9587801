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

Filled per assigned partition in a background thread from the views topic
(the session's views live in its events partition number), then kept
current by the runner handing over the view records of each committed
transaction (:meth:`QueryCache.committed`).  Commits arriving while a fill
runs are buffered and applied after it; re-applying records the fill
already read is harmless, since a key's latest write wins and moves it to
the end.  Until its fill is done a partition answers "restoring" (503).

Threads: the loop thread calls :meth:`assigned`, :meth:`revoked` and
:meth:`committed`; HTTP threads call :meth:`owns` and :meth:`session_views`.
One lock guards the maps; a query copies its session's records under it and
decodes them outside it, so a query never holds the poll loop for longer
than a copy of one session's records.

Bounded: the records held are capped at ``budget_bytes``; a partition that
would pass it is given up (cleared, counted, answered 503 naming the
bound) rather than served partially — a partial session would assemble a
wrong value.  Records are bucketed by the key up to its first ``/`` (a
session id may itself hold ``/``; the decoded record says whose it is).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge

from processor.codec import Codec
from processor.service.owners import session_partition
from processor.service.queries import NotRestored, Unavailable
from processor.service.views_reader import ViewRecord
from processor.service.views_reader import _Materializer as Materializer

log = logging.getLogger("processor.queries")

#: Default bound of the view records held for queries.
DEFAULT_BUDGET_BYTES = 256 * 1024 * 1024
#: Seconds between attempts to fill a partition whose read failed.
FILL_RETRY_S = 2.0

#: (partition, key, value) of one committed views record (value None: tombstone).
ViewWrite = tuple[int, bytes, bytes | None]


@dataclass(slots=True)
class _Partition:
    epoch: int
    ready: bool = False
    buffer: list[tuple[bytes, bytes | None]] = field(default_factory=list)
    buckets: dict[bytes, OrderedDict[bytes, bytes]] = field(default_factory=dict)
    size: int = 0
    dropped: str | None = None  # why the partition was given up


def _bucket(key: bytes) -> bytes:
    cut = key.find(b"/")
    return key if cut < 0 else key[:cut]


class QueryCache:
    """A :class:`~processor.service.queries.SessionSource` over committed view records."""

    def __init__(
        self,
        codec: Codec,
        *,
        read_partition: Callable[[int], Iterable[tuple[bytes | None, bytes | None]]],
        partition_count: Callable[[], int],
        budget_bytes: int = DEFAULT_BUDGET_BYTES,
        registry: CollectorRegistry | None = None,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        """``read_partition(p)``: every committed (key, value) of views partition ``p``
        in offset order; ``partition_count()``: partitions of the events topic;
        ``on_close``: release what they hold.  All run on the fill thread."""
        self.codec = codec
        self._read = read_partition
        self._on_close = on_close
        self._count_of = partition_count
        self._count: int | None = None
        self.budget_bytes = budget_bytes
        self._lock = threading.Lock()
        self._parts: dict[int, _Partition] = {}
        self._size = 0
        self._epoch = 0
        self._jobs: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        r = registry if registry is not None else CollectorRegistry()
        self.held_bytes = Gauge(
            "processor_query_cache_bytes", "View record bytes held for queries", registry=r
        )
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

    # ------------------------------------------------------------ loop thread

    def assigned(self, partitions: Iterable[int]) -> None:
        with self._lock:
            for p in partitions:
                self._epoch += 1
                self._drop(p)
                self._parts[p] = _Partition(self._epoch)
                self._jobs.put((p, self._epoch))
        if self._worker is None:
            self._worker = threading.Thread(target=self._fill_loop, name="query-fill", daemon=True)
            self._worker.start()

    def revoked(self, partitions: Iterable[int]) -> None:
        with self._lock:
            for p in partitions:
                self._drop(p)

    def committed(self, writes: Iterable[ViewWrite]) -> None:
        """The views records of a committed transaction, in produce order."""
        with self._lock:
            for p, key, value in writes:
                part = self._parts.get(p)
                if part is None or part.dropped is not None:
                    continue
                if not part.ready:
                    part.buffer.append((key, value))
                else:
                    self._apply(p, part, key, value)

    def close(self) -> None:
        """Stop the fill thread (it releases the reader on its way out)."""
        self._jobs.put(None)

    # ------------------------------------------------------------ SessionSource

    def owns(self, session_id: str) -> bool | None:
        count = self._count
        if count is None:
            return None
        return session_partition(session_id, count) in self._parts

    def session_views(self, session_id: str) -> Mapping[str, ViewRecord] | None:
        count = self._count
        if count is None:
            raise NotRestored("partition count not known yet")
        p = session_partition(session_id, count)
        with self._lock:
            part = self._parts.get(p)
            if part is None:
                raise NotRestored(f"partition {p} is not assigned here")
            if part.dropped is not None:
                raise Unavailable(part.dropped)
            if not part.ready:
                raise NotRestored(f"the views of partition {p} are loading")
            bucket = part.buckets.get(_bucket(session_id.encode()))
            records = list(bucket.items()) if bucket else []
        state = Materializer(self.codec, session_id, None)
        for key, value in records:
            state.apply(key, value)
        return state.views.get(session_id)

    # ------------------------------------------------------------ internals

    def _fill_loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                if self._on_close is not None:
                    self._on_close()
                return
            p, epoch = job
            with self._lock:
                part = self._parts.get(p)
                if part is None or part.epoch != epoch:
                    continue  # revoked (or reassigned) before its turn
            try:
                if self._count is None:
                    self._count = self._count_of()
                records = list(self._read(p))
            except Exception as exc:
                self.fill_failures.inc()
                log.warning("query cache: reading views partition %d failed: %s", p, exc)
                threading.Timer(FILL_RETRY_S, self._jobs.put, ((p, epoch),)).start()
                continue
            with self._lock:
                part = self._parts.get(p)
                if part is None or part.epoch != epoch:
                    continue
                for key, value in records:
                    if key is not None and part.dropped is None:
                        self._apply(p, part, key, value)
                for key, value in part.buffer:
                    if part.dropped is None:
                        self._apply(p, part, key, value)
                part.buffer = []
                part.ready = True
            log.info("query cache: views partition %d loaded (%d records read)", p, len(records))

    def _apply(self, p: int, part: _Partition, key: bytes, value: bytes | None) -> None:
        """Latest write of ``key`` wins and moves to the end (offset order). Lock held."""
        name = _bucket(key)
        bucket = part.buckets.get(name)
        old = bucket.pop(key, None) if bucket is not None else None
        delta = -(len(key) + len(old)) if old is not None else 0
        if value is not None:
            if bucket is None:
                bucket = part.buckets[name] = OrderedDict()
            bucket[key] = value
            delta += len(key) + len(value)
        elif bucket is not None and not bucket:
            del part.buckets[name]
        part.size += delta
        self._size += delta
        if self._size > self.budget_bytes:
            reason = (
                f"the query cache gave up partition {p}: its view records passed the "
                f"budget of {self.budget_bytes} bytes (query_cache_bytes); read the views "
                "topic (`processor views --session`)"
            )
            log.warning("%s", reason)
            self.dropped.inc()
            self._size -= part.size
            part.buckets.clear()
            part.buffer = []
            part.size = 0
            part.dropped = reason
        self.held_bytes.set(self._size)

    def _drop(self, p: int) -> None:
        """Forget partition ``p`` (lock held)."""
        part = self._parts.pop(p, None)
        if part is not None:
            self._size -= part.size
            self.held_bytes.set(self._size)
