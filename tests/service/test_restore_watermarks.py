"""The restore's watermark query after a broker restart (reads.watermarks).

A chaos run saw a member's restore client answer ``_UNKNOWN_PARTITION`` for
~2.5 minutes after a broker restart, longer than the retry deadline, and the
member exited: the client's cached metadata lacked the partition and a retry
alone never refreshed it.  The model below keeps answering that error until
the client's metadata for the topic is asked for again.

Past the deadline the error names the call (``retry.GaveUp``); while a call
is retried, ``/readyz`` names it and every retry is counted (``RetryWatch``).
The retry deadline runs on the watch's clock: no wall time.
"""

from __future__ import annotations

from typing import Any, cast

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from processor.kafka.client_errors import one_line
from processor.kafka.reads import watermarks
from processor.kafka.retry import GaveUp, RetryWatch, is_transient, observing
from processor.kafka.transport import Reader
from processor.telemetry.health import Health
from processor.telemetry.metrics import Metrics


class StaleMetadata:
    """A reader whose partition is missing from its metadata until refreshed."""

    def __init__(self) -> None:
        self.refreshed: list[str | None] = []
        self.asked = 0

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        self.asked += 1
        if not self.refreshed:
            raise KafkaException(
                KafkaError(KafkaError._UNKNOWN_PARTITION, "Failed to get watermark offsets")
            )
        return 0, 42

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        self.refreshed.append(topic)
        return None


def test_unknown_partition_refreshes_the_metadata_and_then_succeeds() -> None:
    reader = StaleMetadata()
    # a short deadline: without the refresh the call raises once it is spent
    assert watermarks(cast(Reader, reader), "checkpoints", 3, timeout=2.0) == (0, 42)
    assert reader.refreshed == ["checkpoints"]
    assert reader.asked == 2


class Gone(StaleMetadata):
    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        self.asked += 1
        raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION, "still unknown"))


def test_a_partition_that_stays_unknown_fails_past_the_deadline() -> None:
    reader = Gone()
    with pytest.raises(KafkaException):
        watermarks(cast(Reader, reader), "checkpoints", 3, timeout=0.5)
    assert reader.asked >= 2  # retried, refreshing each time
    assert len(reader.refreshed) == reader.asked


class Clock:
    """A monotonic clock that moves ``step`` seconds each time it is read."""

    def __init__(self, step: float) -> None:
        self.now = 1000.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_past_the_deadline_the_error_names_the_call_and_how_long_it_failed() -> None:
    """The member's one line (and /readyz's reason) names topic[partition] and the
    broker's error, not a bare KafkaError repr."""
    watch = RetryWatch(clock=Clock(step=50.0))
    with observing(watch), pytest.raises(GaveUp) as caught:
        watermarks(cast(Reader, Gone()), "checkpoints", 3)  # the default 120 s deadline
    line = caught.value.line()
    assert line.startswith("watermarks of checkpoints[3]: _UNKNOWN_PARTITION: still unknown")
    assert is_transient(caught.value)  # callers still see a transient Kafka error
    assert one_line(caught.value) == f"broker did not answer: {line}"  # processor run's
    assert watch.oldest() is None  # nothing waits any more


class Watched(StaleMetadata):
    """Fails ``failures`` times; records what /readyz said during each failure."""

    def __init__(self, health: Health, clock: Clock, failures: int) -> None:
        super().__init__()
        self.health = health
        self.clock = clock
        self.failures = failures
        self.seen: list[tuple[int, bytes]] = []

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        self.seen.append(self.health.readiness())
        if len(self.seen) <= self.failures:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))
        return 0, 42


def test_readyz_names_a_retry_that_waits_longer_than_a_few_seconds() -> None:
    """A restore riding out a broker restart blocks the loop inside a rebalance
    callback: /readyz (another thread) names the call and the error meanwhile, and
    every retry is counted by call and error code."""
    metrics = Metrics()
    metrics.health.ready = True
    clock = Clock(step=2.0)  # each read of the clock: two seconds later
    metrics.retries.clock = clock
    reader = Watched(metrics.health, clock, failures=4)
    with observing(metrics.retries):
        assert watermarks(cast(Reader, reader), "checkpoints", 3) == (0, 42)
    first, *_, last = reader.seen
    assert first == (200, b"ready\n")  # not failing yet
    status, body = last  # the fourth retry: failing for longer than RETRY_REPORT_S
    assert status == 503, body
    assert b"for the broker: watermarks of checkpoints[3]: _TRANSPORT: broker down" in body
    assert metrics.health.readiness() == (200, b"ready\n")  # it succeeded: nothing waits
    counted = metrics.registry.get_sample_value(
        "processor_kafka_retries_total",
        {"call": "watermarks of checkpoints", "code": "_TRANSPORT"},
    )
    assert counted == 4
