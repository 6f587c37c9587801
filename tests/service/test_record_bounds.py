"""VF-7 on a real broker: a session whose derived records outgrow every bound
is refused alone; the other sessions of its partition keep flowing.

The hostile session is valid and every event of it is under 1 MB: request
headers with two ~470 KB incompressible tool descriptions each (its
``toolHistory`` checkpoint row outgrows the record bound after about a dozen
headers), big tool results and the big unit views they make.  It shares one
partition with ordinary sessions.  Before VF-7 the first big checkpoint row
made every transaction of the partition fail with ``MSG_SIZE_TOO_LARGE``,
aborted and refolded for ever.
"""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING

from processor.client.views_reader import (
    materialize_views,
    offline_equivalent,
    session_fold_equivalent,
)
from processor.codec import default_codec
from processor.core.events import Event
from processor.engine.commands import partition_of
from processor.engine.record_bounds import record_bound
from processor.kafka import clients
from processor.kafka.reads import read_partitions
from processor.offline import fold_events, session_output
from processor.service.loop.runner import Processor
from processor.workload import generate_session
from tests.conformance.test_record_sizes import hostile_log
from tests.service.conftest import Stack, as_json
from tests.service.running import RunningProcessor
from tests.service.test_hostile import committed_to_end, dead_letters

pytestmark = pytest.mark.kafka

codec = default_codec()


def same_partition(prefix: str, partition: int, n: int, partitions: int) -> list[str]:
    """``n`` session ids whose keys hash to ``partition``."""
    found: list[str] = []
    i = 0
    while len(found) < n:
        sid = f"{prefix}{i}"
        if partition_of(sid.encode(), partitions) == partition:
            found.append(sid)
        i += 1
    return found


def test_VF7_a_hostile_session_is_refused_and_its_partition_keeps_flowing(stack: Stack) -> None:
    cfg = stack.config
    partition = partition_of(b"hostile", cfg.partitions)
    hostile = hostile_log(22, 400, every_result=5)
    big_tools = sum(
        len(t["description"]) > 400_000
        for e in hostile
        if e.type == "request/header"
        for t in e.data["header"].get("tools", [])
    )
    assert big_tools >= 12  # over 5 MB of toolHistory: past any bound
    assert all(len(codec.encode_parsed_event("hostile", e)) < 1_000_000 for e in hostile)
    rng = random.Random(5)
    good: dict[str, list[Event]] = {
        sid: generate_session(random.Random(rng.random()), 120)
        for sid in same_partition("ordinary-", partition, 3, cfg.partitions)
    }

    member = RunningProcessor(Processor(cfg.with_overrides(instance_id="fit")))
    try:
        producer = stack.producer()
        # interleaved: ordinary events before, among and after the hostile ones,
        # each chunk folded before the next is produced (several transactions)
        for k in range(4):
            for sid, events in good.items():
                stack.produce(sid, events[k * 30 : (k + 1) * 30], producer)
            stack.produce("hostile", hostile[k * 100 : (k + 1) * 100], producer)
            assert producer.flush(60) == 0
            deadline = time.monotonic() + 180
            while not committed_to_end(stack):
                assert not member.errors, f"the processor died: {member.errors[0]!r}"
                assert time.monotonic() < deadline, f"a partition stalled (chunk {k})"
                time.sleep(1.0)
    finally:
        member.stop()
    assert not member.errors, f"the processor died: {member.errors[0]!r}"

    # the hostile session: one VF-7 dead letter naming its seq, quarantined
    letters = [d for d in dead_letters(stack) if d.session_id == "hostile"]
    refusals = [d for d in letters if d.rule == "VF-7"]
    assert len(refusals) == 1, [(d.rule, d.seq) for d in letters]
    refusal = refusals[0]
    assert refusal.seq is not None and f"seq {refusal.seq}: derived record" in refusal.reason
    assert {d.rule for d in letters} <= {"VF-7", "QUARANTINED"}
    views = materialize_views(cfg)
    status = views["hostile"]["status"].value
    assert status["state"] == "quarantined" and status["quarantine"]["rule"] == "VF-7", status
    at = status["lastSeq"]
    assert hostile[99].seq <= at < refusal.seq  # its first chunk was committed
    fold = as_json(offline_equivalent(session_output_upto(hostile, at)))
    fold["status"] = "quarantined"
    assert as_json(session_fold_equivalent(views["hostile"])) == fold

    # the ordinary sessions of its partition flowed to their ends
    for sid in good:
        assert views[sid]["status"].value["state"] == "ok", views[sid]["status"].value
        assert as_json(session_fold_equivalent(views[sid])) == stack.expected(sid), sid

    # and nothing the processor wrote is over the bound
    bound = record_bound(cfg)
    consumer = clients.plain_consumer(cfg, "fit-sizes")
    try:
        for topic in (cfg.topics.views, cfg.topics.checkpoints, cfg.topics.dlq):
            read = read_partitions(consumer, topic, {partition: OFFSET_BEGINNING})
            sizes = [len(m.key() or b"") + len(m.value() or b"") for m in read[partition]]
            assert sizes and max(sizes) <= bound, (topic, max(sizes))
    finally:
        consumer.close()


def session_output_upto(events: list[Event], seq: int) -> dict[str, Any]:
    return session_output(fold_events([e for e in events if e.seq <= seq]))
