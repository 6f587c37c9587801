"""The checkpoints of the owned partitions in the local store (issue 13).

Three moments:

- **assign** (:meth:`CheckpointStore.positions`, then the fill): the stored position of each
  new partition is verified against the checkpoints topic (``local_store.
  verify``: another cluster, a recreated topic, a store ahead of the
  committed end or one whose last record the topic holds no longer —
  another record in its place, not a compaction gap — is dropped), then the
  store catches up from its next offset to the topic's committed end in
  bounded batches — a restart on the same host reads what changed since its
  last run, a fresh host the compacted partition once.  Nothing is decoded
  but the heads' quarantine flag: sessions are loaded one by one when their
  first event arrives (:meth:`load`).
- **commit** (:meth:`produced`, :meth:`committed`): every checkpoint record
  the transaction produced is applied, only after the commit succeeded (an
  abort discards them), by the mirror's writer thread (``mirror_writer.py``)
  so the loop does not wait for SQLite; the position moves in the same SQLite
  transaction as the records (``LocalStore.apply``), so writes still queued
  at a crash leave the store behind the topic, never ahead.  Only each partition's last record asks
  for a delivery report; the others' offsets are derived from it
  (:meth:`committed`).  A crash between the commit and the store write
  leaves the store behind the topic, which the next assign catches up;
  never ahead.
- **failure**: a store that cannot be opened or written is reported on
  ``/readyz`` (``health.degraded``), its partitions stop taking writes
  (a later write would move the position past the missing one) and their
  sessions are never evicted; folding goes on.  A write failing while a
  partition fills (a full disk: nothing of it is folded yet) moves that
  partition to an in-memory store, refilled from zero and reported; a
  corrupt file (met anywhere) ends the run with one line after removing
  the file, so the restart refills it from the topic — never a fold from a
  damaged page, never a crash loop on the same file.

The fill of an assignment runs off the assignment callback, in bounded
slices of the poll loop, the partition paused meanwhile
(``background_fill.py``, which says why slices and not a thread, and why a
session is not folded before its partition is filled); the rewind after an
abort drives the same fill to the end at once (``BackgroundFill.run``).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from confluent_kafka import KafkaError
from prometheus_client import CollectorRegistry, Gauge

from processor.codec import CHECKPOINT, Checkpoint, Codec, CodecError, split_part_key
from processor.codec.parted import decode_checkpoint_record
from processor.config import ServiceConfig
from processor.core.errors import Unavailable
from processor.engine import PartitionState
from processor.engine.checkpoints import latest_checkpoints
from processor.kafka.reads import stream, watermarks
from processor.kafka.transport import Msg, Reader
from processor.service.store.local_store import LocalStore, StoredRecord
from processor.service.store.mirror_db import ByteBudget
from processor.service.store.mirror_writer import MirrorWriter

log = logging.getLogger(__name__)

#: Records applied per store transaction while filling (bounded memory).
FILL_BATCH = 20_000
#: Files tried per state directory: members on one host without an instance
#: id each take the first one no other live process holds (flock).
MAX_STORE_FILES = 16
PART_MARK = b"\xff"
#: How long a load, an assignment or a close waits for the store's writer.
FLUSH_S = 120.0


def session_key(key: bytes) -> bytes:
    """The session bytes of a checkpoints key (what the store groups records by)."""
    if key[:1] == PART_MARK:
        end = key.rfind(b"\x00")
        if end > 0:
            return key[1:end]
    return key


def session_of(key: bytes) -> str:
    """The session a checkpoints record belongs to (a part key or a head key)."""
    ident = split_part_key(key)
    return ident[0] if ident is not None else key.decode("utf-8", "replace")


def head_quarantined(codec: Codec, key: bytes, value: bytes | None) -> bool:
    """True when the record is the head of a quarantined session's checkpoint."""
    if value is None or key.startswith(PART_MARK):
        return False
    try:
        name, datum = decode_checkpoint_record(codec, value)
        if name == CHECKPOINT:
            service = codec.decode_checkpoint(value).surface.get("service") or {}
            return bool(service.get("quarantine"))
        return bool(datum.get("quarantine"))
    except CodecError:
        return False  # reported when the session is loaded


