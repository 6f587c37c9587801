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
the caller proves that record is still in the topic at that offset
(:meth:`LocalStore.verify`).  A store from another cluster or of a
recreated topic (identity differs), one ahead of the topic's committed end,
or one whose last record the topic does not hold, is dropped and refilled —
never served.  Records are applied only after their transaction committed,
so a crash leaves the store behind (caught up from its offset), not ahead.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("processor.store")

#: Layout version of the SQLite file; another version is dropped and refilled.
STORE_VERSION = 2
#: SQLite page cache per connection (negative: KiB), a fixed memory bound.
CACHE_KIB = 8 * 1024

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS position (
    topic TEXT NOT NULL, partition INTEGER NOT NULL,
    topic_id TEXT NOT NULL,
    next_offset INTEGER NOT NULL,
    last_offset INTEGER NOT NULL,
    last_digest BLOB NOT NULL,
    heads INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (topic, partition)
);
CREATE TABLE IF NOT EXISTS record (
    topic TEXT NOT NULL, partition INTEGER NOT NULL, key BLOB NOT NULL,
    session TEXT NOT NULL, value BLOB NOT NULL, offset INTEGER NOT NULL,
    quarantined INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (topic, partition, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS record_session ON record (topic, partition, session);
CREATE INDEX IF NOT EXISTS record_offset ON record (topic, partition, offset);
CREATE INDEX IF NOT EXISTS record_quarantined ON record (topic, partition) WHERE quarantined = 1;
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


def record_digest(key: bytes, value: bytes | None) -> bytes:
    """Digest of one record, to prove the topic still holds what the store applied."""
    h = hashlib.blake2b(digest_size=16)
    h.update(len(key).to_bytes(4, "big"))
    h.update(key)
    h.update(b"\x00" if value is None else b"\x01" + value)
    return h.digest()


class LocalStore:
    """See the module docstring.  One instance per member; not thread-safe."""

    def __init__(
        self, path: Path | None, cluster_id: str, session_of: Callable[[bytes], str]
    ) -> None:
        """``path`` None: an in-memory database (``state_dir = "none"``), filled
        from the topic on every assignment as the store-less restore was."""
        self.path = path
        self.cluster_id = cluster_id
        self._session_of = session_of
        #: Why the store was emptied when opened (None: it was usable).
        self.reset_reason: str | None = None
        try:
            self._db = self._open()
        except sqlite3.DatabaseError as exc:
            # an unreadable file is a cache miss, not an outage: start empty
            self.reset_reason = f"unreadable store file ({exc})"
            log.warning("local store %s: %s; starting empty", path, self.reset_reason)
            self._remove_files()
            self._db = self._open()
        found = self._meta()
        wanted = {"version": str(STORE_VERSION), "cluster": cluster_id}
        if found and found != wanted:
            self.reset_reason = (
                f"store of cluster {found.get('cluster')!r} version {found.get('version')!r}, "
                f"this is cluster {cluster_id!r} version {STORE_VERSION}"
            )
            log.warning("local store %s: %s; starting empty", path, self.reset_reason)
            self._db.close()
            self._remove_files()
            self._db = self._open()
        with self._db:
            self._db.executemany(
                "INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)", wanted.items()
            )

    # ------------------------------------------------------------ file

    def _open(self) -> sqlite3.Connection:
        if self.path is None:
            db = sqlite3.connect(":memory:")
            db.executescript(_SCHEMA)
            return db
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path)  # "with db:" below is one transaction
        db.execute("PRAGMA journal_mode=WAL")
        # NORMAL: a power loss may drop the last transactions; the store is
        # then behind and catches up from the topic, which is always safe.
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        db.executescript(_SCHEMA)
        return db

    def _remove_files(self) -> None:
        if self.path is None:
            return
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)

    def _meta(self) -> dict[str, str]:
        return dict(self._db.execute("SELECT name, value FROM meta").fetchall())

    def close(self) -> None:
        self._db.close()

    # ------------------------------------------------------------ positions

    def position(self, topic: str, partition: int) -> Position | None:
        row = self._db.execute(
            "SELECT topic_id, next_offset, last_offset, last_digest FROM position "
            "WHERE topic = ? AND partition = ?",
            (topic, partition),
        ).fetchone()
        return None if row is None else Position(row[0], row[1], row[2], bytes(row[3]))

    def verify(
        self,
        topic: str,
        partition: int,
        topic_id: str,
        end_offset: int,
        read_at: Callable[[int], StoredRecord | None],
    ) -> Position | None:
        """The stored position if the topic proves it, else None (partition dropped).

        ``end_offset``: the partition's committed end (read_committed high
        watermark); ``read_at(offset)``: the topic's record at an offset, or
        None when the topic no longer holds it.
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
            found = read_at(pos.last_offset)
            if found is None or record_digest(found.key, found.value) != pos.last_digest:
                reason = f"the topic does not hold the store's last record at {pos.last_offset}"
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

    def apply(
        self,
        topic: str,
        partition: int,
        topic_id: str,
        records: Iterable[StoredRecord],
        next_offset: int,
    ) -> None:
        """Apply committed records in offset order and move the position, atomically."""
        pos = self.position(topic, partition)
        last_offset, last_digest = (pos.last_offset, pos.last_digest) if pos else (-1, b"")
        final: dict[bytes, StoredRecord] = {}  # the last record of a key wins
        done = pos.next_offset if pos else 0
        last: StoredRecord | None = None
        for rec in records:
            if rec.offset < done:
                continue  # already applied: a late writer never moves the store back
            final[rec.key] = last = rec
        if last is not None:
            last_offset, last_digest = last.offset, record_digest(last.key, last.value)
        sessions = {key: self._session_of(key) for key in final}
        upserts = [
            (topic, partition, r.key, sessions[r.key], r.value, r.offset, r.quarantined)
            for r in final.values()
            if r.value is not None
        ]
        deletes = [(topic, partition, r.key) for r in final.values() if r.value is None]
        next_offset = max(next_offset, done)
        heads = (self.heads(topic, partition) if pos else 0) + self._heads_delta(
            topic, partition, final.values(), sessions
        )
        with self._db:
            self._db.executemany(
                "INSERT OR REPLACE INTO record (topic, partition, key, session, value, "
                "offset, quarantined) VALUES (?, ?, ?, ?, ?, ?, ?)",
                upserts,
            )
            self._db.executemany(
                "DELETE FROM record WHERE topic = ? AND partition = ? AND key = ?", deletes
            )
            self._db.execute(
                "INSERT OR REPLACE INTO position "
                "(topic, partition, topic_id, next_offset, last_offset, last_digest, heads) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (topic, partition, topic_id, next_offset, last_offset, last_digest, heads),
            )

    def _heads_delta(
        self,
        topic: str,
        partition: int,
        records: Iterable[StoredRecord],
        sessions: Mapping[bytes, str],
    ) -> int:
        """How many heads these records add (new keys) or remove (tombstoned ones).

        A head is the record keyed by its session id itself (not one of its parts).
        """
        heads = {
            r.key: r.value is not None
            for r in records
            if sessions[r.key].encode("utf-8", "surrogateescape") == r.key
        }
        found: set[bytes] = set()
        keys = list(heads)
        for i in range(0, len(keys), 500):
            chunk = keys[i : i + 500]
            rows = self._db.execute(
                "SELECT key FROM record WHERE topic = ? AND partition = ? AND key IN "
                f"({','.join('?' * len(chunk))})",
                (topic, partition, *chunk),
            ).fetchall()
            found.update(bytes(r[0]) for r in rows)
        return sum((1 if live else 0) - (1 if key in found else 0) for key, live in heads.items())

    def heads(self, topic: str, partition: int) -> int:
        """Sessions with a head record in the partition (kept as records are applied)."""
        row = self._db.execute(
            "SELECT heads FROM position WHERE topic = ? AND partition = ?", (topic, partition)
        ).fetchone()
        return int(row[0]) if row else 0

    def drop(self, topic: str, partition: int) -> None:
        with self._db:
            self._db.execute(
                "DELETE FROM record WHERE topic = ? AND partition = ?", (topic, partition)
            )
            self._db.execute(
                "DELETE FROM position WHERE topic = ? AND partition = ?", (topic, partition)
            )

    # ------------------------------------------------------------ reading

    def records(self, topic: str, partition: int) -> Iterator[tuple[bytes, bytes]]:
        """Every stored (key, value) of a partition, in the offset order they were written."""
        cur = self._db.execute(
            "SELECT key, value FROM record WHERE topic = ? AND partition = ? ORDER BY offset",
            (topic, partition),
        )
        for key, value in cur:
            yield bytes(key), bytes(value)

    def session_records(
        self, topic: str, partition: int, session: str
    ) -> list[tuple[bytes, bytes]]:
        """The stored (key, value) records of one session, in offset order."""
        rows = self._db.execute(
            # the session index, not the offset one the ORDER BY would tempt the
            # planner into (a scan of the whole partition per session: measured)
            "SELECT key, value FROM record INDEXED BY record_session "
            "WHERE topic = ? AND partition = ? AND session = ? ORDER BY offset",
            (topic, partition, session),
        ).fetchall()
        return [(bytes(k), bytes(v)) for k, v in rows]

    def sessions(self, topic: str, partition: int) -> int:
        row = self._db.execute(
            "SELECT COUNT(DISTINCT session) FROM record WHERE topic = ? AND partition = ?",
            (topic, partition),
        ).fetchone()
        return int(row[0])

    def keys(self, topic: str, partition: int) -> Iterator[bytes]:
        """Every stored key of a partition (a rebuild tombstones them all)."""
        cur = self._db.execute(
            "SELECT key FROM record WHERE topic = ? AND partition = ?", (topic, partition)
        )
        for (key,) in cur:
            yield bytes(key)

    def newest(self, topic: str, partition: int, below: bytes) -> tuple[bytes, bytes] | None:
        """The most recently written record whose key sorts below ``below``."""
        row = self._db.execute(
            "SELECT key, value FROM record INDEXED BY record_offset "
            "WHERE topic = ? AND partition = ? AND key < ? ORDER BY offset DESC LIMIT 1",
            (topic, partition, below),
        ).fetchone()
        return None if row is None else (bytes(row[0]), bytes(row[1]))

    def quarantined_sessions(self, topic: str, partition: int) -> set[str]:
        rows = self._db.execute(
            "SELECT session FROM record INDEXED BY record_quarantined "
            "WHERE topic = ? AND partition = ? AND quarantined = 1",
            (topic, partition),
        ).fetchall()
        return {str(r[0]) for r in rows}
