"""The memory budget in the engine (issue 13): which sessions go, and that a
session reloaded from its checkpoint folds on exactly as if it had stayed."""

from __future__ import annotations

from processor.client.views_reader import offline_equivalent
from processor.codec import Checkpoint
from processor.engine import PartitionState
from processor.offline import fold_events, session_output
from tests.engine.kit import Harness, session_log
from tests.service.conftest import as_json


class TopicSource:
    """Checkpoints as the topic holds them after the harness's commits."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.loads: list[str] = []

    def load(self, partition: int, session_id: str) -> tuple[Checkpoint | None, int]:
        self.loads.append(session_id)
        return self.harness.checkpoints().get(session_id), 1_000


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _harness() -> tuple[Harness, TopicSource, Clock]:
    h = Harness()
    source = TopicSource(h)
    h.engine.partitions[0] = PartitionState(0, source=source)
    clock = Clock()
    h.engine.held.clock = clock
    return h, source, clock


LOGS = {f"s{i}": session_log(30, seed=200 + i) for i in range(4)}


def test_an_evicted_session_reloads_and_folds_as_the_offline_fold() -> None:
    h, source, _ = _harness()
    for start in range(0, 30, 10):
        for sid, log in LOGS.items():
            h.fold_events(sid, log[start : start + 10])
        h.commit()
        assert h.engine.evict(budget_bytes=0, idle_s=0, now=0) == len(LOGS)
        assert h.engine.sessions_held() == 0 and h.engine.held.bytes == 0
    assert sorted(source.loads) == sorted(list(LOGS) * 3)  # first sight + two reloads each
    for sid, log in LOGS.items():
        expected = as_json(offline_equivalent(session_output(fold_events(log))))
        assert as_json(h.fold_equivalent(sid)) == expected, sid


def test_only_sessions_whose_state_is_committed_are_evicted() -> None:
    h, _, _ = _harness()
    h.fold_events("done", LOGS["s0"][:5])
    h.commit()
    h.fold_events("open", LOGS["s1"][:5])  # in the open batch: its checkpoint is not written
    h.redrive("eventless", 3)  # no event, no checkpoint: its pending redrive lives in memory
    assert h.engine.evict(budget_bytes=0, idle_s=0, now=0) == 1
    assert set(h.engine.partitions[0].sessions) == {"open", "eventless"}


def test_least_recently_used_go_first_and_idle_ones_go_anyway() -> None:
    h, _, clock = _harness()
    for i, sid in enumerate(LOGS):
        clock.now = float(i)
        h.fold_events(sid, LOGS[sid][:3])
    h.commit()
    held = h.engine.held
    per = held.bytes // len(LOGS)
    # over budget by about one session: only the least recently used goes
    assert h.engine.evict(budget_bytes=held.bytes - per // 2, idle_s=0, now=10) == 1
    assert "s0" not in h.engine.partitions[0].sessions
    # within budget, idle for more than 8 s at t=10: s1 (t=1) goes, s2 (t=2) stays
    assert h.engine.evict(budget_bytes=10**12, idle_s=8.5, now=10) == 1
    assert set(h.engine.partitions[0].sessions) == {"s2", "s3"}


def test_a_partition_whose_store_stopped_taking_writes_keeps_its_sessions() -> None:
    h, _, _ = _harness()
    h.fold_events("s", LOGS["s0"][:5])
    h.commit()
    h.engine.partitions[0].pinned = True
    assert h.engine.evict(budget_bytes=0, idle_s=0, now=0) == 0
