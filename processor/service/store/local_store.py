"""A local copy of compacted topic partitions, in SQLite (issue 13).

The checkpoints topic is the truth; this store is a cache of it on the
member's disk, so a restart on the same host reads what changed since its
last run instead of the whole partition, and a session's records can be
read by key without holding every session in memory.

Why SQLite: it ships with Python (nothing to install or build), a
transaction per applied batch is atomic and crash-safe (WAL), a lookup by
session is an index range scan, and its page cache has a fixed size, so the
store's memory does not grow with the number of sessions it holds.

A cache is never trusted blindly.  Each (topic, partition) remembers the
offset it reflects and a digest of the last record it applied; before use
the caller proves that record is still in the topic at that offset, or
compacted away with nothing else in its place (:meth:`LocalStore.verify`).
A store from another cluster or of a recreated topic (identity differs),
one ahead of the topic's committed end, or one whose last record the topic
does not hold (another record at its offset; a compaction gap there is no
proof of change, see :func:`unproven`), is dropped and refilled — never
served.  Records are applied only after their transaction committed, so a
crash leaves the store behind (caught up from its offset), not ahead.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from processor.service.store import mirror_db

log = logging.getLogger(__name__)

#: Layout version of the SQLite file; another version is dropped and refilled.
STORE_VERSION = 3
#: SQLite page cache per connection (negative: KiB), a fixed memory bound.
CACHE_KIB = 8 * 1024
#: The page cache while a partition is filled from zero (given back after):
#: inserts in key order of a B-tree bigger than the cache cost a read per row.
FILL_CACHE_KIB = 32 * 1024
#: Large pages: a checkpoint record is ~200 bytes, a 4 KiB page holds too few
#: of them (measured: 32 KiB pages fill ~1.5x faster); only a new file takes it.
PAGE_SIZE = 32 * 1024
#: Keys below this are heads (counted; the newest one is found by an index).
HEAD_BELOW = b"\xff"
#: A compaction gap at the store's last record keeps the store only if its
#: position moved less than this long ago.  Past it, a tombstone written after
#: the position may be gone too (the cleaner drops tombstones once they are
#: ``delete.retention.ms`` old: 24 h, the broker's default, which ``topics
#: create`` keeps), and the store would keep a record the topic deleted.
#: Half of it: room for a fill's duration and the clocks' skew.
GAP_MAX_AGE_S = 12 * 3600.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS position (
    part INTEGER PRIMARY KEY,
    topic TEXT NOT NULL, partition INTEGER NOT NULL,
    topic_id TEXT NOT NULL,
    next_offset INTEGER NOT NULL,
    last_offset INTEGER NOT NULL,
    last_digest BLOB NOT NULL,
    heads INTEGER NOT NULL DEFAULT 0,
    applied_at REAL NOT NULL DEFAULT 0,
    UNIQUE (topic, partition)
);
CREATE TABLE IF NOT EXISTS record (
    part INTEGER NOT NULL, session TEXT NOT NULL, key BLOB NOT NULL,
    value BLOB NOT NULL, offset INTEGER NOT NULL,
    quarantined INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (part, session, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS record_head_offset ON record (part, offset) WHERE key < x'ff';
CREATE INDEX IF NOT EXISTS record_quarantined ON record (part) WHERE quarantined = 1;
"""


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """One record of a topic partition as read or produced (value None: tombstone)."""

    offset: int
    key: bytes
    value: bytes | None
    #: the record is the head of a quarantined session's checkpoint (the
    #: gauge counts them without loading the session)
    quarantined: bool = False


@dataclass(frozen=True, slots=True)
class Position:
    """What a stored partition reflects: every committed record below ``next_offset``."""

    topic_id: str
    next_offset: int
    last_offset: int  # offset of the last applied record, -1: none yet
    last_digest: bytes
    applied_at: float = 0.0  # wall clock (s) when the position last moved, 0: unknown


def record_digest(key: bytes, value: bytes | None) -> bytes:
    """Digest of one record, to prove the topic still holds what the store applied."""
    h = hashlib.blake2b(digest_size=16)
    h.update(len(key).to_bytes(4, "big"))
    h.update(key)
    h.update(b"\x00" if value is None else b"\x01" + value)
    return h.digest()


