"""A revoke during a failing commit leaves the revoked partitions alone (real broker).

The commit in ``Rebalance.on_revoke`` finishes the open batch while the member still
owns its partitions; when that commit fails, the abort must rewind only the
partitions the member keeps — restoring and seeking the revoked ones would
read checkpoints for a partition the next owner is already restoring — and
must not sleep its back-off inside the group's rebalance.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)

from processor.kafka import clients
from processor.service.loop.runner import Processor
from tests.service.conftest import Stack, sessions

pytestmark = pytest.mark.kafka


def test_a_revoke_during_a_failing_commit_does_not_touch_the_revoked_partitions(
    stack: Stack,
) -> None:
    cfg = stack.config
    entry = ConfigEntry("max.message.bytes", "200", incremental_operation=AlterConfigOpType.SET)
    dlq = ConfigResource(ConfigResource.Type.TOPIC, cfg.topics.dlq, incremental_configs=[entry])
    admin = clients.admin(cfg)  # kept: its futures fail when the client is collected
    for future in admin.incremental_alter_configs([dlq]).values():
        future.result(30)  # no dead letter fits: every batch holding one fails to commit
    for sid, events in sessions(6, 10, seed=11).items():
        stack.produce(sid, events)
    for n in range(3):  # a poison record in (very likely) every partition
        stack.produce_raw(f"victim-{n}", b"\x00" + b"x" * 400)

    # a long commit interval keeps the failing batch open when the rebalance comes
    first = Processor(cfg.with_overrides(instance_id="r1", commit_interval_ms=20_000))
    restores: list[tuple[list[int], set[int]]] = []
    revoke_aborts: list[set[int]] = []
    restore, abort = first.rebalance.restore, first.txn.abort

    def spy_restore(numbers: list[int]) -> Any:
        restores.append((list(numbers), set(first.txn.leaving)))
        return restore(numbers)

    def spy_abort(partitions: set[int], **kw: Any) -> None:
        if first.txn.leaving:
            revoke_aborts.append(set(first.txn.leaving))
        abort(partitions, **kw)

    first.rebalance.restore = spy_restore  # type: ignore[method-assign]
    first.txn.abort = spy_abort  # type: ignore[method-assign]
    t1 = threading.Thread(target=first.run, daemon=True)
    t1.start()
    try:
        deadline = time.monotonic() + 120
        while first.metrics.records_consumed._value.get() < 63:
            assert time.monotonic() < deadline, "nothing consumed"
            time.sleep(0.2)
        for attempt in range(5):  # a member joining revokes some of first's partitions
            second, t2 = stack.start_thread(instance_id=f"r2-{attempt}")
            deadline = time.monotonic() + 60
            while not revoke_aborts and time.monotonic() < deadline:
                time.sleep(0.2)
            second.stop()
            t2.join(60)
            if revoke_aborts:
                break
        assert revoke_aborts, "no commit failed during a revoke: the scenario did not happen"
        touched = [(numbers, leaving) for numbers, leaving in restores if set(numbers) & leaving]
        assert not touched, f"restored partitions being revoked: {touched}"
        assert first.metrics.txn_failures.labels("abortable")._value.get() >= 1
        assert t1.is_alive()
    finally:
        first.stop()
        t1.join(60)
