"""A fill never ends at an end-of-partition below the end it verified.

After a leader moves (a broker restart), the new leader's high watermark can
lag the one the fill read at assignment; librdkafka reports the partition's
end when its position reaches the end a fetch names.  Taken as the end, the
fill moved the store's position to the verified end over records it never
applied: sessions would load stale checkpoints.  Broker-less: the in-memory
cluster's consumer answers one such end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError

from processor.service.partitions.background_fill import BackgroundFill
from processor.service.store import mirror_fill
from processor.service.store.checkpoint_store import Filled
from processor.telemetry.metrics import Metrics
from processor.testing.memory import MemoryConsumer, MemoryMessage
from tests.service.test_background_fill import _one_partition


class StaleEnd(MemoryConsumer):
    """Its second read answers the partition's end at its position (a lagging leader)."""

    reads = 0

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        self.reads += 1
        if self.reads == 2:
            (topic, partition), pos = next(iter(self.positions.items()))
            eof = KafkaError(KafkaError._PARTITION_EOF)
            return [MemoryMessage(topic, partition, pos, error=eof)]
        return super().consume(num_messages, timeout)


def test_a_fill_reads_past_an_end_below_the_verified_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mirror_fill, "FILL_SLICE", 50)
    broker, store = _one_partition(tmp_path)
    fill = BackgroundFill(store, Metrics(), lambda: StaleEnd(broker, "g", eof=True))
    fill.start(MemoryConsumer(broker, "g", eof=True), [0])
    done: dict[int, Filled] = {}
    for _ in range(100):
        done = fill.step()
        if done:
            break
    assert set(done) == {0} and done[0].records_read == 500
    db = store.store
    assert db is not None
    for k in range(20):  # every key's last value: nothing skipped
        last = max(i for i in range(500) if i % 20 == k)
        assert db.session_records(store.topic, 0, f"k{k}") == [
            (f"k{k}".encode(), f"v{last}".encode())
        ]
    fill.close()
    store.close()
