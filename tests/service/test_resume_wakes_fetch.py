"""A takeover's reads start at once, not at one of librdkafka's timers (issue 37).

Two waits of a new owner, measured on a 3-node cluster (bench/lab history 11):

- librdkafka's ``resume`` does not wake the fetcher of the partition's
  leader: a broker from which the consumer fetches nothing else looks at the
  resumed partition only at its idle wake-up, up to 1 s later (every
  takeover's first records waited 0.3-0.8 s in the rolling restart); a seek
  of an active partition wakes it at once.
- A new consumer assigned at ``OFFSET_BEGINNING`` looks the offset up and,
  not knowing the leader yet, asks again 500 ms later: every fill from zero
  began 0.5 s late; at an offset it reads in a few ms.

The in-memory consumer reads at once either way, so these check the calls,
and that the views still equal the offline fold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

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


class _Assigns(MemoryConsumer):
    """A fill consumer, recording the offsets it is assigned at."""

    offsets: ClassVar[list[int]] = []

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        _Assigns.offsets += [tp.offset for tp in partitions]
        super().incremental_assign(partitions)


def test_a_fill_from_zero_is_assigned_at_the_log_start_not_the_beginning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new consumer assigned at OFFSET_BEGINNING asks the leader for the offset
    and, the leader not known yet, asks again 500 ms later: every fill from zero
    began 0.5 s late.  The fill starts at the log start it read instead."""
    broker, _, config = _fresh_host(tmp_path)  # an empty state directory: fills from zero
    real = MemoryTransport.plain_consumer

    def plain(self: MemoryTransport, purpose: str, problems: Any, group: str) -> MemoryConsumer:
        if purpose == "fill":
            return _Assigns(self.broker, group, eof=True)
        return real(self, purpose, problems, group)

    _Assigns.offsets = []
    monkeypatch.setattr(MemoryTransport, "plain_consumer", plain)
    loop = Loop(broker, config)
    _wait(lambda: _committed(broker, config), loop, "all committed")
    loop.stop()
    assert not loop.errors, loop.errors
    assert _Assigns.offsets and all(o == 0 for o in _Assigns.offsets), _Assigns.offsets
    _assert_folded(broker, config, 12)
