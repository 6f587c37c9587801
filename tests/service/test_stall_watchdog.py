"""The progress watchdog (progress.py): a partition with lag that stops moving is
sought again, then named on ``/readyz``; nothing else is (in memory).

The fault suite once saw a member's partition sit at its committed offset with
lag for 300 s after a rewind while ``/readyz`` stayed 200.  Here a partition's
fetches are stalled in the in-memory broker (``MemoryBroker.stall``: group
fetches deliver nothing until a seek).  No wall clock is asserted: the watch
reads a fake clock the test advances, and the loop ticks every iteration.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from processor.codec import default_codec
from processor.config import ServiceConfig
from processor.engine.commands import partition_of
from processor.service.loop import runner as runner_mod
from processor.service.loop.runner import Processor
from processor.service.ops import stall_watch as progress_mod
from processor.service.ops.stall_watch import ProgressWatch
from processor.telemetry.metrics import Metrics
from processor.testing.memory import MemoryBroker, MemoryConsumer, MemoryTransport
from tests.engine.kit import session_log
from tests.service.running import RunningProcessor
from tests.service.test_loop_steps import _Clock  # a fake clock the test advances

CODEC = default_codec()
STALL_S = 60
CONFIG = ServiceConfig(
    partitions=2,
    topic_prefix="stall",
    commit_interval_ms=20,
    stall_s=STALL_S,
    stall_reseeks=2,
)
EVENTS = CONFIG.topics.events
LOG = session_log(40, seed=11)


def _sid(partition: int) -> str:
    """A session id whose events land in ``partition``."""
    sids = (f"s{i}" for i in range(1000))
    return next(s for s in sids if partition_of(s.encode(), CONFIG.partitions) == partition)


SIDS = {0: _sid(0), 1: _sid(1)}


@dataclass
class Loop:
    broker: MemoryBroker
    proc: Processor
    clock: _Clock
    errors: list[BaseException]
    sent: dict[int, int]

    def produce(self, partition: int, n: int) -> None:
        sid, start = SIDS[partition], self.sent[partition]
        for event in LOG[start : start + n]:
            self.broker.produce(EVENTS, sid.encode(), CODEC.encode_parsed_event(sid, event))
        self.sent[partition] = start + n

    def wait(self, done: Callable[[], bool], what: str, *, step_s: float = 0.0) -> None:
        """Until ``done``, advancing the watch's clock by ``step_s`` per try."""
        deadline = time.monotonic() + 60
        while not done():
            assert not self.errors, self.errors
            assert time.monotonic() < deadline, what
            self.clock.advance(step_s)
            time.sleep(0.02)

    def value(self, name: str, **labels: str) -> float:
        return self.proc.metrics.registry.get_sample_value(name, labels) or 0.0

    def consumed(self) -> float:
        return self.value("processor_records_consumed_total")

    def reseeks(self) -> float:
        return self.value("processor_partition_stall_reseeks_total")

    def stalls(self, partition: int) -> float:
        return self.value("processor_partition_stalls_total", partition=str(partition))


def _memory(broker: MemoryBroker) -> MemoryTransport:
    return MemoryTransport(broker, CONFIG)


@contextlib.contextmanager
def _running(
    monkeypatch: pytest.MonkeyPatch,
    transport: Callable[[MemoryBroker], MemoryTransport] = _memory,
) -> Iterator[Loop]:
    clock = _Clock()
    monkeypatch.setattr(progress_mod, "time", SimpleNamespace(monotonic=clock.monotonic))
    monkeypatch.setattr(runner_mod, "GAUGE_EVERY_S", 0.0)  # the watch looks every iteration
    broker = MemoryBroker()
    broker.create_topics(CONFIG)
    running = RunningProcessor(Processor(CONFIG, metrics=Metrics(), transport=transport(broker)))
    try:
        yield Loop(broker, running.proc, clock, running.errors, {0: 0, 1: 0})
    finally:
        running.stop()
    assert not running.thread.is_alive() and not running.errors, running.errors


@pytest.fixture
def loop(monkeypatch: pytest.MonkeyPatch) -> Iterator[Loop]:
    with _running(monkeypatch) as running:
        yield running


def _caught_up(loop: Loop) -> None:
    loop.wait(lambda: loop.consumed() >= sum(loop.sent.values()), "every event consumed")


def test_a_stalled_partition_is_sought_again_and_moves(loop: Loop) -> None:
    loop.produce(0, 5)
    loop.produce(1, 5)
    _caught_up(loop)
    loop.broker.stall(EVENTS, 0, seeks=1)  # the next seek restarts its fetch
    loop.produce(0, 5)
    loop.produce(1, 5)
    loop.wait(lambda: loop.consumed() >= 15, "partition 1 moves")
    assert loop.consumed() == 15  # partition 0's five wait
    loop.wait(lambda: loop.reseeks() >= 1, "the watch seeks partition 0", step_s=10)
    _caught_up(loop)
    loop.wait(lambda: loop.value("processor_partitions_stalled") == 0, "the gauge clears", step_s=1)
    assert loop.reseeks() == 1
    assert loop.stalls(0) == 1 and loop.stalls(1) == 0
    assert loop.proc.health.readiness()[0] == 200