def stored_records(
    codec: Codec, batch: Iterable[tuple[int, bytes | None, bytes | None]]
) -> Iterator[StoredRecord]:
    """The fill's records: bytes as read, only a head's quarantine flag decoded."""
    for offset, key, value in batch:
        if key is not None:
            yield StoredRecord(offset, key, value, head_quarantined(codec, key, value))


#: One committed transaction's records of a partition: (partition, records, next offset).
_Write = tuple[int, list[StoredRecord], int]


def _write_keys(write: _Write) -> Iterator[tuple[int, bytes]]:
    """The (partition, session) pairs a queued write holds (loads wait for them)."""
    partition, records, _ = write
    return ((partition, session_key(r.key)) for r in records)


class StoreUnusable(Unavailable):
    """The local store failed while filling: its sessions cannot be trusted."""


@dataclass
class Filled:
    """What an assignment found in the store for one partition."""

    kept_from: int | None  # the verified stored position (None: filled from zero)
    records_read: int  # records read from the topic to catch up


class CheckpointStore:
    """The member's local store of its checkpoints partitions; see the module docstring."""

    def __init__(
        self,
        config: ServiceConfig,
        codec: Codec,
        *,
        on_queue_full: Callable[[], None] | None = None,
        on_drop: Callable[[], None] | None = None,
        size_gauge: Gauge | None = None,
    ) -> None:
        """``on_queue_full``: a commit waits on the writer's full queue (the
        metric); ``on_drop``: an assignment drops a stored partition the topic
        did not prove (the metric; the reason is in the log); ``size_gauge``:
        the store's live bytes, set by :meth:`keep_under_budget`."""
        self.config = config
        self.codec = codec
        self.topic = config.topics.checkpoints
        self.store: LocalStore | None = None
        self._lock: IO[bytes] | None = None
        #: why the store file could not be opened (an in-memory one serves instead)
        self.open_problem: str | None = None
        #: partitions whose store took no write since a failed one, and why;
        #: replaced, never changed in place, under ``_broken_lock``: the writer
        #: thread adds to it while the loop iterates it (eviction pins them)
        self.broken: dict[int, str] = {}
        self._broken_lock = threading.Lock()
        #: the open transaction's checkpoint records by partition, in produce order
        self._produced: dict[int, list[tuple[bytes, bytes | None]]] = {}
        #: the offset each partition's last record got (its delivery report)
        self._last: dict[int, int] = {}
        self._topic_id = ""
        self._cluster_id = ""
        #: partitions moved off the store file after a write failed while filling
        #: (disk full): held in ``_memory``, refilled from the topic, and why
        self.in_memory: dict[int, str] = {}
        self._memory: LocalStore | None = None
        #: applies committed records off the loop thread (a store file only)
        self.writer: MirrorWriter[_Write] | None = None
        self.on_queue_full = on_queue_full
        self.on_drop = on_drop
        self.budget = ByteBudget(
            config.store_bytes,
            size_gauge or Gauge("processor_store_bytes", "", registry=CollectorRegistry()),
        )
        #: the owned partitions alone are past ``store_bytes`` (/readyz says so)
        self.over_budget: str | None = None

    # ------------------------------------------------------------ open

    def open(self, cluster_id: str, topic_id: str) -> None:
        """Open (or create) the store file; a failure is reported, not fatal."""
        self._topic_id = topic_id
        self._cluster_id = cluster_id
        if self.store is not None:
            return
        path = self.config.state_path
        try:
            if path is not None:
                path = self._claim(path)
            self.store = LocalStore(path, cluster_id, session_key)
        except (OSError, sqlite3.Error) as exc:
            self.open_problem = f"local store {path} cannot be opened: {exc}"
            log.error("%s; checkpoints are kept in memory instead", self.open_problem)
            self.store = LocalStore(None, cluster_id, session_key)
        if self.store.reset_reason is not None:
            log.warning("local store %s emptied: %s", path, self.store.reset_reason)
        if self.store.path is not None:
            self.writer = MirrorWriter(
                "local store writer",
                self._write_all,
                depth=self.config.store_write_queue,
                keys=_write_keys,
                on_full=self._queue_full,
                thread="store-writer",
            )

    def _queue_full(self) -> None:
        if self.on_queue_full is not None:
            self.on_queue_full()

    def _claim(self, path: Path) -> Path:
        """The first file of ``path``'s series no other process holds."""
        path.parent.mkdir(parents=True, exist_ok=True)
        for i in range(MAX_STORE_FILES):
            candidate = path if i == 0 else path.with_name(f"{path.stem}-{i}{path.suffix}")
            lock = open(f"{candidate}.lock", "wb")  # noqa: SIM115 - held while the store is open
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                lock.close()
                continue
            self._lock = lock
            return candidate
        raise OSError(f"{MAX_STORE_FILES} store files in {path.parent} are all in use")

    def flush(self, timeout_s: float = FLUSH_S) -> bool:
        """Wait for the queued writes (False: still writing at the deadline)."""
        return self.writer is None or self.writer.flush(timeout_s)

    def close(self, timeout_s: float | None = None) -> None:
        """Write what is queued within ``timeout_s`` (default: the revoke budget;
        the rest is caught up on the next assignment), then close the file."""
        if self.writer is not None:
            budget = self.config.revoke_budget_ms / 1000
            self.writer.close(budget if timeout_s is None else timeout_s)
            self.writer = None
        if self.store is not None:
            self.store.close()
            self.store = None
        if self._memory is not None:
            self._memory.close()
            self._memory = None
        self.in_memory = {}
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def _db(self, partition: int | None = None) -> LocalStore:
        assert self.store is not None, "CheckpointStore.open first"
        if partition is not None and partition in self.in_memory:
            assert self._memory is not None
            return self._memory
        return self.store

    def db(self, partition: int) -> LocalStore:
        """The store holding ``partition`` (the file, or memory after a failed write)."""
        return self._db(partition)

    # ------------------------------------------------------------ failures

    def unusable(self, exc: sqlite3.Error, doing: str) -> StoreUnusable:
        """The one line a store error ends the run with.  A corrupt file is
        removed first, so the restart refills it from the topic (never a
        crash loop on the same file, never a fold from a damaged page)."""
        db = self.store
        path = db.path if db is not None else None
        if is_corrupt(exc) and db is not None and path is not None:
            db.remove_files()
            return StoreUnusable(
                f"local store {path} is corrupt ({exc}) while {doing}: removed, "
                f"the next start refills it from {self.topic}"
            )
        return StoreUnusable(f"local store {path}: {doing} failed: {exc}")

    def move_to_memory(self, partition: int, why: str) -> bool:
        """A write to the store file failed while ``partition`` filled (nothing of
        it is folded yet): hold it in memory from now on, refilled from zero.
        False: it was in memory already (the caller gives up)."""
        if partition in self.in_memory:
            return False
        line = f"local store partition {partition}: {why}; held in memory instead"
        log.error("%s (refilled from %s)", line, self.topic)
        with contextlib.suppress(sqlite3.Error):  # its pages go back to the file
            self._db().drop(self.topic, partition)
        if self._memory is None:
            self._memory = LocalStore(None, self._cluster_id, session_key)
        self._memory.drop(self.topic, partition)
        self.in_memory = {**self.in_memory, partition: line}
        return True

    # ------------------------------------------------------------ budget

    def keep_under_budget(self, unowned: Iterable[int]) -> list[int]:
        """Past ``store_bytes``: drop the stored copies of ``unowned`` partitions
        (the caller's: neither owned nor filling), least recently written first,
        until the store is under it again.  Returns the partitions dropped.

        Why copies go first: an owned partition's records are the sessions the
        member folds (dropping them would move them to memory or reread them on
        every load); a copy only saves a read of the topic if the partition
        comes back.  Owned partitions alone past the bound are reported
        (:attr:`over_budget`, on ``/readyz``), never dropped: the operator
        raises ``store_bytes`` or adds members.  The file does not shrink:
        freed pages are reused by the next writes (the bound is on live bytes).
        """
        db = self.store
        if db is None:
            return []
        limit = self.budget.limit
        dropped: list[int] = []
        try:
            live = self.budget.reported(db.live_bytes())
            if live > limit:
                gone = set(unowned)
                copies = sorted((at, p) for p, at in db.stored(self.topic) if p in gone)
                if copies and not self.flush():  # a queued write of a copy would recreate it
                    return []
                for _, p in copies:
                    db.drop(self.topic, p)
                    dropped.append(p)
                    live = self.budget.reported(db.live_bytes())
                    if live <= limit:
                        break
        except sqlite3.Error as exc:
            log.warning("local store: the size check failed (%s); tried again later", exc)
            return []
        if dropped:
            log.warning(
                "local store past store_bytes %d: dropped the copies of partitions %s "
                "(not owned; %d bytes live now)",
                limit,
                ", ".join(map(str, dropped)),
                live,
            )
        self.over_budget = (
            None
            if live <= limit
            else f"local store holds {live} bytes of owned partitions, past store_bytes "
            f"{limit}: raise it or add members"
        )
        return dropped

    # ------------------------------------------------------------ assign

    @property
    def topic_id(self) -> str:
        return self._topic_id

    def positions(
        self, reader: Reader, partitions: list[int]
    ) -> dict[int, tuple[int, int, int | None]]:
        """Each partition's verified stored position: ``(start, topic end, kept)``,
        kept None when the store had nothing usable (filled from zero).

        ``start`` is an offset of the topic, never "the beginning": the kept
        position, or the log start when the store has nothing before it.  A
        new consumer assigned at the beginning asks the leader for that offset
        and, not knowing the leader yet, asks again 500 ms later: every fill
        from zero began 0.5 s late (issue 37)."""
        topic = self.topic
        if not self.flush():
            log.warning("local store writer still busy after %.0f s; filling anyway", FLUSH_S)
        out: dict[int, tuple[int, int, int | None]] = {}
        with self._broken_lock:  # verified and caught up below: writable again
            self.broken = {p: why for p, why in self.broken.items() if p not in partitions}
        for p in partitions:
            low, high = watermarks(reader, topic, p)
            read_from = functools.partial(_first_held, reader, topic, p, end=high)
            store = self._db(p)
            try:
                with store.write_lock:
                    had = store.position(topic, p) is not None
                    pos = store.verify(topic, p, self._topic_id, high, read_from, low)
            except sqlite3.DatabaseError as exc:
                raise self.unusable(exc, f"verifying partition {p}") from exc
            if had and pos is None and self.on_drop is not None:
                self.on_drop()
            kept = pos.next_offset if pos is not None else None
            out[p] = (max(kept or 0, low, 0), high, kept)
        return out

    def load(self, partition: int, session_id: str) -> tuple[Checkpoint | None, int]:
        """CheckpointSource: a session's newest checkpoint from the store, and its size."""
        writer = self.writer
        # its newest records still queued: a load now would be stale
        stale = writer is not None and writer.pending((partition, session_id.encode()))
        if stale and writer is not None and not writer.flush(FLUSH_S):
            raise StoreUnusable(f"local store writer stuck for {FLUSH_S:.0f} s")
        try:
            records = self._db(partition).session_records(self.topic, partition, session_id)
        except sqlite3.DatabaseError as exc:
            raise self.unusable(exc, f"loading session {session_id}") from exc
        if not records:
            return None, 0

        def bad(sid: str, exc: CodecError) -> None:
            log.error(
                "checkpoint of %s in %s[%d] is unreadable (%s); it will be refolded",
                sid,
                self.topic,
                partition,
                exc,
            )

        found = latest_checkpoints(self.codec, records, bad).checkpoints.get(session_id)
        return found, sum(len(v) for _, v in records)

    def newest(self, partition: int) -> Checkpoint | None:
        """The most recently written checkpoint of the partition (its anchor is checked)."""
        try:
            head = self._db(partition).newest_head(self.topic, partition)
        except sqlite3.DatabaseError as exc:
            raise self.unusable(exc, f"reading partition {partition}") from exc
        return None if head is None else self.load(partition, session_of(head[0]))[0]

    def keys(self, partition: int) -> Iterator[bytes]:
        try:
            return iter(list(self._db(partition).keys(self.topic, partition)))
        except sqlite3.DatabaseError as exc:
            raise self.unusable(exc, f"reading partition {partition}") from exc

    def quarantined(self, partition: int) -> set[str]:
        try:
            return self._db(partition).quarantined_sessions(self.topic, partition)
        except sqlite3.DatabaseError as exc:
            raise self.unusable(exc, f"reading partition {partition}") from exc

    def sessions(self, partition: int) -> int:
        """Sessions with a checkpoint head in the store (O(1): kept on apply)."""
        try:
            return self._db(partition).heads(self.topic, partition)
        except sqlite3.DatabaseError as exc:
            raise self.unusable(exc, f"reading partition {partition}") from exc

    # ------------------------------------------------------------ commit

    def produced(self, partition: int, key: bytes | None, value: bytes | None) -> None:
        """A checkpoints record was produced in the open transaction (in order)."""
        if key is not None:
            self._produced.setdefault(partition, []).append((key, value))

    def delivered(self, err: KafkaError | None, msg: Msg) -> None:
        """The delivery report of a partition's last record in the transaction."""
        offset = msg.offset()
        if err is None and offset is not None:
            self._last[msg.partition() or 0] = offset

    def aborted(self) -> None:
        self._produced.clear()
        self._last.clear()

    def committed(self, owned: Mapping[int, PartitionState]) -> None:
        """The transaction committed: apply what it wrote, by partition, in offset order.

        Only the last record of each partition had a delivery report; the
        others' offsets are derived from it: ``last - (n - 1 - i)`` for the
        i-th of ``n``.  The idempotent producer appends one partition's
        records in produce order, so the true offsets are increasing and the
        derived ones are equal to them when no other producer wrote in between
        (the partition's owner is its only writer) — and otherwise still
        increasing, above the previous transaction's and exact for the last
        record, which is all the store uses offsets for: order, the position
        and the digest the next assignment verifies.

        A head carries its session's quarantine (the gauge counts them at the
        next assignment without loading the sessions).
        """
        produced, self._produced = self._produced, {}
        lasts, self._last = self._last, {}
        for p, written in produced.items():
            if p not in owned or p in self.broken:
                continue
            last = lasts.get(p)
            if last is None:  # the report missing: the store cannot say what it reflects
                self._break(p, "the delivery report of the transaction's last record is missing")
                continue
            part = owned[p]
            first = last - len(written) + 1
            records = [
                StoredRecord(
                    first + i,
                    key,
                    value,
                    value is not None
                    and not key.startswith(PART_MARK)
                    and key.decode("utf-8", "replace") in part.quarantined,
                )
                for i, (key, value) in enumerate(written)
            ]
            if self.writer is not None:
                self.writer.put((p, records, last + 1))
            else:
                self._apply(p, records, last + 1)

    def _write_all(self, writes: list[_Write]) -> None:
        """The writer thread's apply: any failure stops the partition's writes."""
        for partition, records, next_offset in writes:
            try:
                self._apply(partition, records, next_offset)
            except Exception as exc:
                self._break(partition, f"write failed: {exc!r}")

    def _apply(self, partition: int, records: list[StoredRecord], next_offset: int) -> None:
        if partition in self.broken:
            return
        try:
            self._db(partition).apply(self.topic, partition, self._topic_id, records, next_offset)
        except sqlite3.Error as exc:
            self._break(partition, f"write failed: {exc}")

    def _break(self, partition: int, why: str) -> None:
        line = f"local store partition {partition}: {why}"
        with self._broken_lock:
            self.broken = {**self.broken, partition: line}
        log.error("%s; it takes no more writes until reassigned", line)

    @property
    def problem(self) -> str | None:
        """What /readyz reports (None: the store works)."""
        if self.open_problem is not None:
            return self.open_problem
        return next(
            iter(self.broken.values()), next(iter(self.in_memory.values()), self.over_budget)
        )


def is_corrupt(exc: sqlite3.Error) -> bool:
    """The file is damaged (not a full disk, an I/O error or a lock)."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    return name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or (
        type(exc) is sqlite3.DatabaseError and "malformed" in str(exc)
    )


def _first_held(
    reader: Reader,
    topic: str,
    partition: int,
    offset: int,
    *,
    end: int,
    timeout_s: float = 120.0,
) -> StoredRecord | None:
    """The topic's first committed record at or after ``offset`` (None: it holds
    none below ``end``, the committed end the caller read).

    "None" must be an answer, never a read that came back empty: ``reads.stream``
    reads past an end-of-partition below ``end`` (a new leader whose high
    watermark still catches up in a broker restart) and raises a transient
    error when nothing answers within ``timeout_s`` (the assignment is put off
    and tried again), so a broker's trouble is never taken for a record the
    topic does not hold.
    """
    batches = stream(
        reader,
        topic,
        {partition: offset},
        {partition: end},
        batch=FILL_BATCH,
        limit=1,
        timeout_s=timeout_s,
    )
    with contextlib.closing(batches):  # unassigns the reader at once
        for _, batch, _ in batches:
            for m in batch:
                return StoredRecord(m.offset() or 0, m.key() or b"", m.value())
    return None
