"""One set of scenarios, three runs (issue 11's contract suite).

Each scenario is a sequence of inputs — events (as produced or rewritten),
raw bytes, redrive commands — and what must come out: per session its
``status`` (state, last seq), views equal to the offline fold of the events
it applied, and its dead letters by rule.  The scenarios run through the
engine alone; through the ``Processor`` loop on the in-memory transport
(``processor/testing/memory.py``: no broker, part of the fast run); and
through the same loop on the local broker (marker ``kafka``).  A scenario
that passes on the engine and fails on the loop is a bug in the loop; one
that passes in memory and fails on the broker is a difference between the
memory transport and Kafka.

Barriers mirror an operator: a redrive is sent once the quarantine it names
is committed, and events after it once the command is.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Protocol

import pytest
from confluent_kafka import TopicPartition

from processor.client.views_reader import (
    _Materializer,
    materialize_views,
    offline_equivalent,
    read_dead_letters,
    session_fold_equivalent,
)
from processor.codec import DeadLetter, default_codec
from processor.config import ServiceConfig
from processor.core.events import Event
from processor.engine.commands import partition_of, redrive
from processor.kafka import clients
from processor.offline import fold_events, session_output
from processor.service.loop.runner import Processor
from processor.testing.memory import MemoryBroker, MemoryTransport
from tests.engine.kit import Harness, changed, session_log
from tests.service.conftest import Stack, as_json
from tests.service.running import RunningProcessor

LOG = session_log(30, seed=23)
PARTITIONS = 3  # the broker stack's partition count
codec = default_codec()


@dataclass(frozen=True)
class Ev:
    sid: str
    index: int
    rewritten: bool = False  # same seq, different content

    def event(self) -> Event:
        return changed(LOG[self.index]) if self.rewritten else LOG[self.index]


@dataclass(frozen=True)
class Raw:
    sid: str
    value: bytes


@dataclass(frozen=True)
class Redrive:
    sid: str
    index: int  # redrive at LOG[index].seq


Step = Ev | Raw | Redrive


@dataclass(frozen=True)
class Expect:
    state: str
    applied: int  # LOG[:applied] were folded
    rules: tuple[str, ...] = ()


@dataclass(frozen=True)
class Scenario:
    name: str
    steps: tuple[Step, ...]
    expect: dict[str, Expect]


def _run(sid: str, start: int, end: int) -> tuple[Ev, ...]:
    return tuple(Ev(sid, i) for i in range(start, end))


SCENARIOS = [
    Scenario(
        "clean",
        (*_run("a", 0, 30), *_run("b", 0, 12)),
        {"a": Expect("ok", 30), "b": Expect("ok", 12)},
    ),
    Scenario("retry", (*_run("a", 0, 10), Ev("a", 4), *_run("a", 10, 20)), {"a": Expect("ok", 20)}),
    Scenario(
        "rewrite",
        (*_run("a", 0, 10), Ev("a", 4, rewritten=True), *_run("a", 10, 13)),
        {"a": Expect("quarantined", 10, ("SEQ-GATE", "QUARANTINED", "QUARANTINED", "QUARANTINED"))},
    ),
    Scenario(
        "gap",
        (*_run("a", 0, 6), Ev("a", 7), Ev("a", 6), *_run("b", 0, 5)),
        {"a": Expect("quarantined", 6, ("S-1", "QUARANTINED")), "b": Expect("ok", 5)},
    ),
    Scenario(
        "undecodable",
        (*_run("a", 0, 5), Raw("a", b"\x00junk"), Ev("a", 5)),
        {"a": Expect("quarantined", 5, ("CODEC", "QUARANTINED"))},
    ),
    Scenario(
        "redrive",
        (*_run("a", 0, 10), Ev("a", 3, rewritten=True), Redrive("a", 9), *_run("a", 10, 20)),
        {"a": Expect("ok", 20, ("SEQ-GATE",))},
    ),
    Scenario(
        "redrive-first",
        (*_run("a", 0, 10), Redrive("a", 9), Ev("a", 3, rewritten=True), *_run("a", 10, 15)),
        {"a": Expect("ok", 15, ("SEQ-GATE",))},
    ),
    Scenario(
        "redrive-wrong-seq",
        (*_run("a", 0, 10), Ev("a", 3, rewritten=True), Redrive("a", 4), Ev("a", 10)),
        {"a": Expect("quarantined", 10, ("SEQ-GATE", "QUARANTINED"))},
    ),
]


def _sid(scenario: Scenario, sid: str) -> str:
    return f"{scenario.name}-{sid}"


def _partition(sid: str) -> int:
    return partition_of(sid.encode(), PARTITIONS)


def _check(scenario: Scenario, views: dict[str, Any], letters: dict[str, Counter[str]]) -> None:
    for short, want in scenario.expect.items():
        sid = _sid(scenario, short)
        status = views[sid]["status"].value
        applied = LOG[: want.applied]
        assert (status["state"], status["lastSeq"]) == (want.state, applied[-1].seq), sid
        expected = as_json(offline_equivalent(session_output(fold_events(applied))))
        expected["status"] = want.state
        assert as_json(session_fold_equivalent(views[sid])) == expected, sid
        assert letters.get(sid, Counter()) == Counter(want.rules), sid


# ------------------------------------------------------------------ memory


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_contract_on_the_engine_alone(scenario: Scenario) -> None:
    h = Harness(partitions=tuple(range(PARTITIONS)))
    for n, step in enumerate(scenario.steps):
        sid = _sid(scenario, step.sid)
        p = _partition(sid)
        if isinstance(step, Ev):
            h.fold(h.event(sid, step.event(), p))
        elif isinstance(step, Raw):
            h.fold(h.record(sid.encode(), step.value, p))
        else:
            h.commit()  # the operator saw the quarantine
            h.engine.apply_commands([h.command(redrive(sid, LOG[step.index].seq), p)])
        if n % 7 == 6:
            h.commit()  # batches end anywhere: the outcome must not depend on it
    h.commit()
    letters: dict[str, Counter[str]] = {}
    for d in h.dead_letters():
        letters.setdefault(d.session_id or "", Counter())[d.rule] += 1
    _check(scenario, h.views(), letters)


# ------------------------------------------------------------------ the loop


class Side(Protocol):
    """Where the ``Processor`` loop runs: an in-memory cluster or the broker."""

    config: ServiceConfig

    def processor(self) -> Processor: ...
    def produce(self, topic: str, key: bytes, value: bytes) -> None: ...
    def flush(self) -> None: ...
    def committed_to_end(self) -> bool: ...
    def views(self) -> dict[str, Any]: ...
    def dead_letters(self) -> list[DeadLetter]: ...


class MemorySide:
    """The same loop on ``processor.testing.memory``: no broker, part of the fast run."""

    def __init__(self) -> None:
        self.config = ServiceConfig(partitions=PARTITIONS, topic_prefix="contract")
        self.broker = MemoryBroker()
        self.broker.create_topics(self.config)

    def processor(self) -> Processor:
        return Processor(self.config, transport=MemoryTransport(self.broker, self.config))

    def produce(self, topic: str, key: bytes, value: bytes) -> None:
        self.broker.produce(topic, key, value)

    def flush(self) -> None:
        pass  # written when produced

    def committed_to_end(self) -> bool:
        offsets = self.broker.group_offsets
        group = self.config.group_id
        for topic in (self.config.topics.events, self.config.topics.control):
            for p in range(PARTITIONS):
                high = self.broker.log(topic, p).stable
                if high > 0 and offsets.get((group, topic, p), -1) < high:
                    return False
        return True

    def views(self) -> dict[str, Any]:
        reader = _Materializer(codec, None, None)
        for _, msg in self.broker.committed_records(self.config.topics.views):
            reader.apply(msg.key(), msg.value())
        return reader.views

    def dead_letters(self) -> list[DeadLetter]:
        return [
            codec.decode_dead_letter(msg.value() or b"")
            for _, msg in self.broker.committed_records(self.config.topics.dlq)
        ]


class BrokerSide:
    """The same loop on the local broker."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.config = stack.config
        self.producer = stack.producer()

    def processor(self) -> Processor:
        return Processor(self.config)

    def produce(self, topic: str, key: bytes, value: bytes) -> None:
        self.producer.produce(topic, key=key, value=value)

    def flush(self) -> None:
        assert self.producer.flush(30) == 0

    def committed_to_end(self) -> bool:
        config = self.config
        consumer = clients.plain_consumer(config, "contract-check")
        group = clients.group_consumer(config, "contract-offsets")
        try:
            for topic in (config.topics.events, config.topics.control):
                tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
                committed = {tp.partition: tp.offset for tp in group.committed(tps, timeout=30)}
                for p in range(PARTITIONS):
                    high = consumer.get_watermark_offsets(tps[p], timeout=30)[1]
                    if high > 0 and committed[p] < high:
                        return False
            return True
        finally:
            group.close()
            consumer.close()

    def views(self) -> dict[str, Any]:
        return materialize_views(self.config)

    def dead_letters(self) -> list[DeadLetter]:
        return list(read_dead_letters(self.config))