def test_a_partition_that_stays_stalled_is_named_on_readyz_until_it_moves(loop: Loop) -> None:
    loop.produce(0, 3)
    _caught_up(loop)
    loop.broker.stall(EVENTS, 0)  # no seek helps
    loop.produce(0, 4)
    loop.wait(lambda: loop.proc.health.stalled is not None, "reported", step_s=10)
    status, body = loop.proc.health.readiness()
    assert status == 503
    assert body.startswith(b"not ready: partition 0 stalled at offset 3 for ")
    assert loop.reseeks() == CONFIG.stall_reseeks  # the bounded seeks came first
    assert loop.stalls(0) == 1  # one episode, counted once
    assert loop.value("processor_partitions_stalled") == 1
    # partition 1 never had lag: never counted
    assert loop.stalls(1) == 0
    for _ in range(30):
        loop.clock.advance(10)
        time.sleep(0.02)
    assert loop.reseeks() == CONFIG.stall_reseeks  # no seek past the bound
    loop.broker.unstall(EVENTS, 0)
    _caught_up(loop)
    loop.wait(lambda: loop.proc.health.stalled is None, "the report clears", step_s=1)
    assert loop.proc.health.readiness() == (200, b"ready\n")
    assert loop.value("processor_partitions_stalled") == 0


def test_a_moving_partition_and_an_idle_one_are_never_reported(loop: Loop) -> None:
    """Partition 1 gets events between looks and moves; partition 0 is idle
    (lag 0) the whole time, over many times ``stall_s``."""
    loop.produce(0, 2)
    for _ in range(15):
        loop.produce(1, 2)
        _caught_up(loop)
        loop.clock.advance(10)
    for _ in range(30):
        loop.clock.advance(10)
        time.sleep(0.02)
    _caught_up(loop)
    assert loop.reseeks() == 0
    assert loop.stalls(0) == loop.stalls(1) == 0
    assert loop.proc.health.stalled is None


class _Silent(MemoryConsumer):
    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        return []


class _NoFill(MemoryTransport):
    """Every store fill waits for ever: the partitions stay assigned paused."""

    def plain_consumer(self, purpose: str, problems: Any, group: str) -> MemoryConsumer:
        if purpose == "fill":
            return _Silent(self.broker, group, eof=True)
        return super().plain_consumer(purpose, problems, group)


def _no_fill(broker: MemoryBroker) -> MemoryTransport:
    for partition in (0, 1):  # something to fill, which never arrives
        broker.append(CONFIG.topics.checkpoints, partition, b"k", b"v", "committed")
    return _NoFill(broker, CONFIG)


def test_a_filling_partition_is_never_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    with _running(monkeypatch, _no_fill) as loop:
        loop.produce(0, 5)  # lag behind a paused partition
        loop.wait(lambda: loop.proc.health.filling == 2, "both partitions filling")
        for _ in range(40):  # 400 s, in looks 10 s apart
            loop.clock.advance(10)
            time.sleep(0.02)
        assert loop.reseeks() == 0 and loop.stalls(0) == 0
        assert loop.proc.health.readiness() == (200, b"ready; filling 2 partitions\n")


# ------------------------------------------------------------------ the watch alone


def test_the_watch_counts_only_looks_with_lag_at_one_position(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A partition left out of a look (revoked, filling) starts afresh, and a long
    gap between two looks (the loop blocked elsewhere) counts at most a quarter
    of ``stall_s``: time the loop could not have moved it is not a stall."""
    clock = _Clock()
    monkeypatch.setattr(progress_mod, "time", SimpleNamespace(monotonic=clock.monotonic))
    sought: list[tuple[int, int]] = []
    watch = ProgressWatch(Metrics(), lambda n, o: sought.append((n, o)), stall_s=STALL_S, reseeks=1)

    def looks(n: int, seen: dict[int, tuple[int, int]]) -> None:
        for _ in range(n):
            clock.advance(10)
            watch.check(seen)

    watch.check({0: (7, 10)})
    looks(5, {0: (7, 10)})  # 50 s
    watch.check({})  # paused: left out
    looks(1, {0: (7, 10)})  # back: its clock starts again
    looks(5, {0: (7, 10)})
    assert sought == []
    looks(1, {0: (7, 10)})  # 60 s at offset 7
    assert sought == [(0, 7)]  # sought at its own position, never behind it
    clock.advance(100)  # one look after a long gap: 15 s of it count
    watch.check({0: (7, 10)})
    assert watch.health.stalled is None
    looks(4, {0: (7, 10)})  # 115 s
    assert watch.health.stalled is None
    looks(1, {0: (7, 10)})  # 125 s: past the second stall_s, no seek left
    assert watch.health.stalled == "partition 0 stalled at offset 7 for 125s"
    assert sought == [(0, 7)]
    watch.check({0: (8, 10)})  # moved
    assert watch.health.stalled is None
    looks(20, {0: (8, 8)})  # idle, lag 0
    assert watch.health.stalled is None and sought == [(0, 7)]


def test_a_loop_that_stops_ticking_is_not_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loop blocked in a call moves nothing either: /readyz says so once it has
    not ticked for ``liveness_s`` (the watch runs in the loop and cannot)."""
    from processor.telemetry import health as health_mod
    from processor.telemetry.health import Health

    clock = _Clock()
    monkeypatch.setattr(health_mod, "time", SimpleNamespace(monotonic=clock.monotonic))
    health = Health()
    health.ready = True
    health.tick()
    clock.advance(59)
    assert health.readiness(60) == (200, b"ready\n")
    clock.advance(2)
    assert health.readiness(60) == (503, b"not ready: the loop has not ticked for 61s\n")
    assert health.liveness(60)[0] == 503
    health.tick()
    assert health.readiness(60) == (200, b"ready\n")
