"""A background fill that stalls is put off like a restore, never the end of the run.

A fill without progress for ``STALL_S`` (the broker stopped serving the
checkpoints partition: a broker outage of minutes) used to be retried twice
and then end the member; its successor filled into the same outage.  Now the
partition stays assigned and paused, ``/readyz`` names it and why, the put-off
is counted in ``processor_restore_waits_total`` (the alert's counter) and,
after the back-off, the restore runs again with a new fill consumer, as often
as it takes.  Broker-less (the in-memory cluster); the fill's clock is
injected (it moves 30 s per read, or only when the test moves it): no wall
time is asserted.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest
from confluent_kafka import KafkaError, KafkaException

from processor.config import ServiceConfig
from processor.service.loop.runner import Processor
from processor.service.partitions.background_fill import STALL_S, BackgroundFill, FillJob
from processor.service.store import mirror_fill
from processor.telemetry.metrics import Metrics
from processor.testing.memory import MemoryBroker, MemoryConsumer, MemoryTransport
from tests.service.running import RunningProcessor
from tests.service.test_background_fill import (
    BIG,
    _fresh_host,
    _group_offset,
    _high,
    _one_partition,
)
from tests.service.test_memory_transport import _committed, _wait
from tests.service.test_restore_put_off import Run
from tests.service.test_state_store import _assert_folded


class Stalling(MemoryConsumer):
    """The fill's consumer: while ``on``, the broker answers but no record comes;
    ``errors`` reads fail with ``error`` first (a broker restarting)."""

    on = False
    errors = 0
    error = KafkaError(KafkaError._TRANSPORT, "broker restarting")
    made: ClassVar[list[Stalling]] = []

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        if Stalling.errors > 0:
            Stalling.errors -= 1
            raise KafkaException(Stalling.error)
        if Stalling.on:
            return []
        return super().consume(num_messages, timeout)


@pytest.fixture
def stalling(monkeypatch: pytest.MonkeyPatch) -> type[Stalling]:
    real = MemoryTransport.plain_consumer

    def plain(self: MemoryTransport, purpose: str, problems: Any, group: str) -> MemoryConsumer:
        if purpose == "fill":
            made = Stalling(self.broker, group, eof=True)
            Stalling.made.append(made)
            return made
        return real(self, purpose, problems, group)

    Stalling.on, Stalling.errors, Stalling.made = False, 0, []
    monkeypatch.setattr(MemoryTransport, "plain_consumer", plain)
    monkeypatch.setattr(mirror_fill, "FILL_SLICE", 200)  # many slices
    return Stalling


def _closed(consumer: MemoryConsumer) -> bool:
    return bool(consumer._closed)


def test_a_fill_stalled_past_the_old_bound_is_put_off_and_completes_once_the_broker_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stalling: type[Stalling]
) -> None:
    """The fill stalls after its first slice and stays stalled for more put-offs
    than the three attempts that used to end the run: the member keeps running,
    the partitions stay paused with nothing folded, /readyz names the stall, a
    new fill consumer per try (the old one closed).  The broker serving again,
    the fill goes on from the verified store position (each record read once)
    and the views equal the offline fold."""
    broker, _, config = _fresh_host(tmp_path)
    before = len(broker.committed_records(config.topics.checkpoints))
    real_init = BackgroundFill.__init__
    armed = [True]

    def init(self: BackgroundFill, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)

        def first_slice(read: dict[int, int]) -> None:
            # the broker stops serving after the first slice (once: the test
            # turns it off to serve again)
            if armed:
                armed.clear()
                Stalling.on = True

        self.on_slice = first_slice

    monkeypatch.setattr(BackgroundFill, "__init__", init)
    run = Run(broker, config)
    put_offs = 2 * (mirror_fill.MAX_ATTEMPTS + 1)
    _wait(
        lambda: run.sample("processor_restore_waits_total") >= put_offs,
        run,
        "the stalled fill put off past the old bound",
    )
    assert run.thread.is_alive() and not run.errors, run.errors
    status, body = run.metrics.health.readiness()
    assert status == 503, body
    pattern = (
        rf"fill of {config.topics.checkpoints}\[\d\] stalled: no progress for "
        rf"{STALL_S:.0f} s; (retrying in \d+ s|trying again) \(put off \d+ times\)"
    )
    assert re.search(pattern, body.decode()), body
    assert run.sample("processor_fill_failures_total") == 0  # not a failure: a wait
    assert _group_offset(broker, config, BIG) < _high(broker, config, BIG)
    # a new fill consumer for each try, every one before it closed
    made = list(stalling.made)
    assert len(made) >= mirror_fill.MAX_ATTEMPTS + 1
    assert all(_closed(c) for c in made[:-1])
    stalling.on = False
    _wait(lambda: _committed(broker, config), run, "all committed")
    assert run.metrics.health.readiness() == (200, b"ready\n")
    assert all(_closed(c) for c in stalling.made)  # filled: no idle fill consumer left
    run.stop()
    assert not run.errors, run.errors
    assert run.sample("processor_store_records_read_total") == before
    _assert_folded(broker, config, 12)


def test_a_fill_read_failing_with_a_transient_error_is_put_off_not_the_end_of_the_run(
    tmp_path: Path, stalling: type[Stalling], caplog: pytest.LogCaptureFixture
) -> None:
    """More transient read errors (a broker restarting) than the attempts a
    permanent one gets: put off each time, then filled and folded."""
    broker, _, config = _fresh_host(tmp_path)
    stalling.errors = 2 * mirror_fill.MAX_ATTEMPTS
    run = Run(broker, config)
    _wait(lambda: _committed(broker, config), run, "all committed")
    run.stop()
    assert not run.errors, run.errors
    assert run.sample("processor_restore_waits_total") >= 2 * mirror_fill.MAX_ATTEMPTS
    assert run.sample("processor_fill_failures_total") == 0
    line = (
        f"fill of {config.topics.checkpoints}[{BIG}] put off: read failed: "
        "_TRANSPORT: broker restarting; retrying in 5 s (put off 1 times)"
    )
    assert line in caplog.messages, caplog.messages
    _assert_folded(broker, config, 12)


def test_a_fill_revoked_or_lost_while_put_off_leaves_no_job_and_no_consumer(
    tmp_path: Path, stalling: type[Stalling]
) -> None:
    """cancel (on_revoke and on_lost both call it) of a put-off fill: no job left to
    come due, no fill consumer left open, nothing reported; assigned again, the
    fill reads the partition to its end."""
    broker, store = _one_partition(tmp_path)
    metrics = Metrics()
    now = [0.0]
    fill = BackgroundFill(store, metrics, lambda: Stalling(broker, "g", eof=True), lambda: now[0])
    verify = MemoryConsumer(broker, "g", eof=True)
    stalling.on = True
    fill.start(verify, [0])
    reader = fill._reader
    assert isinstance(reader, Stalling)
    assert fill.step() == {}
    now[0] += STALL_S + 1
    assert fill.step() == {}
    job = fill.jobs[0]
    assert job.retry_at is not None and job.waits == 1  # put off, not failed
    assert fill.due() == [] and fill._reader is None and _closed(reader)
    problem = metrics.health.fill_problem  # what /readyz says
    assert problem is not None
    assert problem.endswith("stalled: no progress for 120 s; retrying in 5 s (put off 1 times)")
    fill.cancel([0])  # revoked (or lost) while put off
    assert fill.jobs == {} and fill._reader is None
    now[0] += 3600
    assert fill.due() == []  # nothing comes due for a partition no longer owned
    assert metrics.health.fill_problem is None
    assert metrics.registry.get_sample_value("processor_partitions_filling") == 0
    stalling.on = False
    fill.start(verify, [0])  # assigned again
    done = {}
    for _ in range(100):
        done = fill.step()
        if done:
            break
    assert set(done) == {0} and done[0].records_read == 500
    assert fill._reader is None  # filled: its consumer closed
    fill.close()
    store.close()


class IdleRun(RunningProcessor):
    """``processor run --max-idle-s 0``: ends as soon as the run is idle."""

    def __init__(self, broker: MemoryBroker, config: ServiceConfig, clock: Any) -> None:
        self.metrics = Metrics()
        proc = Processor(config, metrics=self.metrics, transport=MemoryTransport(broker, config))
        proc.rebalance.fill.clock = clock
        super().__init__(proc)

    def _run(self) -> None:
        try:
            self.proc.run(max_idle_s=0.0)
        except BaseException as exc:  # the test's assertion names it
            self.errors.append(exc)

    def sample(self, name: str) -> float:
        return self.metrics.registry.get_sample_value(name) or 0.0


class Manual:
    """A clock that moves only when the test moves it; counts its reads (loop turns)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.reads = 0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            self.reads += 1
            return self.now


