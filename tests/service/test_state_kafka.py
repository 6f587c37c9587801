"""The local store on a real broker (issue 13): crashes around the store write,
a deleted store, a store of recreated topics — the views always equal the
offline fold and nothing is lost.
"""

from __future__ import annotations

import logging
import re
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)

from processor.core.builder import LogBuilder
from processor.kafka import clients
from processor.kafka.topic_admin import create_topics, delete_topics
from tests.service.conftest import Stack, sessions, wait_until
from tests.service.test_processor import topic_records, wait_for_views

pytestmark = pytest.mark.kafka


def _spawn(
    stack: Stack, instance_id: str, state: Path, log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    return stack.spawn(
        instance_id,
        "--commit-interval-ms",
        "100",
        env={"PROCESSOR_STATE_DIR": str(state), **(env or {})},
        log=log,
    )


def _produce(stack: Stack, logs: dict[str, list], lo: int, hi: int) -> None:
    producer = stack.producer()
    for sid, events in logs.items():
        stack.produce(sid, events[lo:hi], producer)
    assert producer.flush(30) == 0


@pytest.mark.parametrize("point", ["after-commit", "before-send-offsets"])
def test_sigkill_around_the_store_write_loses_nothing(
    stack: Stack, tmp_path: Path, point: str
) -> None:
    """after-commit: the transaction committed, the store not written (it is then
    behind, and caught up from its offset); before-send-offsets: the transaction
    never commits (the store must not hold its records)."""
    logs = sessions(8, 90, seed=31)
    state, arm = tmp_path / "state", tmp_path / "arm"
    log = tmp_path / "member.log"
    _produce(stack, logs, 0, 30)
    env = {"PROCESSOR_FAULTPOINT": point, "PROCESSOR_FAULTPOINT_ARM": str(arm)}
    proc = _spawn(stack, "m1", state, log, env)
    try:
        wait_for_views(stack, {sid: stack.expected(sid, 29) for sid in logs}, timeout=120)
        arm.touch()
        _produce(stack, logs, 30, 60)
        proc.wait(120)  # killed at the crash point
        assert proc.returncode == -9, log.read_text()[-3000:]
        proc = _spawn(stack, "m1", state, log)
        _produce(stack, logs, 60, 90)
        wait_for_views(stack, {sid: stack.expected(sid) for sid in logs}, timeout=120)
    finally:
        proc.kill()
        proc.wait(30)
    text = log.read_text()
    kept = [int(n) for n in re.findall(r"kept to offset \d+, (\d+) records read", text)]
    assert kept, text[-3000:]  # the second start reused the store
    if point == "after-commit":  # behind by the committed batch: caught up from the topic
        assert sum(kept) > 0, text[-3000:]


def test_a_deleted_store_is_refilled(stack: Stack, tmp_path: Path) -> None:
    logs = sessions(6, 60, seed=32)
    state = tmp_path / "state"
    _produce(stack, logs, 0, 30)
    stack.run_processor(max_idle_s=3, state_dir=str(state))
    shutil.rmtree(state)
    _produce(stack, logs, 30, 60)
    proc = stack.run_processor(max_idle_s=3, state_dir=str(state))
    assert proc.metrics.store_records_read._value.get() > 0
    wait_for_views(stack, {sid: stack.expected(sid) for sid in logs}, timeout=30)


def test_a_store_of_recreated_topics_is_never_served(stack: Stack, tmp_path: Path) -> None:
    """The store outlives the topics (deleted and created anew, other events under
    the same session ids): its checkpoints are another log's and are dropped."""
    state = tmp_path / "state"
    first = sessions(4, 60, seed=33)
    _produce(stack, first, 0, 60)
    stack.run_processor(max_idle_s=3, state_dir=str(state))
    admin = clients.admin(stack.config)
    topics = stack.config.topics
    names = [topics.events, topics.views, topics.checkpoints, topics.dlq, topics.control]
    delete_topics(admin, names)
    wait_until(
        lambda: not set(names) & set(admin.list_topics(timeout=10).topics), "topics to be gone"
    )
    deadline = time.monotonic() + 60
    while True:  # the broker may still be removing them
        try:
            create_topics(admin, stack.config)
            break
        except Exception:
            assert time.monotonic() < deadline
            time.sleep(1)
    other = sessions(4, 40, seed=34)  # same ids, another history
    stack.logs.clear()
    _produce(stack, other, 0, 40)
    proc = stack.run_processor(max_idle_s=4, state_dir=str(state))
    assert proc.metrics.store_partitions_dropped._value.get() > 0  # the drops are counted
    wait_for_views(stack, {sid: stack.expected(sid) for sid in other}, timeout=30)


def test_sigkill_during_a_background_fill_loses_nothing(stack: Stack, tmp_path: Path) -> None:
    """A fresh host is killed after a slice of its fill reached the store, before
    its partitions resumed; it comes back on the partial store (verified, caught
    up from where the slice left it) and the views equal the offline fold."""
    logs = sessions(8, 90, seed=33)
    _produce(stack, logs, 0, 30)
    stack.run_processor(max_idle_s=3, state_dir=str(tmp_path / "first"))
    _produce(stack, logs, 30, 60)
    state, log = tmp_path / "fresh", tmp_path / "member.log"
    proc = _spawn(stack, "m1", state, log, {"PROCESSOR_FAULTPOINT": "fill-slice-applied"})
    try:
        proc.wait(120)  # killed with a slice in the store
        assert proc.returncode == -9, log.read_text()[-3000:]
        assert "restored partition" not in log.read_text()  # no partition resumed
        proc = _spawn(stack, "m1", state, log)
        _produce(stack, logs, 60, 90)
        wait_for_views(stack, {sid: stack.expected(sid) for sid in logs}, timeout=120)
    finally:
        proc.kill()
        proc.wait(30)
    text = log.read_text()
    assert re.search(r"kept to offset \d+", text), text[-3000:]  # the slice was kept


def test_a_member_joining_during_a_fill_takes_partitions_mid_fill(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """librdkafka's cooperative rebalance revokes partitions that are paused and
    filling: their fills are cancelled, nothing of them was folded, the joining
    member fills and resumes them, no partition stays paused, and the views
    equal the offline fold."""
    import threading

    from processor.service.partitions.background_fill import BackgroundFill

    logs = sessions(8, 60, seed=44)
    _produce(stack, logs, 0, 30)
    stack.run_processor(max_idle_s=3, state_dir=str(tmp_path / "first"))
    _produce(stack, logs, 30, 60)
    hold = threading.Event()
    real = BackgroundFill.step

    def held(self: BackgroundFill) -> Any:
        return real(self) if hold.is_set() else {}

    monkeypatch.setattr(BackgroundFill, "step", held)
    a, ta = stack.start_thread(instance_id="f1", state_dir=str(tmp_path / "a"))
    b = tb = None
    try:
        parts = stack.config.partitions
        wait_until(lambda: len(a.rebalance.fill.jobs) == parts, "the first member filling")
        b, tb = stack.start_thread(instance_id="f2", state_dir=str(tmp_path / "b"))
        wait_until(
            lambda: (
                b is not None
                and len(a.rebalance.fill.jobs) + len(b.rebalance.fill.jobs) == parts
                and a.metrics.rebalances.labels("revoke")._value.get() >= 1
                and len(b.rebalance.fill.jobs) >= 1
            ),
            "partitions moved to the second member mid-fill",
        )
        assert not set(a.rebalance.fill.jobs) & set(b.rebalance.fill.jobs)
        assert a.metrics.records_consumed._value.get() == 0  # paused: nothing folded
        assert b.metrics.records_consumed._value.get() == 0
        hold.set()
        wait_for_views(stack, {sid: stack.expected(sid) for sid in logs}, timeout=120)
        assert not a.rebalance.fill.jobs and not b.rebalance.fill.jobs
        assert set(a.engine.partitions) | set(b.engine.partitions) == set(range(parts))
    finally:
        hold.set()
        for proc, thread in ((a, ta), (b, tb)):
            if proc is not None and thread is not None:
                proc.stop()
                thread.join(60)


def _compact_fast(stack: Stack) -> None:
    """Let the cleaner loose on the checkpoints topic: small segments, eager cleaning
    (tombstones kept their 24 h: a young store's gap hides none)."""
    fast = {
        "segment.ms": "1000",
        "min.cleanable.dirty.ratio": "0.01",
        "min.compaction.lag.ms": "0",
    }
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        stack.config.topics.checkpoints,
        incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in fast.items()
        ],
    )
    admin = clients.admin(stack.config)  # held: the futures die with their client
    for future in admin.incremental_alter_configs([resource]).values():
        future.result()


