"""The local store is a cache of topic partitions that is never trusted blindly (issue 13)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from processor.service.store.local_store import (
    GAP_MAX_AGE_S,
    LocalStore,
    StoredRecord,
    record_digest,
)

TOPIC = "p.checkpoints"


def session_of(key: bytes) -> bytes:
    return key.split(b"#", 1)[0]


def store(path: Path, cluster: str = "c1") -> LocalStore:
    return LocalStore(path / "store.sqlite", cluster, session_of)


class Topic:
    """A partition's log as the broker holds it (what ``verify`` probes): the
    cleaner leaves holes (None), offsets never move."""

    def __init__(self) -> None:
        self.log: list[StoredRecord | None] = []

    def append(self, key: bytes, value: bytes | None) -> StoredRecord:
        rec = StoredRecord(len(self.log), key, value)
        self.log.append(rec)
        return rec

    def compact(self, *offsets: int) -> None:
        """The cleaner removed these records (a later one has their key)."""
        for offset in offsets:
            self.log[offset] = None

    def read_at(self, offset: int) -> StoredRecord | None:
        """The first record held at or after ``offset`` (None: none to the end)."""
        return next((r for r in self.log[max(offset, 0) :] if r is not None), None)

    @property
    def end(self) -> int:
        return len(self.log)


def test_apply_keeps_the_last_record_per_key_and_tombstones_delete(tmp_path: Path) -> None:
    s, t = store(tmp_path), Topic()
    recs = [
        t.append(b"a", b"1"),
        t.append(b"a#p1", b"x"),
        t.append(b"b", b"1"),
        t.append(b"a", b"2"),
        t.append(b"a#p1", None),
    ]
    s.apply(TOPIC, 0, "id1", recs, t.end)
    assert list(s.records(TOPIC, 0)) == [(b"b", b"1"), (b"a", b"2")]
    assert s.session_records(TOPIC, 0, "a") == [(b"a", b"2")]
    assert s.sessions(TOPIC, 0) == 2
    pos = s.position(TOPIC, 0)
    assert pos is not None and pos.next_offset == 5 and pos.last_offset == 4
    assert pos.last_digest == record_digest(b"a#p1", None)


def test_a_reopened_store_continues_where_it_was(tmp_path: Path) -> None:
    s, t = store(tmp_path), Topic()
    s.apply(TOPIC, 3, "id1", [t.append(b"a", b"1")], t.end)
    s.close()
    again = store(tmp_path)
    assert again.reset_reason is None
    assert again.verify(TOPIC, 3, "id1", t.end, t.read_at) is not None
    assert list(again.records(TOPIC, 3)) == [(b"a", b"1")]


def test_a_store_of_another_cluster_is_emptied(tmp_path: Path) -> None:
    s, t = store(tmp_path, "c1"), Topic()
    s.apply(TOPIC, 0, "id1", [t.append(b"a", b"1")], t.end)
    s.close()
    other = store(tmp_path, "c2")
    assert other.reset_reason is not None and "c1" in other.reset_reason
    assert other.position(TOPIC, 0) is None and list(other.records(TOPIC, 0)) == []


def test_a_recreated_topic_drops_the_partition(tmp_path: Path) -> None:
    s, t = store(tmp_path), Topic()
    s.apply(TOPIC, 0, "id1", [t.append(b"a", b"1")], t.end)
    assert s.verify(TOPIC, 0, "id2", t.end, t.read_at) is None
    assert list(s.records(TOPIC, 0)) == []


def test_a_store_ahead_of_the_topic_is_dropped(tmp_path: Path) -> None:
    s, t = store(tmp_path), Topic()
    s.apply(TOPIC, 0, "id1", [t.append(b"a", b"1"), t.append(b"b", b"1")], t.end)
    # the topic lost its tail (an aborted transaction the store must not have kept)
    assert s.verify(TOPIC, 0, "id1", 1, t.read_at) is None
    assert s.position(TOPIC, 0) is None


def test_a_store_copied_from_another_run_is_dropped(tmp_path: Path) -> None:
    # same cluster and topic id, same offsets, other content: only the probe tells
    s, ours = store(tmp_path / "ours"), Topic()
    theirs_dir = tmp_path / "theirs"
    theirs, their_topic = store(theirs_dir), Topic()
    s.apply(TOPIC, 0, "id1", [ours.append(b"a", b"ours")], ours.end)
    theirs.apply(TOPIC, 0, "id1", [their_topic.append(b"a", b"theirs")], their_topic.end)
    s.close()
    theirs.close()
    shutil.copy(theirs_dir / "store.sqlite", tmp_path / "ours" / "store.sqlite")
    for suffix in ("-wal", "-shm"):
        Path(f"{tmp_path / 'ours' / 'store.sqlite'}{suffix}").unlink(missing_ok=True)
    copied = store(tmp_path / "ours")
    assert copied.verify(TOPIC, 0, "id1", ours.end, ours.read_at) is None


def test_a_store_behind_the_topic_is_kept_and_caught_up(tmp_path: Path) -> None:
    s, t = store(tmp_path), Topic()
    s.apply(TOPIC, 0, "id1", [t.append(b"a", b"1")], t.end)
    tail = [t.append(b"a", b"2"), t.append(b"c", b"1")]  # committed, not yet applied (crash)
    pos = s.verify(TOPIC, 0, "id1", t.end, t.read_at)
    assert pos is not None and pos.next_offset == 1
    s.apply(TOPIC, 0, "id1", [r for r in t.log[pos.next_offset :] if r in tail], t.end)
    assert dict(s.records(TOPIC, 0)) == {b"a": b"2", b"c": b"1"}


def test_an_unreadable_file_is_a_cache_miss(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    path.write_bytes(b"not a database" * 100)
    s = store(tmp_path)
    assert s.reset_reason is not None and "unreadable" in s.reset_reason
    assert s.position(TOPIC, 0) is None


def test_partitions_are_independent(tmp_path: Path) -> None:
    s, t0, t1 = store(tmp_path), Topic(), Topic()
    s.apply(TOPIC, 0, "id1", [t0.append(b"a", b"1")], t0.end)
    s.apply(TOPIC, 1, "id1", [t1.append(b"b", b"1")], t1.end)
    s.drop(TOPIC, 0)
    assert list(s.records(TOPIC, 0)) == [] and list(s.records(TOPIC, 1)) == [(b"b", b"1")]


def test_a_late_writer_never_moves_the_store_back(tmp_path: Path) -> None:
    """Records below the stored position are already applied (a member paused
    between its commit and its store write must not undo a newer owner's)."""
    s, t = store(tmp_path), Topic()
    old = t.append(b"a", b"old")
    new = t.append(b"a", b"new")
    s.apply(TOPIC, 0, "id1", [old, new], t.end)
    s.apply(TOPIC, 0, "id1", [old], old.offset + 1)
    assert list(s.records(TOPIC, 0)) == [(b"a", b"new")]
    pos = s.position(TOPIC, 0)
    assert pos is not None and pos.next_offset == t.end


def test_newest_keys_and_quarantined_sessions(tmp_path: Path) -> None:
    from processor.service.store.checkpoint_store import session_key as checkpoint_session

    s, t = LocalStore(tmp_path / "s.sqlite", "c1", checkpoint_session), Topic()
    recs = [
        t.append(b"a", b"1"),
        t.append(b"\xffb\x00p", b"x"),
        StoredRecord(len(t.log), b"b", b"1", quarantined=True),
    ]
    t.log.append(recs[-1])
    s.apply(TOPIC, 0, "id1", recs, t.end)
    assert s.newest_head(TOPIC, 0) == (b"b", b"1")  # parts (0xFF keys) skipped
    assert sorted(s.keys(TOPIC, 0)) == [b"a", b"b", b"\xffb\x00p"]
    assert s.quarantined_sessions(TOPIC, 0) == {"b"}


def test_an_in_memory_store_needs_no_file(tmp_path: Path) -> None:
    s, t = LocalStore(None, "c1", session_of), Topic()
    s.apply(TOPIC, 0, "id1", [t.append(b"a", b"1")], t.end)
    assert s.session_records(TOPIC, 0, "a") == [(b"a", b"1")]
    assert list(tmp_path.iterdir()) == []


def test_the_head_count_follows_new_and_tombstoned_heads(tmp_path: Path) -> None:
    """The restore reports sessions without counting the partition (O(1) at a million)."""
    from processor.service.store.checkpoint_store import session_key as checkpoint_session

    s, t = LocalStore(tmp_path / "s.sqlite", "c1", checkpoint_session), Topic()
    s.apply(TOPIC, 0, "id1", [t.append(b"a", b"1"), t.append(b"\xffa\x00p", b"x")], t.end)
    s.apply(TOPIC, 0, "id1", [t.append(b"a", b"2"), t.append(b"b", b"1")], t.end)
    assert s.heads(TOPIC, 0) == 2
    s.apply(TOPIC, 0, "id1", [t.append(b"a", None), t.append(b"c", None)], t.end)
    assert s.heads(TOPIC, 0) == 1
    s.drop(TOPIC, 0)
    assert s.heads(TOPIC, 0) == 0


def test_a_fill_applies_tombstones_in_offset_order_and_recounts_heads(tmp_path: Path) -> None:
    """The fill streams records (no per-batch dict): a tombstone between two
    writes of a key must leave the later write, one after them none."""
    from processor.service.store.checkpoint_store import session_key as checkpoint_session

    s, t = LocalStore(tmp_path / "s.sqlite", "c1", checkpoint_session), Topic()
    recs = [
        t.append(b"a", b"1"),
        t.append(b"\xffa\x00p", b"x"),
        t.append(b"a", None),
        t.append(b"a", b"2"),
        t.append(b"b", b"1"),
        t.append(b"\xffa\x00p", None),
        t.append(b"c", b"1"),
        t.append(b"c", None),
    ]
    s.filling(True)
    s.apply(TOPIC, 0, "id1", iter(recs), t.end, recount=True)
    s.filling(False)
    assert dict(s.records(TOPIC, 0)) == {b"a": b"2", b"b": b"1"}
    assert s.heads(TOPIC, 0) == 2
    pos = s.position(TOPIC, 0)
    assert pos is not None and pos.last_offset == 7 and pos.next_offset == 8
    assert pos.last_digest == record_digest(b"c", None)


def test_a_store_of_an_older_layout_is_emptied(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "store.sqlite"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "INSERT INTO meta VALUES ('version', '2'), ('cluster', 'c1');"
        "CREATE TABLE record (topic TEXT, partition INTEGER, key BLOB, value BLOB);"
    )
    db.commit()
    db.close()
    s = store(tmp_path)
    assert s.reset_reason is not None and "version '2'" in s.reset_reason
    s.apply(TOPIC, 0, "id1", [StoredRecord(0, b"a", b"1")], 1)
    assert list(s.records(TOPIC, 0)) == [(b"a", b"1")]


def test_overlapping_fills_keep_the_larger_cache_until_the_last_ends(tmp_path: Path) -> None:
    """A rewind's fill from zero ending while the background fill of another
    partition still runs must not shrink the page cache under it; the cache is
    back to its bound once both ended."""
    from processor.service.store.local_store import CACHE_KIB, FILL_CACHE_KIB

    store = LocalStore(tmp_path / "s.sqlite", "c1", lambda k: k)

    def kib() -> int:
        return -int(store._db.execute("PRAGMA cache_size").fetchone()[0])

    assert kib() == CACHE_KIB
    store.filling(True)  # the background fill
    store.filling(True)  # a rewind's fill
    store.filling(False)  # the rewind's ends first
    assert kib() == FILL_CACHE_KIB
    store.filling(False)
    assert kib() == CACHE_KIB
    store.close()


def test_a_last_record_compacted_away_keeps_the_store(tmp_path: Path) -> None:
    """Another owner wrote the store's sessions anew while it was away and the
    cleaner removed the record the store ended on (the chaos runs' drops): the
    history is intact, so the store is kept and caught up from its position."""
    s, t = store(tmp_path), Topic()
    s.apply(TOPIC, 0, "id1", [t.append(b"a", b"1"), t.append(b"b", b"1")], t.end)
    newer = [t.append(b"b", b"2"), t.append(b"a", b"2")]
    t.compact(0, 1)
    pos = s.verify(TOPIC, 0, "id1", t.end, t.read_at)
    assert pos is not None and pos.next_offset == 2
    s.apply(TOPIC, 0, "id1", newer, t.end)
    assert dict(s.records(TOPIC, 0)) == {b"a": b"2", b"b": b"2"}


def test_a_gap_up_to_the_end_keeps_the_store(tmp_path: Path) -> None:
    """The newer record was a tombstone the cleaner has removed too: nothing is
    held from the store's last record to the end, which is no change either."""
    s, t = store(tmp_path), Topic()
    s.apply(TOPIC, 0, "id1", [t.append(b"a", b"1"), t.append(b"b", b"1")], t.end)
    t.append(b"b", None)
    t.compact(1, 2)
    assert s.verify(TOPIC, 0, "id1", t.end, t.read_at) is not None


def test_a_record_between_the_last_one_and_the_position_drops_the_store(
    tmp_path: Path,
) -> None:
    """The store's position moved past a marker (offset 2) after its last record
    (1): a topic holding a record at 2 was rewritten, even with 1 gone."""
    s, t = store(tmp_path), Topic()
    s.apply(TOPIC, 0, "id1", [t.append(b"a", b"1"), t.append(b"b", b"1")], 3)
    t.append(b"c", b"1")
    t.compact(1)
    assert s.verify(TOPIC, 0, "id1", t.end, t.read_at) is None
    assert s.position(TOPIC, 0) is None


def test_a_log_starting_after_the_last_record_drops_the_store(tmp_path: Path) -> None:
    """Records were deleted (retention, DeleteRecords): the store may hold what the
    topic let go, so a gap there proves nothing."""
    s, t = store(tmp_path), Topic()
    s.apply(TOPIC, 0, "id1", [t.append(b"a", b"1"), t.append(b"b", b"1")], t.end)
    t.append(b"c", b"1")
    t.compact(0, 1)
    assert s.verify(TOPIC, 0, "id1", t.end, t.read_at, log_start=2) is None


def test_another_record_at_the_last_offset_drops_the_store(tmp_path: Path) -> None:
    """A truncated log that took new appends holds another record there."""
    s, t = store(tmp_path), Topic()
    s.apply(TOPIC, 0, "id1", [t.append(b"a", b"1"), t.append(b"b", b"1")], t.end)
    t.log[1] = StoredRecord(1, b"b", b"other")
    t.append(b"c", b"1")
    assert s.verify(TOPIC, 0, "id1", t.end, t.read_at) is None


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_gap_in_an_old_store_drops_it_a_missed_tombstone_may_be_gone(tmp_path: Path) -> None:
    """Away longer than tombstones live: the other owner deleted ``a`` and the
    cleaner has removed the tombstone too — the gap looks the same, and keeping
    the store would keep ``a`` (a session the topic deleted)."""
    clock = Clock()
    s, t = LocalStore(tmp_path / "s.sqlite", "c1", session_of, clock), Topic()
    s.apply(TOPIC, 0, "id1", [t.append(b"a", b"1"), t.append(b"b", b"1")], t.end)
    t.append(b"a", None)  # deleted while away ...
    t.append(b"b", b"2")
    t.compact(0, 1, 2)  # ... and the tombstone, past delete.retention.ms, is gone too
    clock.now += GAP_MAX_AGE_S + 1
    assert s.verify(TOPIC, 0, "id1", t.end, t.read_at) is None
    assert list(s.records(TOPIC, 0)) == []


def test_a_gap_in_a_young_store_keeps_it(tmp_path: Path) -> None:
    clock = Clock()
    s, t = LocalStore(tmp_path / "s.sqlite", "c1", session_of, clock), Topic()
    s.apply(TOPIC, 0, "id1", [t.append(b"a", b"1")], t.end)
    t.append(b"a", b"2")
    t.compact(0)
    clock.now += GAP_MAX_AGE_S - 60
    assert s.verify(TOPIC, 0, "id1", t.end, t.read_at) is not None


def test_a_store_file_of_the_layout_before_takes_an_unknown_age(tmp_path: Path) -> None:
    """Files written before the position kept its time: reopened, not emptied; their
    held last record proves them as before, a gap does not (age unknown)."""
    s, t = store(tmp_path), Topic()
    s.apply(TOPIC, 0, "id1", [t.append(b"a", b"1")], t.end)
    s.apply(TOPIC, 1, "id1", [t.append(b"b", b"1")], t.end)
    s.close()
    with sqlite3.connect(tmp_path / "store.sqlite") as db:
        db.execute("ALTER TABLE position DROP COLUMN applied_at")
    again = store(tmp_path)
    assert again.reset_reason is None
    pos = again.position(TOPIC, 0)
    assert pos is not None and pos.applied_at == 0
    assert again.verify(TOPIC, 0, "id1", t.end, t.read_at) is not None  # held: kept
    t.append(b"b", b"2")
    t.compact(1)
    assert again.verify(TOPIC, 1, "id1", t.end, t.read_at) is None  # a gap: dropped