def test_a_max_idle_run_never_ends_while_a_fill_is_put_off(tmp_path: Path) -> None:
    """The neighbour folded and committed, BIG's fill put off (its back-off not
    over: the clock stands still): hundreds of loop turns with nothing else to
    do, and the --max-idle-s 0 run goes on.  The broker serving and the back-off
    over, BIG fills, folds, and the run ends by itself."""
    broker, _, config = _fresh_host(tmp_path)
    small = 1 - BIG
    broker.stall(config.topics.checkpoints, BIG, readers=True)  # the fill reads nothing
    clock = Manual()
    run = IdleRun(broker, config, clock)
    _wait(
        lambda: _group_offset(broker, config, small) >= _high(broker, config, small),
        run,
        "the neighbour committed",
    )
    with clock.lock:
        clock.now += STALL_S + 1
    _wait(lambda: run.sample("processor_restore_waits_total") == 1, run, "BIG put off")
    turns = clock.reads + 500
    _wait(lambda: clock.reads >= turns or not run.thread.is_alive(), run, "loop turns")
    assert run.thread.is_alive() and not run.errors, run.errors
    assert _group_offset(broker, config, BIG) < _high(broker, config, BIG)
    broker.unstall(config.topics.checkpoints, BIG)
    with clock.lock:
        clock.now += mirror_fill.WAIT_FIRST_S
    run.thread.join(60)
    assert not run.thread.is_alive()
    assert not run.errors, run.errors
    assert _committed(broker, config)
    _assert_folded(broker, config, 12)


