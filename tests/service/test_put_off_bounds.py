"""The put-off bounds are settings: ``restore_deadline_s`` and ``fill_stall_s``.

A platform proving its members ride out a broker outage (and the real-broker
outage test, ``test_outage_put_off.py``) needs the 120 s bounds shorter; the
defaults stay the module constants.  Broker-less: a fake clock for the
retries, the in-memory cluster for the fill.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from processor.config import ServiceConfig, load_config
from processor.kafka import retry as retry_mod
from processor.kafka.retry import GaveUp, RetryWatch, is_transient, observing, retry
from processor.service.partitions.background_fill import STALL_S, BackgroundFill
from processor.service.partitions.restore import wait_stable
from processor.telemetry.metrics import Metrics
from processor.testing.memory import MemoryConsumer
from tests.service.test_background_fill import _one_partition
from tests.service.test_fill_put_off import Stalling, stalling

__all__ = ["stalling"]  # the fixture, used by name


def test_the_defaults_are_the_module_constants_and_the_environment_sets_them() -> None:
    config = ServiceConfig()
    assert config.restore_deadline_s == retry_mod.DEFAULT_DEADLINE_S
    assert config.fill_stall_s == STALL_S
    env = {"PROCESSOR_RESTORE_DEADLINE_S": "4", "PROCESSOR_FILL_STALL_S": "3"}
    config = load_config(env=env)
    assert (config.restore_deadline_s, config.fill_stall_s) == (4, 3)


def test_a_bound_under_one_second_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="fill_stall_s must be at least 1 s, got 0"):
        ServiceConfig(fill_stall_s=0)
    with pytest.raises(ValueError, match="restore_deadline_s must be at least 1 s"):
        load_config(env={"PROCESSOR_RESTORE_DEADLINE_S": "-1"})


class _Clock:
    """Moves only when the retry sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _gave_up_after(monkeypatch: pytest.MonkeyPatch, deadline_s: float | None) -> float:
    clock = _Clock()
    monkeypatch.setattr("processor.kafka.retry.time.sleep", clock.sleep)
    watch = RetryWatch(clock=clock)

    def down() -> None:
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))

    with observing(watch, deadline_s), pytest.raises(GaveUp) as gave_up:
        retry(down, "watermarks of t[0]")
    assert watch.oldest() is None  # given up: /readyz no longer names the call
    return gave_up.value.waited_s


def test_the_restore_deadline_bounds_every_retry_of_the_observed_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``observing(watch, deadline_s)`` (what the rebalance callbacks run in)
    bounds the retries that name no deadline, however deep the restore calls them."""
    short = _gave_up_after(monkeypatch, 3.0)
    assert 1.0 <= short <= 3.0  # within the longest pause (2 s) of it
    default = _gave_up_after(monkeypatch, None)
    assert retry_mod.DEFAULT_DEADLINE_S - 2.0 <= default <= retry_mod.DEFAULT_DEADLINE_S
    # an explicit deadline still wins over the block's
    clock = _Clock()
    monkeypatch.setattr("processor.kafka.retry.time.sleep", clock.sleep)

    def down() -> None:
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))

    with observing(RetryWatch(clock=clock), 3.0), pytest.raises(GaveUp) as gave_up:
        retry(down, "permission check", deadline_s=10.0)
    assert gave_up.value.waited_s > 3.0


def test_a_fill_stalled_past_the_configured_bound_is_put_off(
    tmp_path: Path, stalling: type[Stalling]
) -> None:
    broker, store = _one_partition(tmp_path)
    metrics = Metrics()
    now = [0.0]
    fill = BackgroundFill(
        store, metrics, lambda: Stalling(broker, "g", eof=True), lambda: now[0], stall_s=4.0
    )
    stalling.on = True
    fill.start(MemoryConsumer(broker, "g", eof=True), [0])
    assert fill.step() == {}
    now[0] += 3.0
    fill.step()
    assert fill.jobs[0].retry_at is None  # within the bound: still reading
    now[0] += 2.0
    fill.step()
    assert fill.jobs[0].retry_at is not None  # past it: put off
    problem = metrics.health.fill_problem
    assert problem is not None and "stalled: no progress for 4 s" in problem, problem
    fill.close()


class _Admin:
    """What an admin client answers besides ListOffsets: metadata, no log lines."""

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        return None

    def poll(self, timeout: float) -> int:
        return 0


class _SilentAdmin(_Admin):
    """An admin whose ListOffsets never answers: every request times out."""

    def __init__(self, asked: list[float]) -> None:
        self.asked = asked

    def list_offsets(
        self, topic_partition_offsets: dict[TopicPartition, Any], **kwargs: Any
    ) -> dict[TopicPartition, Any]:
        self.asked.append(float(kwargs["request_timeout"]))
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed to query partition leaders"))


def test_a_restore_waiting_for_stable_offsets_gives_up_within_the_restore_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stable-offset wait (bounded by the transaction timeout, ~50 s) neither
    retries past the restore's deadline nor sends one request longer than it:
    a request of 10 s made a 3 s deadline a 10 s one (seen on a real broker)."""
    clock = _Clock()
    monkeypatch.setattr("processor.kafka.retry.time.sleep", clock.sleep)
    asked: list[float] = []
    with observing(RetryWatch(clock=clock), 3.0), pytest.raises(GaveUp) as gave_up:
        wait_stable(lambda: _SilentAdmin(asked), "t.checkpoints", [0], bound_s=50.0)
    assert asked and max(asked) <= 3.0, asked
    assert gave_up.value.waited_s <= 3.0
    assert "stable offsets of t.checkpoints" in gave_up.value.line()


