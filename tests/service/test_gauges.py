"""Lag gauges tell the truth between commits and after a rebalance (real broker).

``ProcessorLagGrowing`` and the dashboard read ``processor_partition_lag``: a
gauge set only after a commit stays at its last value while a partition
stops committing, and one never removed on revoke reports a partition the
member no longer owns (two members then both report it).
"""

from __future__ import annotations

import re

import pytest

from processor.service.loop.runner import Processor
from tests.service.conftest import Stack, sessions, wait_until

pytestmark = pytest.mark.kafka


def lag_labels(proc: Processor) -> dict[int, float]:
    text = proc.metrics.exposition().decode()
    return {
        int(m.group(1)): float(m.group(2))
        for m in re.finditer(r'^processor_partition_lag\{partition="(\d+)"\} (\S+)$', text, re.M)
    }


def test_lag_is_reported_without_a_commit(stack: Stack) -> None:
    logs = sessions(6, 10, seed=3)
    for sid, events in logs.items():
        stack.produce(sid, events)
    # a batch that never closes: no commit happens during the test
    proc, thread = stack.start_thread(
        instance_id="g1", commit_interval_ms=600_000, max_batch_events=1_000_000
    )
    try:
        wait_until(lambda: proc.metrics.records_consumed._value.get() >= 60, "consumed")
        wait_until(lambda: set(lag_labels(proc)) == {0, 1, 2}, "lag of every partition")
        # a partition's gauge is first set when its fill ends, before its records
        # are consumed; the loop refreshes it (GAUGE_EVERY_S) without any commit
        wait_until(
            lambda: all(v == 0 for v in lag_labels(proc).values()),
            "every partition's lag refreshed to 0 without a commit",
            timeout=60,
        )
        assert proc.metrics.commits._value.get() == 0
    finally:
        proc.stop()
        thread.join(60)


def test_a_revoked_partition_leaves_the_lag_gauge(stack: Stack) -> None:
    logs = sessions(9, 8, seed=4)
    for sid, events in logs.items():
        stack.produce(sid, events)
    first, t1 = stack.start_thread(instance_id="g1")
    second: Processor | None = None
    t2 = None
    try:
        wait_until(lambda: set(lag_labels(first)) == {0, 1, 2}, "first owns every partition")
        second, t2 = stack.start_thread(instance_id="g2")
        assert second is not None
        wait_until(
            lambda: second is not None and len(lag_labels(second)) >= 1,
            "the second member reports its partitions",
        )
        wait_until(
            lambda: (
                second is not None
                and not set(lag_labels(first)) & set(lag_labels(second))
                and set(lag_labels(first)) | set(lag_labels(second)) == {0, 1, 2}
            ),
            "each partition reported by its owner only",
        )
    finally:
        for proc, thread in ((second, t2), (first, t1)):
            if proc is not None and thread is not None:
                proc.stop()
                thread.join(60)
