"""SessionWriter against a real Kafka broker: seqs, refusal before produce,
Java-compatible partitioning, control records, delivery failures.

Every claim is checked by reading the events topic back (``read_committed``,
all partitions), never by trusting the producer's word.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Message

from processor.client.session_writer import DeliveryError, SessionWriter, producer_name
from processor.client.views_reader import (
    materialize_views,
    offline_equivalent,
    read_committed_records,
    session_fold_equivalent,
)
from processor.codec import default_codec
from processor.config import ServiceConfig
from processor.core.builder import LogBuilder
from processor.core.errors import SessionError
from processor.core.events import Event
from processor.kafka import clients
from processor.kafka.topic_admin import create_topics
from processor.offline import fold_events, session_output
from processor.service.loop.control import Command, parse_command
from processor.service.loop.runner import Processor
from processor.workload import generate_session
from tests.kafka_fixtures import unique_prefix

# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def murmur2(data: bytes) -> int:
    """Reference port of Kafka's ``Utils.murmur2`` (Java client, signed 32-bit result)."""
    m, r, mask = 0x5BD1E995, 24, 0xFFFFFFFF
    length = len(data)
    h = (0x9747B28C ^ length) & mask
    for i in range(length // 4):
        k = int.from_bytes(data[4 * i : 4 * i + 4], "little")
        k = (k * m) & mask
        k ^= k >> r
        k = (k * m) & mask
        h = (h * m) & mask
        h ^= k
    tail = length & ~3
    rest = length % 4
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def java_partition(key: bytes, partitions: int) -> int:
    """``DefaultPartitioner``/``BuiltInPartitioner``: toPositive(murmur2(key)) % n."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def read_records(config: ServiceConfig, topic: str) -> list[Message]:
    """Every committed record of ``topic``, all partitions, from the beginning."""
    return read_committed_records(config, topic, timeout=30, purpose="test-read")


def events_of(config: ServiceConfig, session_id: str | None = None) -> list[Any]:
    """Decoded events of the events topic (control records left out)."""
    codec = default_codec()
    out = []
    for m in read_records(config, config.topics.events):
        value = m.value()
        if value is None:
            continue
        decoded = codec.decode_event(value)
        if session_id is None or decoded.session_id == session_id:
            out.append(decoded)
    return out


@pytest.fixture
def config(kafka_bootstrap: str) -> Iterator[ServiceConfig]:
    prefix = unique_prefix("w")
    cfg = ServiceConfig(
        bootstrap_servers=kafka_bootstrap,
        topic_prefix=prefix,
        group_id=f"{prefix}-group",
        partitions=3,
        commit_interval_ms=100,
        transaction_timeout_ms=10_000,
    )
    create_topics(clients.admin(cfg), cfg)
    yield cfg


# --------------------------------------------------------------------------
# the murmur2 reference itself (Kafka's UtilsTest vectors)
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_reference_murmur2_matches_the_java_client(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


# --------------------------------------------------------------------------
# broker tests
# --------------------------------------------------------------------------


@pytest.mark.kafka
def test_writer_assigns_seqs_and_commits_after_delivery(config: ServiceConfig) -> None:
    events = generate_session(random.Random(7), 60)
    with SessionWriter(config) as writer:
        for event in events:
            assert writer.append_event("a", event) is event
        session = writer.session("a")
        assert session.last_seq == 59
        built = writer.append("a", "turn/start", {"turn": 1000}, time=123)
        assert (built.seq, built.time) == (60, 123)
        stamped = writer.append("a", "turn/end", {"turn": 1000, "reason": "stop"})
        assert stamped.seq == 61 and stamped.time > 1_600_000_000_000  # wall clock ms
        assert session.last_seq == 61
    got = events_of(config, "a")
    assert [d.seq for d in got] == list(range(62))
    assert [d.to_event().digest_bytes() for d in got] == [
        e.digest_bytes() for e in [*events, built, stamped]
    ]
    assert {d.producer for d in got} == {producer_name()}


@pytest.mark.kafka
def test_invalid_event_is_refused_before_anything_is_produced(config: ServiceConfig) -> None:
    b = LogBuilder()
    b.system("prompt")
    b.user("hello")
    writer = SessionWriter(config)
    for event in b.events:
        writer.append_event("s", event)
    refusals: list[SessionError] = []
    attempts: list[Callable[[], Event]] = [
        # S-3: assistant messages never cite sources
        lambda: writer.append(
            "s",
            "assistant/message",
            {
                "turn": 1,
                "step": 1,
                "stream": [],
                "message": {
                    "id": "a1",
                    "role": "assistant",
                    "content": [],
                    "source": {"kind": "model", "provider": "p", "model": "m"},
                },
            },
            surface_op="append",
            source_event_seqs=[0],
        ),
        # S-2: a surface event without surfaceOp
        lambda: writer.append(
            "s",
            "user/message",
            {"id": "u9", "role": "user", "content": [], "source": {"kind": "user"}},
        ),
        # E-4: unknown type without ignorable
        lambda: writer.append("s", "custom/thing", {}),
        # E-3: not plain JSON (refused while building the envelope)
        lambda: writer.append("s", "turn/start", {"turn": float("nan")}),
        # S-1: a prebuilt event at the wrong seq
        lambda: writer.append_event("s", LogBuilder(start_seq=5).turn_start()),
    ]
    for attempt in attempts:
        with pytest.raises(SessionError) as info:
            attempt()
        refusals.append(info.value)
    assert [e.rule for e in refusals] == ["S-3", "S-2", "E-4", "E-3", "S-1"]
    assert writer.session("s").next_seq == 2  # nothing committed locally either
    ok = writer.append("s", "turn/start", {"turn": 1})
    assert ok.seq == 2
    writer.close()
    assert [d.seq for d in events_of(config)] == [0, 1, 2]  # no refused event reached Kafka


@pytest.mark.kafka
def test_sessions_are_partitioned_like_the_java_client(kafka_bootstrap: str) -> None:
    prefix = unique_prefix("wp")
    cfg = ServiceConfig(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix, partitions=7)
    create_topics(clients.admin(cfg), cfg)
    ids = [f"session-{i}" for i in range(30)] + ["ü-ñicode-✓", "a/b/c", "x", ""]
    with SessionWriter(cfg) as writer:
        for sid in ids:
            writer.append(sid, "turn/start", {"turn": 1})
    records = read_records(cfg, cfg.topics.events)
    assert len(records) == len(ids)
    seen = {}
    for m in records:
        key = m.key()
        assert key is not None
        seen[key.decode()] = m.partition()
        assert m.partition() == java_partition(key, 7), key
    assert set(seen) == set(ids)
    assert len(set(seen.values())) > 1  # really spread, not all on one partition


@pytest.mark.kafka
def test_redrive_control_record_and_end_to_end_recovery(config: ServiceConfig) -> None:
    b = LogBuilder()
    b.system("prompt")
    b.user("one")
    writer = SessionWriter(config)
    for event in b.events:
        writer.append_event("q", event)
    # another writer (no validation) leaves a gap: the processor quarantines "q"
    foreign = LogBuilder(start_seq=5).user("from elsewhere")
    producer = clients.event_producer(config)
    producer.produce(
        config.topics.events, key=b"q", value=default_codec().encode_parsed_event("q", foreign)
    )
    assert producer.flush(30) == 0
    Processor(config).run(max_idle_s=2)
    status = materialize_views(config, session="q", view="status")["q"]["status"].value
    assert status["state"] == "quarantined" and status["lastSeq"] == 1

    writer.redrive("q", 1)
    control = read_records(config, config.topics.control)[-1]
    assert control.key() == b"q"
    assert parse_command(control.key(), control.value()) == Command("redrive", "q", 1)
    assert not [m for m in read_records(config, config.topics.events) if m.value() is None]

    writer.append(
        "q",
        "user/message",
        {
            "id": "u-2",
            "role": "user",
            "content": [{"type": "text", "text": "two"}],
            "source": {"kind": "test"},
        },
        surface_op="append",
    )
    writer.close()
    t0 = time.monotonic()
    Processor(config).run(max_idle_s=2)
    views = materialize_views(config, session="q")
    expected = offline_equivalent(session_output(fold_events(list(writer.session("q").log))))
    assert session_fold_equivalent(views["q"]) == expected
    assert time.monotonic() - t0 < 15


def test_delivery_failure_raises_and_leaves_the_session_unchanged() -> None:
    """No broker listens on port 1: librdkafka times the record out."""
    cfg = ServiceConfig(
        bootstrap_servers="127.0.0.1:1",
        topic_prefix="nowhere",
        kafka={"message.timeout.ms": "1000", "log_level": "0"},
    )
    writer = SessionWriter(cfg)
    event = LogBuilder().system("prompt")
    with pytest.raises(DeliveryError) as info:
        writer.append_event("d", event)
    assert info.value.event is event and info.value.session_id == "d"
    assert writer.session("d").next_seq == 0
    with pytest.raises(DeliveryError):  # the same event can be retried as-is
        writer.append_event("d", info.value.event)
    assert writer.session("d").next_seq == 0


def test_a_ready_producer_needs_the_topic_named() -> None:
    producer = clients.event_producer(ServiceConfig(bootstrap_servers="127.0.0.1:1"))
    with pytest.raises(ValueError, match="topic"):
        SessionWriter(producer)
    writer = SessionWriter(producer, topic="p.events")
    assert writer.topic == "p.events"
    writer.close(timeout=0)
    with pytest.raises(RuntimeError, match="closed"):
        writer.append("s", "turn/start", {"turn": 1})
