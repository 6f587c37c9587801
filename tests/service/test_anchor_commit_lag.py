"""Checkpoints that read committed before their offsets do are waited for, not fatal.

A transaction's checkpoints and offsets commit together, but the commit
markers reach the checkpoints partition and ``__consumer_offsets`` one by
one: in a chaos run (seed 3, long form) the group coordinator's broker
restarted between them, the committed offset answered the older value for
16 s and more, and every member restoring then failed the anchor check
("checkpoints reach offset 14445 ... committed offset is 14440") and exited.
Here the group's offsets lag one record behind the checkpoints until the
restore has read them once; the member waits, reads them again and folds.
Broker-less (the in-memory cluster).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
from confluent_kafka import TopicPartition

from processor.service.memory import MemoryBroker, MemoryConsumer, MemoryTransport
from tests.service.test_memory_transport import Loop, _committed, _wait
from tests.service.test_state_store import _assert_folded, _config, _produce, _run


class Lagging(MemoryConsumer):
    """A group consumer whose first ``committed()`` answers the offsets before the
    last commit (its marker not written yet); the marker lands after it."""

    real: ClassVar[dict[tuple[str, str, int], int]] = {}
    asked = 0

    def committed(
        self, partitions: list[TopicPartition], timeout: float = -1
    ) -> list[TopicPartition]:
        Lagging.asked += 1
        if Lagging.asked == 2:
            with self.broker.cond:
                self.broker.group_offsets.update(Lagging.real)
        return super().committed(partitions, timeout)


@pytest.fixture
def lagging(monkeypatch: pytest.MonkeyPatch) -> type[Lagging]:
    def group(self: MemoryTransport, instance_id: str, problems: Any) -> MemoryConsumer:
        return Lagging(self.broker, self.config.group_id, eof=False)

    Lagging.real, Lagging.asked = {}, 0
    monkeypatch.setattr(MemoryTransport, "group_consumer", group)
    return Lagging


def test_a_restore_waits_for_offsets_that_lag_their_checkpoints(
    tmp_path: Path, lagging: type[Lagging]
) -> None:
    broker = MemoryBroker()
    config = _config(tmp_path)
    broker.create_topics(config)
    _run(broker, config, 0, 6)
    lagging.real = dict(broker.group_offsets)
    assert lagging.real
    # the last commit's offsets not visible yet: one behind the checkpoints' anchors
    broker.group_offsets.update({k: v - 1 for k, v in lagging.real.items()})
    lagging.asked = 0
    _produce(broker, config, 6, 9)
    loop = Loop(broker, config)
    _wait(lambda: _committed(broker, config), loop, "committed")
    loop.stop()
    assert not loop.errors, loop.errors
    assert lagging.asked >= 2  # read again after the first answer
    _assert_folded(broker, config, 9)