def test_a_store_whose_last_record_was_compacted_away_is_kept(
    stack: Stack, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The chaos runs' "does not hold the store's last record" drops: while a member
    was away another one wrote newer checkpoints of its sessions, and the cleaner
    removed the superseded record the store ended on.  The history is intact, so
    the store is kept and caught up from its position — not refilled from zero."""
    logs = sessions(6, 90, seed=35)
    home, other = tmp_path / "home", tmp_path / "other"
    _produce(stack, logs, 0, 30)
    stack.run_processor(max_idle_s=3, state_dir=str(home))
    path = stack.config.with_overrides(state_dir=str(home)).state_path
    assert path is not None
    with sqlite3.connect(path) as db:  # where the home store ends, by partition
        lasts = dict(db.execute("SELECT partition, last_offset FROM position").fetchall())
    assert lasts
    _produce(stack, logs, 30, 60)
    stack.run_processor(max_idle_s=3, state_dir=str(other))  # newer checkpoints, same keys
    _compact_fast(stack)

    def gone() -> set[int]:
        records = topic_records(stack, stack.config.topics.checkpoints)
        held = {(m.partition(), m.offset()) for m in records}
        return {p for p, n in lasts.items() if (p, n) not in held}

    deadline = time.monotonic() + 150  # the cleaner's pace under load (CI: 2 cores)
    while not gone():
        assert time.monotonic() < deadline, f"the cleaner never removed any of {lasts}"
        time.sleep(2)
        roller = LogBuilder()  # new writes after segment.ms roll the active segments
        roller.system("roll")
        for i in range(3):
            stack.produce(f"roller-{i}-{time.monotonic_ns()}", roller.events)
        stack.run_processor(max_idle_s=1, state_dir=str(other))
    _produce(stack, logs, 60, 90)
    caplog.set_level(logging.INFO, logger="processor")
    proc = stack.run_processor(max_idle_s=3, state_dir=str(home))
    assert "dropped" not in caplog.text, caplog.text[-3000:]
    assert "was compacted away" in caplog.text, caplog.text[-3000:]  # the gap was met
    kept = re.findall(r"restored partition (\d+).*?kept to offset", caplog.text)
    assert {int(p) for p in kept} == set(lasts), caplog.text[-3000:]
    assert proc.metrics.store_partitions_dropped._value.get() == 0
    wait_for_views(stack, {sid: stack.expected(sid) for sid in logs}, timeout=30)