class _Done:
    def __init__(self, offset: int) -> None:
        self.offset = offset

    def result(self) -> _Done:
        return self


class _LeaderlessAdmin(_Admin):
    """No leader known for the first ``misses`` requests (every broker down), then
    one at offset 7 (transaction-free: the stable offset is the end)."""

    def __init__(self, misses: list[int]) -> None:
        self.misses = misses

    def list_offsets(
        self, topic_partition_offsets: dict[TopicPartition, Any], **kwargs: Any
    ) -> dict[TopicPartition, Any]:
        if self.misses[0] > 0:
            self.misses[0] -= 1
            err = KafkaError(
                KafkaError._NOENT, "Failed to query partition leaders: No leaders found"
            )
            raise KafkaException(err)
        return {tp: _Done(7) for tp in topic_partition_offsets}


def test_no_leader_found_by_the_stable_offset_query_is_waited_out_not_the_end_of_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """librdkafka answers a ListOffsets with ``_NOENT`` while no broker leads the
    partition (a whole-cluster outage, or just after it); classified permanent, it
    ended a restoring member in a chaos run.  Now it is retried like a leader
    election and, past the deadline, puts the restore off (a transient GaveUp)."""
    clock = _Clock()
    monkeypatch.setattr("processor.kafka.retry.time.sleep", clock.sleep)
    misses = [3]
    with observing(RetryWatch(clock=clock), 30.0):
        assert wait_stable(lambda: _LeaderlessAdmin(misses), "t.checkpoints", [0], 50.0) == []
    assert misses == [0]
    misses[0] = 1000
    with observing(RetryWatch(clock=clock), 3.0), pytest.raises(GaveUp) as gave_up:
        wait_stable(lambda: _LeaderlessAdmin(misses), "t.checkpoints", [0], 50.0)
    assert is_transient(gave_up.value)  # rebalance.py puts the restore off
    assert "No leaders found" in gave_up.value.line()


def test_a_bad_bound_in_the_environment_is_one_line_naming_where_it_came_from(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CLI names the configuration's sources (the value came from the
    environment), not the --config option alone, and prints no traceback."""
    from click.testing import CliRunner

    from processor.cli.main import cli

    monkeypatch.setenv("PROCESSOR_FILL_STALL_S", "0")
    result = CliRunner().invoke(cli, ["run", "-b", "127.0.0.1:1", "--topic-prefix", "x"])
    assert result.exit_code == 2
    assert "fill_stall_s must be at least 1 s, got 0" in result.output
    assert "PROCESSOR_* environment" in result.output
    assert "Traceback" not in result.output