def unproven(pos: Position, found: StoredRecord | None, log_start: int, now: float) -> str | None:
    """Why the topic does not prove the store's last record (None: it does).

    ``found``: the topic's first committed record at or after the store's
    last offset ``N`` (None: none up to the committed end).  The record at
    ``N`` itself with the same digest proves it.  A *compaction gap* proves
    it too — no record at ``N`` and none between ``N`` and the store's
    position — when the log starts at or before ``N``: the checkpoints topic
    is compacted, and the cleaner removes a record once a later record with
    the same key follows, which another member writes while this one is away
    (the chaos runs' drops, reproduced in ``test_state_kafka``).  Dropping
    then refilled the partition from offset 0 for nothing, a cost that grows
    with the history.

    Why a gap cannot hide what the check is for (the caller has already
    checked the topic id, so a recreated topic never gets here):

    - a truncated log (unclean leader election) that took new appends puts
      another record at ``N`` (appends take every offset in turn; only the
      cleaner makes holes): a digest mismatch; one without appends ends
      below the store's position (``verify``'s end check);
    - a log rewritten below the store's position holds a record between
      ``N`` and the position, where the store knows of none (its position
      moved past a marker or an aborted batch only): dropped;
    - deleted records (retention, DeleteRecords) move the log start past
      ``N``: dropped (the store may hold what the topic let go).

    A gap keeps the store only while its position is younger than
    :data:`GAP_MAX_AGE_S` (``now``: the wall clock).  A tombstone the store
    missed lies past its position: it was appended after the position moved,
    or (a fill cut short) it was there, not yet cleaned, when that fill read
    the record it deletes — a cleaning would have taken that record along.
    Either way the cleaner removes it no sooner than ``delete.retention.ms``
    after a moment at most a fill's duration before the position's, so a
    young store has missed none.  The record at ``N`` itself held proves no
    more (a pre-existing limit: a store away longer than the retention may
    miss a tombstone either way).

    What it cannot see: a truncation, new appends, and the new record at
    ``N`` compacted away before this check — accepted: it takes an unclean
    leader election (off by default) and the cleaner reaching exactly ``N``
    while this member was away.
    """
    n = pos.last_offset
    if log_start > n:
        return f"the topic's log starts at {log_start}, after the store's last record at {n}"
    if found is not None and found.offset == n:
        if record_digest(found.key, found.value) == pos.last_digest:
            return None
        return f"the topic does not hold the store's last record at {n} (another one is there)"
    if found is None or found.offset >= pos.next_offset:
        age = now - pos.applied_at
        if pos.applied_at > 0 and age < GAP_MAX_AGE_S:
            return None  # a compaction gap up to the store's position
        return (
            f"the topic does not hold the store's last record at {n} (compacted away) and the "
            f"store is {'of unknown age' if pos.applied_at <= 0 else f'{age / 3600:.1f} h old'}: "
            "tombstones it missed may be gone too"
        )
    if found.offset > n:
        return (
            f"the topic holds a record at {found.offset}, between the store's last record "
            f"at {n} and its position {pos.next_offset}"
        )
    return f"a read at the store's last record {n} came back at offset {found.offset}"


