"""Misplaced records and misconfigured topics on a real broker: one line, never a silent split.

- A session's record in a partition its key does not hash to (a writer with
  another partitioner, or an explicit partition) is a KEY dead letter: it no
  longer starts a second copy of the session whose views land in another
  views partition (a gap there quarantined that copy, and readers saw two
  values for one view).
- A topic layout that breaks the service (co-partitioning, cleanup policies)
  ends the start with one line naming the topic, and ``/readyz`` names it:
  before, the process ran and ``/readyz`` turned green while transactions
  aborted on a missing partition, restores were put off for ever, or
  retention was about to delete the checkpoints.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from processor.client.views_reader import materialize_views, session_fold_equivalent
from processor.codec import default_codec
from processor.config import ServiceConfig
from processor.engine.commands import partition_of
from processor.kafka import clients
from processor.kafka.client_errors import KafkaFatal
from processor.kafka.topic_admin import delete_topics, topic_specs
from processor.service.loop.runner import Processor
from processor.telemetry.metrics import Metrics
from tests.kafka_fixtures import unique_prefix
from tests.service.conftest import Stack, as_json, sessions
from tests.service.running import RunningProcessor
from tests.service.test_hostile import dead_letters

pytestmark = pytest.mark.kafka

codec = default_codec()


def test_a_record_outside_its_keys_partition_is_a_dead_letter_not_a_second_session(
    stack: Stack,
) -> None:
    cfg = stack.config
    n = cfg.partitions
    log = sessions(1, 12, seed=3)["s000"]
    home = partition_of(b"s", n)
    stack.produce("s", log[:6])
    producer = stack.producer()
    strays: list[tuple[str, int, int]] = []

    def delivered(err: KafkaError | None, msg: Message) -> None:
        assert err is None, err
        strays.append(((msg.key() or b"").decode(), msg.partition() or 0, msg.offset() or 0))

    # one event of "s" where it does not belong, then the same event where it does
    producer.produce(
        cfg.topics.events,
        key=b"s",
        value=codec.encode_parsed_event("s", log[6]),
        partition=(home + 1) % n,
        on_delivery=delivered,
    )
    # a whole session written with another partitioner
    other = sessions(1, 4, seed=4)["s000"]
    for event in other:
        producer.produce(
            cfg.topics.events,
            key=b"w",
            value=codec.encode_parsed_event("w", event),
            partition=(partition_of(b"w", n) + 1) % n,
            on_delivery=delivered,
        )
    assert producer.flush(30) == 0
    stack.produce("s", log[6:])
    proc = stack.run_processor(max_idle_s=3)

    letters = dead_letters(stack)
    assert sorted((d.session_id, d.partition, d.offset) for d in letters) == sorted(strays)
    assert {d.rule for d in letters} == {"KEY"}
    assert all("hashes to partition" in d.reason for d in letters), letters[0].reason
    assert proc.metrics.dlq.labels("KEY")._value.get() == len(strays)
    views = materialize_views(cfg)
    assert "w" not in views  # no copy of it anywhere
    assert views["s"]["status"].value == {"state": "ok", "lastSeq": log[-1].seq}
    assert as_json(session_fold_equivalent(views["s"])) == stack.expected("s")
    assert proc.metrics.quarantined._value.get() == 0


# ------------------------------------------------------------------ topic layout


@pytest.fixture
def bare(kafka_bootstrap: str) -> Iterator[ServiceConfig]:
    """A configuration whose topics the test creates (and this fixture deletes)."""
    prefix = unique_prefix("lay")
    config = ServiceConfig(
        bootstrap_servers=kafka_bootstrap,
        topic_prefix=prefix,
        group_id=f"{prefix}-group",
        partitions=3,
        commit_interval_ms=100,
        transaction_timeout_ms=10_000,
    )
    yield config
    admin = clients.admin(config)
    names = [s.name for s in topic_specs(config)]
    existing = [n for n in names if n in admin.list_topics(timeout=10).topics]
    if existing:
        delete_topics(admin, existing)


def _create(
    config: ServiceConfig,
    partitions: dict[str, int],
    configs: dict[str, Any],
    skip: str | None = None,
) -> None:
    """The five topics as ``topics create`` makes them, but for the given changes
    (``skip``: one not created)."""
    admin = clients.admin(config)
    specs = [s for s in topic_specs(config) if s.name != skip]
    new = [
        NewTopic(
            s.name,
            num_partitions=partitions.get(s.name, s.partitions),
            replication_factor=config.replication_factor,
            config={**s.configs, **configs.get(s.name, {})},
        )
        for s in specs
    ]
    for future in admin.create_topics(new, operation_timeout=30).values():
        future.result()
    deadline = time.monotonic() + 30
    while any(s.name not in admin.list_topics(timeout=10).topics for s in specs):
        assert time.monotonic() < deadline, "topics not in the metadata"
        time.sleep(0.2)


CASES = {
    "checkpoints-with-2-partitions": (
        {"checkpoints": 2},
        {},
        "checkpoints' has 2 partitions, '{events}' has 3: they must be co-partitioned",
    ),
    "dlq-with-1-partition": ({"dlq": 1}, {}, "dlq' has 1 partitions"),
    "checkpoints-not-compacted": (
        {},
        {"checkpoints": {"cleanup.policy": "delete"}},
        "checkpoints' has cleanup.policy=delete, expected compact: retention deletes",
    ),
    "views-compact-and-delete": (
        {},
        {"views": {"cleanup.policy": "compact,delete"}},
        "views' has cleanup.policy=compact,delete, expected compact",
    ),
    "events-compacted": (
        {},
        {"events": {"cleanup.policy": "compact"}},
        "events' has cleanup.policy=compact, expected delete: compaction keeps only",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_broken_topic_layout_ends_the_start_with_one_line_on_readyz(
    bare: ServiceConfig, case: str
) -> None:
    parts, configs, needle = CASES[case]
    t = bare.topics
    _create(
        bare,
        {getattr(t, kind): count for kind, count in parts.items()},
        {getattr(t, kind): conf for kind, conf in configs.items()},
    )
    needle = needle.format(events=t.events)
    metrics = Metrics()
    running = RunningProcessor(Processor(bare, metrics=metrics))
    try:
        # with the check it ends within seconds; without it, it ran on (green)
        running.thread.join(45)
        assert not running.thread.is_alive(), f"{case}: the member started and ran on"
    finally:
        running.stop()
    assert len(running.errors) == 1 and isinstance(running.errors[0], KafkaFatal), running.errors
    line = str(running.errors[0])
    assert needle in line and "\n" not in line, line
    status, body = metrics.health.readiness()
    assert status == 503 and needle in body.decode(), body


def test_a_layout_as_topics_create_makes_it_passes(bare: ServiceConfig) -> None:
    """The check refuses nothing ``processor topics create`` makes (a short run folds)."""
    _create(bare, {}, {})
    stack = Stack(bare)
    logs = sessions(2, 10, seed=5)
    for sid, events in logs.items():
        stack.produce(sid, events)
    stack.run_processor(max_idle_s=2)
    views = materialize_views(bare)
    for sid in logs:
        assert as_json(session_fold_equivalent(views[sid])) == stack.expected(sid)


@pytest.mark.parametrize("kind", ["events", "checkpoints", "views"])
def test_a_missing_topic_ends_the_start_with_one_line_naming_it(
    bare: ServiceConfig, kind: str
) -> None:
    """As the control topic's (test_hostile.py): every topic the member uses."""
    missing = getattr(bare.topics, kind)
    _create(bare, {}, {}, skip=missing)
    metrics = Metrics()
    with pytest.raises(KafkaFatal) as raised:
        Processor(bare, metrics=metrics).run(max_idle_s=2)
    line = str(raised.value)
    assert f"topic {missing!r} does not exist (run `processor topics create`)" in line, line
    assert "\n" not in line
    assert metrics.health.readiness()[0] == 503