def test_a_fill_that_progressed_since_its_last_put_off_backs_off_from_the_first_pause(
    tmp_path: Path, stalling: type[Stalling]
) -> None:
    """A long fill with scattered hiccups: each put-off after progress waits the
    first back-off again (it used to keep doubling to the longest one), a put-off
    without progress in between still doubles, and each one is counted."""
    broker, store = _one_partition(tmp_path)  # 500 records, slices of 200
    metrics = Metrics()
    now = [0.0]
    fill = BackgroundFill(store, metrics, lambda: Stalling(broker, "g", eof=True), lambda: now[0])
    verify = MemoryConsumer(broker, "g", eof=True)

    def progress_then_stall() -> FillJob:
        read = fill.jobs[0].read
        stalling.on = False
        assert fill.step() == {}  # one slice applied, the partition not at its end
        assert fill.jobs[0].read > read
        stalling.on = True
        now[0] += STALL_S + 1
        assert fill.step() == {}
        return fill.jobs[0]

    def again() -> None:
        now[0] += mirror_fill.WAIT_MAX_S
        assert fill.due() == [0]
        fill.start(verify, [0])  # the restore run again (rebalance.fill_step)

    fill.start(verify, [0])
    job = progress_then_stall()
    assert (job.waits, job.retry_at) == (1, now[0] + mirror_fill.WAIT_FIRST_S)
    again()
    job = progress_then_stall()  # progress in between: the first pause again
    assert (job.waits, job.retry_at) == (1, now[0] + mirror_fill.WAIT_FIRST_S)
    assert metrics.health.fill_problem is not None
    assert metrics.health.fill_problem.endswith("retrying in 5 s (put off 1 times)")
    again()
    now[0] += STALL_S + 1  # no progress this time: the back-off doubles
    assert fill.step() == {}
    job = fill.jobs[0]
    assert (job.waits, job.retry_at) == (2, now[0] + 2 * mirror_fill.WAIT_FIRST_S)
    assert metrics.registry.get_sample_value("processor_restore_waits_total") == 3
    fill.close()
