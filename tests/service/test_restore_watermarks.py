"""The restore's watermark query after a broker restart (restore.watermarks).

A chaos run saw a member's restore client answer ``_UNKNOWN_PARTITION`` for
~2.5 minutes after a broker restart, longer than the retry deadline, and the
member exited: the client's cached metadata lacked the partition and a retry
alone never refreshed it.  The model below keeps answering that error until
the client's metadata for the topic is asked for again.
"""

from __future__ import annotations

from typing import Any, cast

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from processor.service.restore import watermarks
from processor.service.transport import Reader


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
