"""Acknowledged positions, per (session id, format generation), in SQLite.

A row says: of this session's generation-N file, every record before
``offset`` and every event up to ``acked_seq`` has been acknowledged by the
broker.  Rows are written only from delivery reports, so after ``kill -9``
the shipper resumes at or behind what Kafka holds (what it sends again is an
exact duplicate).  ``digest`` is the 8-byte digest of the event at
``acked_seq``: a file rewritten under a seq already sent is recognised even
after a restart.  The path is kept for operators only; a file is never
identified by its path or inode.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS position (
  session TEXT NOT NULL,
  generation INTEGER NOT NULL,
  path TEXT NOT NULL,
  offset INTEGER NOT NULL,
  acked_seq INTEGER NOT NULL,
  digest BLOB,
  anchor_start INTEGER,
  anchor BLOB,
  updated_ms INTEGER NOT NULL,
  PRIMARY KEY (session, generation)
)
"""


@dataclass(frozen=True, slots=True)
class Position:
    session: str
    generation: int
    path: str
    offset: int
    acked_seq: int
    digest: bytes | None = None
    #: start and digest of the record ending at ``offset`` (checked on resume)
    anchor_start: int | None = None
    anchor: bytes | None = None


class Registry:
    """The shipper's own state; ``path`` is created with its directory."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(str(path), isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # a process crash loses nothing committed under WAL; a power loss may
        # lose the last commits, which only means sending exact duplicates
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self.commits = 0
        #: positions were lost or never kept (and not yet learnt from the topic)
        self.fresh = (
            self._db.execute("SELECT 1 FROM meta WHERE key = 'initialized'").fetchone() is None
        )

    def mark_initialized(self) -> None:
        """Positions are known from here on (learnt from the topic, or not wanted)."""
        with self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('initialized', ?)",
                (str(int(time.time() * 1000)),),
            )
        self.fresh = False

    def load(self) -> dict[str, dict[int, Position]]:
        out: dict[str, dict[int, Position]] = {}
        rows = self._db.execute(
            "SELECT session, generation, path, offset, acked_seq, digest, anchor_start, anchor"
            " FROM position"
        )
        for sid, gen, path, offset, seq, dig, a_start, anchor in rows:
            out.setdefault(sid, {})[gen] = Position(
                sid, gen, path, offset, seq, dig, a_start, anchor
            )
        return out

    def save(self, positions: list[Position]) -> None:
        """Write ``positions`` in one transaction."""
        if not positions:
            return
        now = int(time.time() * 1000)
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany(
                "INSERT INTO position (session, generation, path, offset, acked_seq, digest,"
                " anchor_start, anchor, updated_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (session, generation) DO UPDATE SET path=excluded.path,"
                " offset=excluded.offset, acked_seq=excluded.acked_seq, digest=excluded.digest,"
                " anchor_start=excluded.anchor_start, anchor=excluded.anchor,"
                " updated_ms=excluded.updated_ms",
                [
                    (
                        p.session,
                        p.generation,
                        p.path,
                        p.offset,
                        p.acked_seq,
                        p.digest,
                        p.anchor_start,
                        p.anchor,
                        now,
                    )
                    for p in positions
                ],
            )
        self.commits += 1

    def close(self) -> None:
        self._db.close()
