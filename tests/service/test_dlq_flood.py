"""A flood of poison records is committed in bounded batches, not held (real broker).

Every dead letter fits the DLQ (``dead_letters.bounded``), but their number per
batch was bounded only by ``max_batch_events``: a backlog of records just under
the copy limit (512 KiB) filled a batch of 20,000 letters -- 10 GiB held in
memory, one transaction that cannot finish within its timeout, aborted and
refolded for ever.  The loop now commits a batch once its dead letters hold
``MAX_BATCH_DEAD_LETTER_BYTES`` (counted in ``processor_dlq_batch_bound_total``).
Here the bound is lowered to 1 MiB and the commit interval raised to a minute:
the flood's letters must be committed long before the interval.
"""

from __future__ import annotations

import pytest

from processor.client.views_reader import materialize_views, session_fold_equivalent
from processor.service.loop import runner
from processor.service.loop.runner import Processor
from tests.service.conftest import Stack, as_json, sessions, wait_until
from tests.service.running import RunningProcessor
from tests.service.test_hostile import dead_letters

pytestmark = pytest.mark.kafka


def test_a_flood_of_dead_letters_is_committed_at_the_byte_bound(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "MAX_BATCH_DEAD_LETTER_BYTES", 1024 * 1024, raising=False)
    good = sessions(1, 10, seed=41)
    for sid, events in good.items():
        stack.produce(sid, events)
    producer = stack.producer()
    for i in range(30):  # 3 MB of garbage for one session
        producer.produce(
            stack.config.topics.events, key=b"poison", value=b"\x00" + bytes([i]) * 100_000
        )
    assert producer.flush(30) == 0
    proc = Processor(stack.config.with_overrides(commit_interval_ms=60_000))
    running = RunningProcessor(proc)
    try:
        # the interval is a minute: only the byte bound commits within 30 s
        wait_until(lambda: len(dead_letters(stack)) >= 10, "the flood's letters committed", 30)
        assert proc.metrics.dlq_batch_closes._value.get() >= 1
        views = materialize_views(stack.config)
        for sid in good:
            assert as_json(session_fold_equivalent(views[sid])) == stack.expected(sid)
        assert running.thread.is_alive() and not running.errors, running.errors
    finally:
        running.stop()
    assert not running.errors, running.errors
    letters = dead_letters(stack)
    assert {d.rule for d in letters} == {"CODEC"}  # undecodable: CODEC, quarantined or not
    assert all(d.value is not None and len(d.value) == 100_001 for d in letters)
