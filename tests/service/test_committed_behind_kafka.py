"""A member whose committed offset is behind its checkpoint's anchor, on a real broker.

``restore.committed_behind`` had only broker-less tests (the in-memory
cluster, ``test_anchor_commit_lag.py``).  Here the situation is made
deterministically: a run folds a session and commits, the group's offset of
its partition is moved back to the anchor (the group is empty then), and a
new member restores.  It must wait with ``/readyz`` naming the wait and the
gauge counting it, then:

- when the commit shows (a transactional offset commit from outside the
  group, as a late commit marker would make it visible), fold on from there:
  outcome ``caught_up``, ``/readyz`` ready, views equal to the offline fold;
- when it never shows within the bound, go on after the anchor (not an
  anchor failure, even with ``anchor_policy = "fail"``): outcome ``expired``,
  nothing up to the anchor read again, views equal to the offline fold.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaException,
    Producer,
    TopicPartition,
)

from processor.client.views_reader import materialize_views, session_fold_equivalent
from processor.engine.commands import partition_of
from processor.kafka import clients
from processor.service.loop.runner import Processor
from processor.telemetry.metrics import Metrics
from tests.kafka_fixtures import unique_prefix
from tests.service.conftest import Stack, as_json, sessions, wait_until
from tests.service.running import RunningProcessor
from tests.service.test_processor import dead_letters

pytestmark = pytest.mark.kafka

WAIT = b"for the group's committed offsets of"


def _outcomes(metrics: Metrics) -> dict[str, float]:
    name = "processor_restore_committed_behind_waits_total"
    return {
        o: metrics.registry.get_sample_value(name, {"outcome": o}) or 0.0
        for o in ("caught_up", "expired", "failed")
    }


def _set_committed(stack: Stack, partition: int, offset: int) -> None:
    """Move the (empty) group's committed offset of one events partition."""
    cfg = stack.config
    admin = clients.admin(cfg)
    tp = TopicPartition(cfg.topics.events, partition, offset)
    deadline = time.monotonic() + 30
    while True:  # the last member's leave may take a moment to empty the group
        try:
            for future in admin.alter_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(cfg.group_id, [tp])]
            ).values():
                future.result()
            return
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _commit_from_outside(stack: Stack, partition: int, offset: int) -> None:
    """A transactional offset commit for the group by a producer that is not a
    member (generation -1: the broker takes it while the group has members)."""
    cfg = stack.config
    outsider = Consumer({**cfg.common(), "group.id": cfg.group_id})
    producer = Producer({**cfg.common(), "transactional.id": unique_prefix("late")})
    try:
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.send_offsets_to_transaction(
            [TopicPartition(cfg.topics.events, partition, offset)],
            outsider.consumer_group_metadata(),
            30,
        )
        producer.commit_transaction(30)
    finally:
        outsider.close()


def _folded_and_behind(stack: Stack) -> tuple[int, int, list[Any]]:
    """One session folded and committed, then its partition's offset moved back
    onto its checkpoint's anchor: (partition, committed offset, log)."""
    log = sessions(1, 10, seed=21)["s000"]
    stack.produce("s", log[:8])
    stack.run_processor(max_idle_s=2)
    p = partition_of(b"s", stack.config.partitions)
    committed = 8  # the events topic holds 8 records in that partition
    _set_committed(stack, p, committed - 1)  # the anchor: its last folded event
    return p, committed, log


def _fold_the_rest(stack: Stack, log: list[Any], running: RunningProcessor) -> None:
    """The session's last events, produced and folded by the running member."""
    stack.produce("s", log[8:])

    def folded() -> bool:
        views = materialize_views(stack.config)
        got = as_json(session_fold_equivalent(views["s"])) if "s" in views else None
        return bool(got == stack.expected("s"))

    wait_until(folded, "the rest of the session folded", 60)
    assert running.thread.is_alive() and not running.errors, running.errors


def _readyz(metrics: Metrics) -> tuple[int, bytes]:
    return metrics.health.readiness()


def test_a_commit_that_shows_late_is_waited_for_then_folding_goes_on(stack: Stack) -> None:
    p, committed, log = _folded_and_behind(stack)
    metrics = Metrics()
    config = stack.config.with_overrides(restore_stable_wait_ms=60_000)
    running = RunningProcessor(Processor(config, metrics=metrics))
    try:
        wait_until(lambda: WAIT in _readyz(metrics)[1], "/readyz to name the wait", 60)
        status, body = _readyz(metrics)
        assert status == 503 and b"to pass their checkpoints" in body, body
        gauge = "processor_restore_committed_behind_seconds"
        assert (metrics.registry.get_sample_value(gauge) or 0) > 0
        _commit_from_outside(stack, p, committed)
        wait_until(lambda: _outcomes(metrics)["caught_up"] == 1, "the wait to end", 60)
        wait_until(lambda: _readyz(metrics)[0] == 200, "/readyz to turn ready", 60)
        _fold_the_rest(stack, log, running)
    finally:
        running.stop()
    assert not running.errors, running.errors
    assert _outcomes(metrics) == {"caught_up": 1, "expired": 0, "failed": 0}
    assert metrics.registry.get_sample_value("processor_restore_committed_behind_seconds") == 0


def test_a_commit_that_never_shows_is_gone_on_from_after_the_anchor(stack: Stack) -> None:
    """Past the bound the member goes on after the newest checkpoint's anchor
    (a CI chaos run: a committed transaction's offsets never showed and every
    member that took the partition exited on the anchor check): nothing of
    the log up to the anchor is read again, the rest folds, /readyz turns ready."""
    _, _, log = _folded_and_behind(stack)
    metrics = Metrics()
    config = stack.config.with_overrides(restore_stable_wait_ms=1_500, anchor_policy="fail")
    running = RunningProcessor(Processor(config, metrics=metrics))
    try:
        wait_until(lambda: _outcomes(metrics)["expired"] == 1, "the wait to expire", 60)
        wait_until(lambda: _readyz(metrics)[0] == 200, "/readyz to turn ready", 60)
        _fold_the_rest(stack, log, running)
        consumed = metrics.registry.get_sample_value("processor_records_consumed_total")
        assert consumed == len(log) - 8, consumed  # not the anchor's record again
    finally:
        running.stop()
    assert not running.errors, running.errors
    assert _outcomes(metrics) == {"caught_up": 0, "expired": 1, "failed": 0}
    assert dead_letters(stack) == []
