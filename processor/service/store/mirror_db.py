"""A mirror's SQLite file: connections, transactions, its live bytes and their budget.

Both mirrors of a compacted topic keep it in SQLite (standard library; WAL, so
readers on their own connections see whole write transactions while the
writer thread writes; a fixed page cache per connection, so memory does not
grow with the keys held — only the file does, like the compacted topic):
the checkpoint store (``local_store.py``, kept across runs: durable enough
to be caught up from its position) and the query cache
(``queries/query_cache.py``, rebuilt on every start: no fsync at all).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import Gauge


def connect(
    path: Path | None,
    *,
    cache_kib: int,
    durable: bool,
    page_size: int | None = None,
    autocommit: bool = False,
    busy_timeout_ms: int | None = None,
) -> sqlite3.Connection:
    """A connection any one thread at a time may use (``None``: in memory).

    ``durable``: ``synchronous=NORMAL`` — in WAL mode it syncs at checkpoints
    only and never corrupts; a power loss may drop the last transactions,
    which a mirror kept across runs catches up from the topic.  Else ``OFF``
    (a mirror rebuilt on every start).  ``page_size`` takes on a new file
    only; ``autocommit``: transactions through :func:`transaction`."""
    where = ":memory:" if path is None else path
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(where, check_same_thread=False)
    if autocommit:
        db.isolation_level = None
    if path is None:
        return db
    if page_size is not None:
        db.execute(f"PRAGMA page_size={page_size}")  # before the first table
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={'NORMAL' if durable else 'OFF'}")
    db.execute(f"PRAGMA cache_size=-{cache_kib}")
    if busy_timeout_ms is not None:
        db.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
    return db


def remove_files(path: Path | None) -> None:
    """Delete a mirror's file and its WAL (the next open starts empty)."""
    if path is None:
        return
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


@contextlib.contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` .. ``COMMIT`` (``ROLLBACK`` on error) on an autocommit connection."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def live_bytes(db: sqlite3.Connection) -> int:
    """Bytes of the file's pages in use (free pages left out)."""
    pages, free, size = (
        int(db.execute(f"PRAGMA {name}").fetchone()[0])
        for name in ("page_count", "freelist_count", "page_size")
    )
    return (pages - free) * size


class ByteBudget:
    """A bound on a mirror's live bytes, measured after each write and reported
    (the gauge); what a breach means is the mirror's to say (the query cache
    gives the partition up rather than serve it partially)."""

    def __init__(self, limit: int, gauge: Gauge) -> None:
        self.limit = limit
        self.gauge = gauge

    def measure(self, db: sqlite3.Connection) -> int:
        """The live bytes now (reported)."""
        return self.reported(live_bytes(db))

    def reported(self, live: int) -> int:
        """``live`` bytes measured by the caller, set on the gauge."""
        self.gauge.set(live)
        return live

    def passed(self, db: sqlite3.Connection) -> bool:
        """The live bytes are past the limit (measured and reported)."""
        return self.measure(db) > self.limit
