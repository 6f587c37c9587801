"""A restored partition is sought after its resume, to wake its fetcher (issue 37).

librdkafka's ``resume`` does not wake the fetcher of the partition's leader:
a broker from which the consumer fetches nothing else looks at the resumed
partition only at its idle wake-up, up to 1 s later.  In the rolling restart
every takeover's first records waited 0.3-0.8 s for it (bench/lab history
11); a seek of an active partition wakes the fetcher at once (a few ms).  The
in-memory consumer fetches at once either way, so this checks the calls:
every restored partition is resumed, then sought to the committed offset its
restore resumes at, and the views still equal the offline fold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from processor.testing.memory import MemoryConsumer, MemoryTransport
from tests.service.test_background_fill import _fresh_host, _group_offset
from tests.service.test_memory_transport import Loop, _committed, _wait
from tests.service.test_state_store import _assert_folded


class Recording(MemoryConsumer):
    """The group consumer, recording its resumes and seeks of the events topic."""

    calls: list[tuple[str, int, int | None]]

    def __init__(self, *args: Any, events: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.events = events
        self.calls = []

    def resume(self, partitions: list[TopicPartition]) -> None:
        mine = [tp.partition for tp in partitions if tp.topic == self.events]
        self.calls += [("resume", p, None) for p in mine]
        super().resume(partitions)

    def seek(self, partition: TopicPartition) -> None:
        if partition.topic == self.events:
            self.calls.append(("seek", partition.partition, partition.offset))
        super().seek(partition)


def test_a_restored_partition_is_resumed_then_sought_to_its_committed_offset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker, _, config = _fresh_host(tmp_path)
    made: list[Recording] = []

    def group(self: MemoryTransport, instance_id: str, problems: Any) -> MemoryConsumer:
        made.append(Recording(self.broker, self.config.group_id, eof=False, events=events))
        return made[-1]

    events = config.topics.events
    monkeypatch.setattr(MemoryTransport, "group_consumer", group)
    held = {p: _group_offset(broker, config, p) for p in range(config.partitions)}
    assert all(held.values())  # the first member committed on every partition
    loop = Loop(broker, config)
    _wait(lambda: _committed(broker, config), loop, "all committed")
    loop.stop()
    assert not loop.errors, loop.errors
    calls = made[0].calls
    for p, offset in held.items():
        mine = [c for c in calls if c[1] == p]
        assert mine[:2] == [("resume", p, None), ("seek", p, offset)], calls
    _assert_folded(broker, config, 12)
