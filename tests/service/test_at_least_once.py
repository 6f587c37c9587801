"""At-least-once mode (`processor run --at-least-once`) on a real broker.

Without transactions nothing aborts a batch whose record the broker refused:
the processor itself must notice the failed delivery before it commits the
consumer offsets, or the record is lost while its input counts as done.
"""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)

from processor.kafka import clients
from processor.service.loop.runner import Processor
from tests.service.conftest import Stack, sessions, wait_until
from tests.service.test_processor import dead_letters, wait_for_views

pytestmark = pytest.mark.kafka


def _dlq_limit(stack: Stack, limit: int) -> None:
    entry = ConfigEntry(
        "max.message.bytes", str(limit), incremental_operation=AlterConfigOpType.SET
    )
    dlq = ConfigResource(
        ConfigResource.Type.TOPIC, stack.config.topics.dlq, incremental_configs=[entry]
    )
    admin = clients.admin(stack.config)  # kept: its futures fail when the client is collected
    for future in admin.incremental_alter_configs([dlq]).values():
        future.result(30)


def test_a_refused_record_keeps_its_batch_uncommitted_without_transactions(
    stack: Stack,
) -> None:
    """A dead letter the DLQ refuses fails its batch: no offset is committed
    past it, no checkpoint claims it, and once the topic takes it the batch is
    folded again and nothing is missing (views == offline fold, the dead letter
    written)."""
    _dlq_limit(stack, 200)  # no dead letter fits
    first = sessions(3, 8, seed=5)
    for sid, events in first.items():
        stack.produce(sid, events)

    proc = Processor(stack.config.with_overrides(exactly_once=False, instance_id="alo"))
    thread = threading.Thread(target=proc.run, daemon=True)
    thread.start()
    try:
        wait_for_views(stack, {sid: stack.expected(sid) for sid in first}, timeout=120)
        for sid, events in sessions(3, 12, seed=6).items():  # a second batch, with
            stack.produce(f"later-{sid}", events)  # the refused record in it
        stack.produce_raw("victim", b"\x00" + b"x" * 400)
        wait_until(
            lambda: proc.metrics.consecutive_failures._value.get() >= 2,
            "the refused dead letter to fail the batch",
            timeout=120,
        )
        assert not dead_letters(stack)
        _dlq_limit(stack, 1_000_000)
        deadline = time.monotonic() + 120
        while not dead_letters(stack):
            assert time.monotonic() < deadline, "the dead letter was lost"
            time.sleep(0.5)
        wait_for_views(stack, {sid: stack.expected(sid) for sid in stack.logs}, timeout=120)
        assert [d.session_id for d in dead_letters(stack)] == ["victim"]
    finally:
        proc.stop()
        thread.join(60)
