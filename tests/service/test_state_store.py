"""The local store wired into the loop, lazy restore and the memory budget (issue 13).

Broker-less: the ``Processor`` loop on the in-memory cluster (``memory.py``),
each member with its own state directory.  Every scenario ends with the
views of every session equal to the offline fold of its events.
"""

from __future__ import annotations

import shutil
import sqlite3
import threading
from pathlib import Path
from typing import Any, cast

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from processor.client.views_reader import offline_equivalent, session_fold_equivalent
from processor.codec import default_codec
from processor.config import ServiceConfig
from processor.kafka.reads import stream as _stream
from processor.kafka.retry import is_transient
from processor.kafka.transport import Reader
from processor.offline import fold_events, session_output
from processor.service.store.checkpoint_store import FILL_BATCH, _first_held
from processor.service.store.local_store import StoredRecord
from processor.testing.memory import MemoryBroker, MemoryMessage
from tests.engine.kit import session_log
from tests.service.conftest import as_json
from tests.service.test_memory_transport import Loop, _committed, _views, _wait

CODEC = default_codec()
LOGS = {f"s{i}": session_log(12, seed=100 + i) for i in range(8)}


def _config(state: Path | str, **kw: Any) -> ServiceConfig:
    return ServiceConfig(partitions=2, topic_prefix="st", state_dir=str(state), **kw)


def _produce(broker: MemoryBroker, config: ServiceConfig, start: int, end: int) -> None:
    for sid, log in LOGS.items():
        for event in log[start:end]:
            broker.produce(
                config.topics.events, sid.encode(), CODEC.encode_parsed_event(sid, event)
            )


def _run(broker: MemoryBroker, config: ServiceConfig, start: int, end: int) -> Loop:
    """Produce events [start, end) of every session, run one member until committed."""
    _produce(broker, config, start, end)
    loop = Loop(broker, config)
    _wait(lambda: _committed(broker, config), loop, "committed")
    loop.stop()
    assert not loop.errors, loop.errors
    return loop


def _assert_folded(broker: MemoryBroker, config: ServiceConfig, n: int) -> None:
    views = _views(broker, config)
    for sid, log in LOGS.items():
        expected = as_json(offline_equivalent(session_output(fold_events(log[:n]))))
        assert as_json(session_fold_equivalent(views[sid])) == expected, sid


def _store_file(state: Path, config: ServiceConfig) -> Path:
    path = config.state_path
    assert path is not None and path.is_relative_to(state)
    return path


def test_a_restart_catches_up_from_the_store_not_from_offset_zero(tmp_path: Path) -> None:
    broker = MemoryBroker()
    config = _config(tmp_path)
    broker.create_topics(config)
    first = _run(broker, config, 0, 6)
    assert first.sample("processor_store_records_read_total") == 0  # nothing to read yet
    second = _run(broker, config, 6, 12)
    # the store reflected every committed checkpoint: nothing read again
    assert second.sample("processor_store_records_read_total") == 0
    assert second.sample("processor_restored_checkpoints_total") == len(LOGS)
    _assert_folded(broker, config, 12)


def test_without_a_store_file_every_assignment_reads_the_topic(tmp_path: Path) -> None:
    broker = MemoryBroker()
    config = _config("none")
    broker.create_topics(config)
    _run(broker, config, 0, 6)
    second = _run(broker, config, 6, 12)
    assert second.sample("processor_store_records_read_total") > 0
    _assert_folded(broker, config, 12)


def test_a_deleted_store_is_refilled_from_the_topic(tmp_path: Path) -> None:
    broker = MemoryBroker()
    config = _config(tmp_path)
    broker.create_topics(config)
    _run(broker, config, 0, 6)
    shutil.rmtree(tmp_path / config.group_id)
    second = _run(broker, config, 6, 12)
    assert second.sample("processor_store_records_read_total") > 0
    _assert_folded(broker, config, 12)


def test_a_store_of_another_cluster_is_never_served(tmp_path: Path) -> None:
    """A copied store (another run, another cluster) is emptied and refilled: its
    checkpoints would otherwise be folded onto as this cluster's."""
    config = _config(tmp_path)
    other = MemoryBroker()
    other.create_topics(config)
    _run(other, config, 0, 12)  # a whole other history in the store
    broker = MemoryBroker()
    broker.create_topics(config)
    _run(broker, config, 0, 4)
    second = _run(broker, config, 4, 12)
    assert second.sample("processor_store_records_read_total") == 0
    _assert_folded(broker, config, 12)