def _barrier(side: Side, errors: list[BaseException]) -> None:
    side.flush()
    deadline = time.monotonic() + 120
    while not side.committed_to_end():
        assert not errors, f"the processor died: {errors[0]!r}"
        assert time.monotonic() < deadline, "the processor did not commit everything"
        time.sleep(0.05)


def _run_on(side: Side) -> None:
    """Every scenario through one running ``Processor``, then each outcome checked."""
    cfg = side.config
    assert cfg.partitions == PARTITIONS
    running = RunningProcessor(side.processor())
    errors = running.errors  # named by the barrier
    try:
        for scenario in SCENARIOS:
            for step in scenario.steps:
                sid = _sid(scenario, step.sid)
                if isinstance(step, Ev):
                    value = codec.encode_parsed_event(sid, step.event())
                    side.produce(cfg.topics.events, sid.encode(), value)
                elif isinstance(step, Raw):
                    side.produce(cfg.topics.events, sid.encode(), step.value)
                else:
                    _barrier(side, errors)  # the operator saw the quarantine
                    command = redrive(sid, LOG[step.index].seq).encode()
                    side.produce(cfg.topics.control, sid.encode(), command)
                    _barrier(side, errors)  # ... and the command was taken
            side.flush()
        _barrier(side, errors)
    finally:
        running.stop()
    assert not running.thread.is_alive(), "the processor did not stop"
    assert not errors, errors
    views = side.views()
    letters: dict[str, Counter[str]] = {}
    for d in side.dead_letters():
        letters.setdefault(d.session_id or "", Counter())[d.rule] += 1
    for scenario in SCENARIOS:
        _check(scenario, views, letters)


def test_contract_on_the_loop_in_memory() -> None:
    _run_on(MemorySide())


@pytest.mark.kafka
def test_contract_on_the_broker(stack: Stack) -> None:
    _run_on(BrokerSide(stack))