class LocalStore:
    """See the module docstring.  One instance per member; one thread at a time."""

    def __init__(
        self,
        path: Path | None,
        cluster_id: str,
        session_of: Callable[[bytes], bytes],
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``path`` None: an in-memory database (``state_dir = "none"``), filled
        from the topic on every assignment as the store-less restore was.
        ``session_of``: the bytes of a key's session (records are grouped by
        them; bytes, not text: nothing is decoded per record)."""
        self.path = path
        self.cluster_id = cluster_id
        self._session_of = session_of
        self._clock = clock
        self._parts: dict[tuple[str, int], int] = {}
        #: Why the store was emptied when opened (None: it was usable).
        self.reset_reason: str | None = None
        wanted = {"version": str(STORE_VERSION), "cluster": cluster_id}
        try:
            self._db = self._connect()
            found = self._meta()
        except sqlite3.DatabaseError as exc:
            # an unreadable file is a cache miss, not an outage: start empty
            self.reset_reason = f"unreadable store file ({exc})"
            log.warning("local store %s: %s; starting empty", path, self.reset_reason)
            self._remove_files()
            self._db = self._connect()
            found = {}
        if found and found != wanted:
            self.reset_reason = (
                f"store of cluster {found.get('cluster')!r} version {found.get('version')!r}, "
                f"this is cluster {cluster_id!r} version {STORE_VERSION}"
            )
            log.warning("local store %s: %s; starting empty", path, self.reset_reason)
            self._db.close()
            self._remove_files()
            self._db = self._connect()
        self._db.executescript(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(position)")}
        if "applied_at" not in columns:  # a file of the layout before: its age unknown (0)
            self._db.execute("ALTER TABLE position ADD COLUMN applied_at REAL NOT NULL DEFAULT 0")
        with self._db:
            self._db.executemany(
                "INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)", wanted.items()
            )
        #: serialises the writes: the store's writer thread and the loop's fill
        #: and drop share the write connection, never at the same time
        self.write_lock = threading.RLock()
        self._fills = 0  # fills from zero in progress (the larger page cache)
        #: the loop's reads: a second connection on a file (WAL: it reads the last
        #: committed write while the writer thread writes), the same one in memory
        self._rdb = self._db if path is None else self._connect()

    # ------------------------------------------------------------ file

    def _connect(self) -> sqlite3.Connection:
        # "with db:" below is one transaction; the connection moves to the
        # store's writer thread (one thread at a time, never two).  Durable:
        # a power loss may drop the last transactions; the store is then
        # behind and catches up from the topic, which is always safe.
        return mirror_db.connect(self.path, cache_kib=CACHE_KIB, durable=True, page_size=PAGE_SIZE)

    def remove_files(self) -> None:
        """Delete the file (a corrupt one: the next open starts empty)."""
        self._remove_files()

    def _remove_files(self) -> None:
        mirror_db.remove_files(self.path)

    def _meta(self) -> dict[str, str]:
        self._db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT)")
        return dict(self._db.execute("SELECT name, value FROM meta").fetchall())

    def close(self) -> None:
        with self.write_lock:
            if self._rdb is not self._db:
                self._rdb.close()
            self._db.close()

    # ------------------------------------------------------------ positions

    def _part(self, topic: str, partition: int, db: sqlite3.Connection | None = None) -> int | None:
        """The partition's id in the record table (None: nothing stored yet)."""
        part = self._parts.get((topic, partition))
        if part is None:
            row = (
                (db or self._db)
                .execute(
                    "SELECT part FROM position WHERE topic = ? AND partition = ?",
                    (topic, partition),
                )
                .fetchone()
            )
            if row is None:
                return None
            part = self._parts[(topic, partition)] = int(row[0])
        return part

    def position(self, topic: str, partition: int) -> Position | None:
        row = self._db.execute(
            "SELECT topic_id, next_offset, last_offset, last_digest, applied_at FROM position "
            "WHERE topic = ? AND partition = ?",
            (topic, partition),
        ).fetchone()
        return None if row is None else Position(row[0], row[1], row[2], bytes(row[3]), row[4])

    def verify(
        self,
        topic: str,
        partition: int,
        topic_id: str,
        end_offset: int,
        read_from: Callable[[int], StoredRecord | None],
        log_start: int = 0,
    ) -> Position | None:
        """The stored position if the topic proves it, else None (partition dropped).

        ``end_offset``: the partition's committed end (read_committed high
        watermark); ``read_from(offset)``: the topic's first committed record
        at or after an offset (None: it holds none below ``end_offset``);
        ``log_start``: the partition's log start offset.  A drop is logged
        with its reason.
        """
        pos = self.position(topic, partition)
        if pos is None:
            return None
        reason = None
        if pos.topic_id != topic_id:
            reason = f"topic id {pos.topic_id} is now {topic_id} (topic recreated)"
        elif pos.next_offset > end_offset:
            reason = f"store at offset {pos.next_offset} is ahead of the topic's end {end_offset}"
        elif pos.last_offset >= 0:
            found = read_from(pos.last_offset)
            reason = unproven(pos, found, log_start, self._clock())
            if reason is None and (found is None or found.offset != pos.last_offset):
                log.info(
                    "local store %s: %s[%d] kept: its last record at %d was compacted away "
                    "(the next one held: %s)",
                    self.path,
                    topic,
                    partition,
                    pos.last_offset,
                    "none" if found is None else found.offset,
                )
        if reason is None:
            return pos
        log.warning(
            "local store %s: %s[%d] dropped: %s; refilled from the topic",
            self.path,
            topic,
            partition,
            reason,
        )
        self.drop(topic, partition)
        return None

    # ------------------------------------------------------------ writing

    def filling(self, on: bool) -> None:
        """A fill from zero starts (True) or ends: the larger page cache, then back.

        Counted: the background fill and a rewind's fill can overlap, and the
        first to end must not shrink the cache under the other."""
        with self.write_lock:
            self._fills = max(0, self._fills + (1 if on else -1))
            kib = FILL_CACHE_KIB if self._fills else CACHE_KIB
            self._db.execute(f"PRAGMA cache_size=-{kib}")

    def apply(
        self,
        topic: str,
        partition: int,
        topic_id: str,
        records: Iterable[StoredRecord],
        next_offset: int,
        *,
        recount: bool = False,
    ) -> None:
        """Apply committed records in offset order and move the position, atomically.

        ``recount``: the head count is counted afresh after the write (a fill:
        one index scan instead of a lookup per head); otherwise each head is
        looked up (a commit's few records).  Records stream into SQLite as
        they come (no list of the batch: the garbage collector's passes over
        tens of thousands of live rows cost more than the inserts, measured).
        """
        with self.write_lock:
            pos = self.position(topic, partition)
            done = pos.next_offset if pos else 0
            session_of = self._session_of
            last: list[StoredRecord] = []  # the last applied record, for the digest
            held: list[StoredRecord] = []  # a tombstone that ended a run of upserts

            def upserts(part: int, it: Iterator[StoredRecord]) -> Iterator[tuple[object, ...]]:
                for r in it:
                    if r.offset < done:
                        continue  # already applied: a late writer never moves the store back
                    last[:] = (r,)
                    if r.value is None:
                        held.append(r)
                        return  # in offset order: the delete runs before what follows it
                    yield (part, session_of(r.key), r.key, r.value, r.offset, r.quarantined)

            with self._db:
                part = self._part(topic, partition)
                if part is None:
                    cur = self._db.execute(
                        "INSERT INTO position (topic, partition, topic_id, next_offset, "
                        "last_offset, last_digest) VALUES (?, ?, ?, 0, -1, x'')",
                        (topic, partition, topic_id),
                    )
                    part = self._parts[(topic, partition)] = int(cur.lastrowid or 0)
                if not recount:
                    records = list(records)
                    delta = self._heads_delta(part, [r for r in records if r.offset >= done])
                it = iter(records)
                while True:
                    self._db.executemany(
                        "INSERT OR REPLACE INTO record (part, session, key, value, offset, "
                        "quarantined) VALUES (?, ?, ?, ?, ?, ?)",
                        upserts(part, it),
                    )
                    if not held:
                        break
                    gone = held.pop()
                    self._db.execute(
                        "DELETE FROM record WHERE part = ? AND session = ? AND key = ?",
                        (part, session_of(gone.key), gone.key),
                    )
                if recount:
                    heads = self._db.execute(
                        "SELECT COUNT(*) FROM record INDEXED BY record_head_offset "
                        "WHERE part = ? AND key < x'ff'",
                        (part,),
                    ).fetchone()[0]
                else:
                    heads = (self.heads(topic, partition) if pos else 0) + delta
                if last:
                    last_offset, last_digest = (
                        last[0].offset,
                        record_digest(last[0].key, last[0].value),
                    )
                else:
                    last_offset, last_digest = (
                        (pos.last_offset, pos.last_digest) if pos else (-1, b"")
                    )
                self._db.execute(
                    "UPDATE position SET topic_id = ?, next_offset = ?, last_offset = ?, "
                    "last_digest = ?, heads = ?, applied_at = ? WHERE part = ?",
                    (
                        topic_id,
                        max(next_offset, done),
                        last_offset,
                        last_digest,
                        heads,
                        self._clock(),
                        part,
                    ),
                )

    def _heads_delta(self, part: int, records: list[StoredRecord]) -> int:
        """How many heads these records add (new keys) or remove (tombstoned ones).

        A head is a record whose key sorts below 0xFF (a checkpoint's head is
        keyed by its session id, its parts by 0xFF + ...).
        """
        heads = {r.key: r.value is not None for r in records if r.key < HEAD_BELOW}
        if not heads:
            return 0
        found: set[bytes] = set()
        keys = [(self._session_of(k), k) for k in heads]
        for i in range(0, len(keys), 250):
            chunk = keys[i : i + 250]
            found.update(
                bytes(r[0])
                for r in self._db.execute(
                    "SELECT key FROM record WHERE part = ? AND (session, key) IN "
                    f"(VALUES {','.join(['(?, ?)'] * len(chunk))})",
                    (part, *(x for pair in chunk for x in pair)),
                )
            )
        return sum((1 if live else 0) - (1 if key in found else 0) for key, live in heads.items())

    def heads(self, topic: str, partition: int) -> int:
        """Sessions with a head record in the partition (kept as records are applied)."""
        row = self._db.execute(
            "SELECT heads FROM position WHERE topic = ? AND partition = ?", (topic, partition)
        ).fetchone()
        return int(row[0]) if row else 0

    def drop(self, topic: str, partition: int) -> None:
        with self.write_lock:
            part = self._part(topic, partition)
            if part is None:
                return
            with self._db:
                self._db.execute("DELETE FROM record WHERE part = ?", (part,))
                self._db.execute("DELETE FROM position WHERE part = ?", (part,))
            self._parts.pop((topic, partition), None)

    def live_bytes(self) -> int:
        """Bytes of the file's (or the in-memory database's) pages in use."""
        with self.write_lock:
            return mirror_db.live_bytes(self._db)

    def stored(self, topic: str) -> list[tuple[int, float]]:
        """Each stored partition of ``topic`` and when its position last moved."""
        with self.write_lock:
            rows = self._db.execute(
                "SELECT partition, applied_at FROM position WHERE topic = ?", (topic,)
            ).fetchall()
        return [(int(p), float(at)) for p, at in rows]

    # ------------------------------------------------------------ reading

    def records(self, topic: str, partition: int) -> Iterator[tuple[bytes, bytes]]:
        """Every stored (key, value) of a partition, in the offset order they were written."""
        part = self._part(topic, partition, self._rdb)
        cur = self._rdb.execute(
            "SELECT key, value FROM record WHERE part = ? ORDER BY offset", (part,)
        )
        for key, value in cur:
            yield bytes(key), bytes(value)

    def session_records(
        self, topic: str, partition: int, session: str
    ) -> list[tuple[bytes, bytes]]:
        """The stored (key, value) records of one session, in offset order."""
        part = self._part(topic, partition, self._rdb)
        rows = self._rdb.execute(
            # a range of the primary key (part, session, key)
            "SELECT key, value FROM record WHERE part = ? AND session = ? ORDER BY offset",
            (part, session.encode("utf-8", "surrogateescape")),
        ).fetchall()
        return [(bytes(k), bytes(v)) for k, v in rows]

    def sessions(self, topic: str, partition: int) -> int:
        row = self._rdb.execute(
            "SELECT COUNT(DISTINCT session) FROM record WHERE part = ?",
            (self._part(topic, partition, self._rdb),),
        ).fetchone()
        return int(row[0])

    def keys(self, topic: str, partition: int) -> Iterator[bytes]:
        """Every stored key of a partition (a rebuild tombstones them all)."""
        cur = self._rdb.execute(
            "SELECT key FROM record WHERE part = ?", (self._part(topic, partition, self._rdb),)
        )
        for (key,) in cur:
            yield bytes(key)

    def newest_head(self, topic: str, partition: int) -> tuple[bytes, bytes] | None:
        """The most recently written record whose key sorts below 0xFF (a head:
        part keys start with 0xFF), from the heads-only offset index."""
        row = self._rdb.execute(
            "SELECT key, value FROM record INDEXED BY record_head_offset "
            "WHERE part = ? AND key < x'ff' ORDER BY offset DESC LIMIT 1",
            (self._part(topic, partition, self._rdb),),
        ).fetchone()
        return None if row is None else (bytes(row[0]), bytes(row[1]))

    def quarantined_sessions(self, topic: str, partition: int) -> set[str]:
        rows = self._rdb.execute(
            "SELECT session FROM record INDEXED BY record_quarantined "
            "WHERE part = ? AND quarantined = 1",
            (self._part(topic, partition, self._rdb),),
        ).fetchall()
        return {bytes(r[0]).decode("utf-8", "replace") for r in rows}