def test_a_store_behind_the_topic_catches_up(tmp_path: Path) -> None:
    """A crash between the commit and the store write leaves the store behind:
    the next assignment reads only what it misses."""
    broker = MemoryBroker()
    config = _config(tmp_path)
    broker.create_topics(config)
    _run(broker, config, 0, 4)
    saved = tmp_path / "saved.sqlite"
    shutil.copy(_store_file(tmp_path, config), saved)
    _run(broker, config, 4, 8)
    shutil.copy(saved, _store_file(tmp_path, config))  # the store as after the first run
    for suffix in ("-wal", "-shm"):
        Path(f"{_store_file(tmp_path, config)}{suffix}").unlink(missing_ok=True)
    third = _run(broker, config, 8, 12)
    read = third.sample("processor_store_records_read_total")
    with sqlite3.connect(saved) as db:
        kept = db.execute("SELECT COUNT(*) FROM record").fetchone()[0]
    assert read > 0, "the missing records were read"
    assert kept > 0
    _assert_folded(broker, config, 12)


def test_sessions_load_when_their_first_event_arrives(tmp_path: Path) -> None:
    """Lazy restore: an assignment materialises no session; an event loads one."""
    broker = MemoryBroker()
    config = _config(tmp_path)
    broker.create_topics(config)
    _run(broker, config, 0, 6)
    loop = Loop(broker, config)
    try:
        _wait(lambda: len(loop.proc.engine.partitions) == 2, loop, "assigned")
        assert loop.proc.engine.sessions_held() == 0
        sid = "s3"
        for event in LOGS[sid][6:12]:
            broker.produce(
                config.topics.events, sid.encode(), CODEC.encode_parsed_event(sid, event)
            )
        _wait(lambda: _committed(broker, config), loop, "committed")
        # (the counters move after the commit the test sees: wait for them)
        _wait(lambda: loop.sample("processor_session_loads_total") == 1, loop, "one load")
        assert loop.proc.engine.sessions_held() == 1
    finally:
        loop.stop()
    views = _views(broker, config)
    expected = as_json(offline_equivalent(session_output(fold_events(LOGS[sid]))))
    assert as_json(session_fold_equivalent(views[sid])) == expected


def test_evicted_sessions_reload_and_fold_as_the_offline_fold(tmp_path: Path) -> None:
    """A budget of one byte evicts every session after each commit: each wave of
    events reloads its sessions from the store, and the views still equal the
    offline fold."""
    broker = MemoryBroker()
    config = _config(tmp_path, state_budget_bytes=1, commit_interval_ms=20)
    broker.create_topics(config)
    loop = Loop(broker, config)
    try:
        for start in range(0, 12, 3):
            _produce(broker, config, start, start + 3)
            _wait(lambda: _committed(broker, config), loop, f"wave {start} committed")
            _wait(lambda: loop.proc.engine.sessions_held() == 0, loop, "evicted")
        n = len(LOGS)
        _wait(lambda: loop.sample("processor_session_evictions_total") >= 4 * n, loop, "evictions")
        assert loop.sample("processor_session_loads_total") >= 3 * n
        _wait(lambda: loop.sample("processor_session_state_bytes") == 0, loop, "no state held")
    finally:
        loop.stop()
    _assert_folded(broker, config, 12)


def test_within_the_budget_nothing_is_evicted(tmp_path: Path) -> None:
    broker = MemoryBroker()
    config = _config(tmp_path, commit_interval_ms=20)
    broker.create_topics(config)
    loop = Loop(broker, config)
    try:
        _produce(broker, config, 0, 12)
        _wait(lambda: _committed(broker, config), loop, "committed")
        assert loop.proc.engine.sessions_held() == len(LOGS)
        held = loop.proc.engine.held.bytes
        assert 0 < held <= config.state_budget_bytes
        assert loop.sample("processor_session_evictions_total") == 0
    finally:
        loop.stop()
    _assert_folded(broker, config, 12)


def test_quarantined_sessions_are_counted_without_loading_them(tmp_path: Path) -> None:
    """The quarantine gauge after a restart comes from the store's head flags:
    the quarantined session is known, and nothing was materialised to know it."""
    broker = MemoryBroker()
    config = _config(tmp_path)
    broker.create_topics(config)
    _produce(broker, config, 0, 4)
    sid, log = "s1", LOGS["s1"]
    broker.produce(config.topics.events, sid.encode(), CODEC.encode_parsed_event(sid, log[6]))
    first = Loop(broker, config)
    _wait(lambda: _committed(broker, config), first, "committed")
    assert first.proc.engine.sessions_quarantined() == 1
    first.stop()
    second = Loop(broker, config)
    try:
        _wait(lambda: len(second.proc.engine.partitions) == 2, second, "assigned")
        assert second.proc.engine.sessions_quarantined() == 1
        assert second.proc.engine.sessions_held() == 0
    finally:
        second.stop()


def test_one_delivery_report_per_partition_gives_every_offset(tmp_path: Path) -> None:
    """Only a partition's last checkpoint record of a transaction has a delivery
    report; the others' offsets are derived from it.  With another writer's
    records in between (true offsets 3, 7, 10) the derived ones (8, 9, 10) keep
    the order and the last offset exact, which is what the next assignment
    verifies; a missing report breaks the partition, never guesses."""
    from processor.engine import PartitionState
    from processor.service.store.checkpoint_store import CheckpointStore
    from processor.service.store.local_store import record_digest
    from processor.testing.memory import MemoryMessage

    config = _config(tmp_path)
    store = CheckpointStore(config, CODEC)
    store.open("c1", "t1")
    topic = config.topics.checkpoints
    owned = {0: PartitionState(0), 1: PartitionState(1)}
    written = [(b"a", b"1"), (b"\xffa\x00p", b"x"), (b"a", b"2")]
    for key, value in written:
        store.produced(0, key, value)
    store.produced(1, b"b", b"1")
    store.delivered(None, MemoryMessage(topic, 0, 10, b"a", b"2", 0))
    store.committed(owned)
    assert store.flush(60)  # the writer thread applies it
    db = store.store
    assert db is not None
    pos = db.position(topic, 0)
    assert pos is not None and (pos.next_offset, pos.last_offset) == (11, 10)
    assert pos.last_digest == record_digest(b"a", b"2")
    assert db.session_records(topic, 0, "a") == [(b"\xffa\x00p", b"x"), (b"a", b"2")]
    assert db.position(topic, 1) is None and 1 in store.broken  # its report never came
    assert 0 not in store.broken
    store.close()


def _damage(path: Path) -> None:
    """Flip bytes in the second half of the file: the header and the first pages
    stay readable (the store opens), the records' pages are garbage."""
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 2, len(data), 7):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def test_a_corrupt_store_ends_the_run_with_one_line_and_the_restart_refills_it(
    tmp_path: Path,
) -> None:
    """A store whose pages are damaged (the file opens) must never be folded
    from, nor crash every start: the run ends with one line naming the file,
    the file is removed, and the next start refills from the checkpoints topic."""
    broker = MemoryBroker()
    config = _config(tmp_path)
    broker.create_topics(config)
    _run(broker, config, 0, 6)
    path = _store_file(tmp_path, config)
    _damage(path)
    _produce(broker, config, 6, 12)
    loop = Loop(broker, config)
    loop.thread.join(60)
    assert not loop.thread.is_alive()
    assert len(loop.errors) == 1, loop.errors
    line = str(loop.errors[0])
    assert "\n" not in line and str(path) in line and "corrupt" in line and "removed" in line
    assert not path.exists()
    second = Loop(broker, config)  # the restart
    _wait(lambda: _committed(broker, config), second, "committed after the refill")
    second.stop()
    assert not second.errors, second.errors
    assert second.sample("processor_store_records_read_total") > 0
    _assert_folded(broker, config, 12)


def test_a_store_failing_a_session_load_ends_the_run_never_a_dead_letter(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A damaged page met when a session loads (its first event after the
    restart) is the store's failure, not the event's: no dead letter, no
    quarantine, the run ends with one line and the file is removed."""
    broker = MemoryBroker()
    config = _config(tmp_path)
    broker.create_topics(config)
    _run(broker, config, 0, 6)
    from processor.service.store.local_store import LocalStore

    def damaged(self: LocalStore, topic: str, partition: int, session: str) -> Any:
        raise sqlite3.DatabaseError("database disk image is malformed")

    monkeypatch.setattr(LocalStore, "session_records", damaged)
    _produce(broker, config, 6, 12)
    loop = Loop(broker, config)
    loop.thread.join(60)
    assert not loop.thread.is_alive()
    assert len(loop.errors) == 1 and "corrupt" in str(loop.errors[0]), loop.errors
    assert "loading session" in str(loop.errors[0])
    assert broker.committed_records(config.topics.dlq) == []
    assert not _store_file(tmp_path, config).exists()
    monkeypatch.undo()
    second = Loop(broker, config)
    _wait(lambda: _committed(broker, config), second, "committed after the refill")
    second.stop()
    assert not second.errors, second.errors
    _assert_folded(broker, config, 12)


def test_a_full_disk_in_a_rewinds_fill_holds_the_partition_in_memory(tmp_path: Path) -> None:
    """The fill driven at once (the rewind after an abort) meets a full disk: the
    partition is refilled from zero in memory, every record there, reported."""
    from processor.service.partitions.background_fill import BackgroundFill
    from processor.service.store.checkpoint_store import CheckpointStore
    from processor.telemetry.metrics import Metrics
    from processor.testing.memory import MemoryConsumer

    config = _config(tmp_path)
    broker = MemoryBroker()
    broker.create_topics(config)
    topic = config.topics.checkpoints
    for i in range(40):
        broker.append(topic, 0, f"k{i}".encode(), b"x" * 10_000, "committed")
    store = CheckpointStore(config, CODEC)
    store.open("c", "t")
    db = store.store
    assert db is not None
    pages = db._db.execute("PRAGMA page_count").fetchone()[0]
    db._db.execute(f"PRAGMA max_page_count={pages}")  # the disk is full
    fill = BackgroundFill(
        store, Metrics(), lambda: MemoryConsumer(broker, "g", eof=True), reports=False
    )
    filled = fill.run(MemoryConsumer(broker, "g", eof=True), [0])
    assert filled[0].kept_from is None and filled[0].records_read == 40
    assert set(store.in_memory) == {0} and store.problem is not None
    assert "held in memory" in store.problem
    assert store.db(0).session_records(topic, 0, "k39") == [(b"k39", b"x" * 10_000)]
    store.close()


def test_a_session_whose_commit_is_in_flight_is_not_evicted(tmp_path: Path) -> None:
    """The loop folds the next batch while the last one commits (overlap); the
    eviction after the hand-off must keep the in-flight batch's sessions: the
    store gets them only when that commit settles, and a reload before it
    read the state before them (a gap: the session was quarantined)."""
    broker = MemoryBroker()
    config = _config(tmp_path, state_budget_bytes=1, commit_interval_ms=20)
    broker.create_topics(config)
    entered_a, release_a = broker.hold("commit_transaction")
    _produce(broker, config, 0, 3)
    loop = Loop(broker, config)
    release_b = threading.Event()
    try:
        _wait(entered_a.is_set, loop, "batch A commits (held)")
        entered_b, release_b = broker.hold("commit_transaction")
        one = {"s0": LOGS["s0"]}
        for event in one["s0"][3:6]:  # batch B: folded while A commits
            broker.produce(config.topics.events, b"s0", CODEC.encode_parsed_event("s0", event))
        consumed = len(LOGS) * 3 + 3
        _wait(lambda: loop.sample("processor_records_consumed_total") >= consumed, loop, "B")
        release_a.set()
        _wait(entered_b.is_set, loop, "batch B commits (held)")
        evictions = "processor_session_evictions_total"
        _wait(lambda: loop.sample(evictions) >= len(LOGS) - 1, loop, "A's sessions evicted")
        assert loop.proc.engine.sessions_held() == 1  # s0: its batch is still committing
        for event in one["s0"][6:9]:  # folded on the held session, not a stale reload
            broker.produce(config.topics.events, b"s0", CODEC.encode_parsed_event("s0", event))
        _wait(lambda: loop.sample("processor_records_consumed_total") >= consumed + 3, loop, "C")
    finally:
        release_a.set()
        release_b.set()
    _wait(lambda: _committed(broker, config), loop, "all committed")
    loop.stop()
    assert not loop.errors, loop.errors
    views = _views(broker, config)
    for sid, log in LOGS.items():
        n = 9 if sid == "s0" else 3
        expected = as_json(offline_equivalent(session_output(fold_events(log[:n]))))
        assert as_json(session_fold_equivalent(views[sid])) == expected, sid


class _Answers:
    """A reader answering ``consume`` from a list, one answer per call (what a
    broker restart can answer, in order; only the calls ``_first_held`` makes)."""

    def __init__(self, answers: list[MemoryMessage]) -> None:
        self.answers = answers
        self.assigned: list[TopicPartition] = []

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned = partitions

    def unassign(self) -> None:
        self.assigned = []

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[MemoryMessage]:
        return [self.answers.pop(0)] if self.answers else []


def _eof(offset: int) -> MemoryMessage:
    return MemoryMessage("t", 0, offset, error=KafkaError(KafkaError._PARTITION_EOF))


def test_the_probe_reads_past_an_end_below_the_committed_one() -> None:
    """An end-of-partition below the end read before (a new leader catching up
    in a broker restart) is no answer: the probe reads on to the record."""
    answers = _Answers([_eof(5), MemoryMessage("t", 0, 7, b"k", b"v")])
    found = _first_held(cast(Reader, answers), "t", 0, 5, end=9)
    assert found == StoredRecord(7, b"k", b"v")
    assert answers.assigned == []  # unassigned after


def test_the_probe_answers_none_only_at_the_committed_end() -> None:
    assert _first_held(cast(Reader, _Answers([_eof(9)])), "t", 0, 5, end=9) is None


def test_a_probe_without_an_answer_is_a_transient_error_never_a_drop() -> None:
    with pytest.raises(KafkaException) as caught:
        _first_held(cast(Reader, _Answers([_eof(5)])), "t", 0, 5, end=9, timeout_s=0.2)
    assert is_transient(caught.value)


def test_a_fill_reads_past_an_end_below_the_committed_one() -> None:
    """The synchronous fill's stream: ending at such an end would give the store a
    position past records it never applied."""
    answers = _Answers(
        [MemoryMessage("t", 0, 3, b"a", b"1"), _eof(4), MemoryMessage("t", 0, 5, b"b", b"1")]
    )
    got = [
        (p, [m.offset() for m in batch], end)
        for p, batch, end in _stream(cast(Reader, answers), "t", {0: 3}, {0: 6}, batch=FILL_BATCH)
    ]
    assert got == [(0, [3, 5], 6)]


def test_the_rewinds_fill_gives_up_after_fill_stall_s(tmp_path: Path) -> None:
    """The rewind's fill (after an abort) stalls after the service's
    ``fill_stall_s``, as the background fill does, not a fixed 120 s: a drill
    with short bounds puts both off alike.  It raises the transient error the
    rewind puts its restore off with, counted once there (not here)."""
    from processor.service.partitions.background_fill import BackgroundFill
    from processor.service.store.checkpoint_store import CheckpointStore
    from processor.telemetry.metrics import Metrics
    from processor.testing.memory import MemoryConsumer

    config = _config(tmp_path, fill_stall_s=7)
    broker = MemoryBroker()
    broker.create_topics(config)
    for i in range(5):
        broker.append(config.topics.checkpoints, 0, f"k{i}".encode(), b"x", "committed")
    store = CheckpointStore(config, CODEC)
    store.open("c1", "t1")
    now = [0.0]

    class Silent(MemoryConsumer):
        """The broker stopped serving: nothing comes, time passes."""

        def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
            now[0] += 1.0
            return []

    metrics = Metrics()
    fill = BackgroundFill(
        store,
        metrics,
        lambda: Silent(broker, "g", eof=True),
        lambda: now[0],
        stall_s=float(config.fill_stall_s),
        reports=False,
    )
    with pytest.raises(KafkaException) as caught:
        fill.run(MemoryConsumer(broker, "g", eof=True), [0])
    assert is_transient(caught.value)
    assert "stalled: no progress for 7 s" in str(caught.value)
    assert 7 <= now[0] <= 9  # put off at the bound, not before, not a fixed 120 s
    assert metrics.registry.get_sample_value("processor_restore_waits_total") == 0
    assert fill.jobs == {} and fill._reader is None
    store.close()
