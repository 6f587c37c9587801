"""One set of scenarios, two transports (issue 11's contract suite, first step).

Each scenario is a sequence of inputs — events (as produced or rewritten),
raw bytes, redrive commands — and what must come out: per session its
``status`` (state, last seq), views equal to the offline fold of the events
it applied, and its dead letters by rule.  ``memory`` runs the scenarios
through the engine alone (no broker: part of the fast run); ``kafka`` runs
the same scenarios through a real ``Processor`` on the local broker.  A
scenario that passes on one and fails on the other is a bug in the loop,
not in the rules.

Barriers mirror an operator: a redrive is sent once the quarantine it names
is committed, and events after it once the command is.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from processor.codec import default_codec
from processor.config import ServiceConfig
from processor.core.events import Event
from processor.engine.commands import partition_of, redrive
from processor.offline import fold_events, session_output
from processor.service import clients
from processor.service.runner import Processor
from processor.service.views_reader import (
    materialize_views,
    offline_equivalent,
    read_dead_letters,
    session_fold_equivalent,
)
from tests.engine.kit import Harness, changed, session_log
from tests.service.conftest import Stack, as_json

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


# ------------------------------------------------------------------ broker


def _committed_to_end(config: ServiceConfig) -> bool:
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


def _barrier(config: ServiceConfig, errors: list[BaseException]) -> None:
    deadline = time.monotonic() + 120
    while not _committed_to_end(config):
        assert not errors, f"the processor died: {errors[0]!r}"
        assert time.monotonic() < deadline, "the processor did not commit everything"
        time.sleep(0.2)


@pytest.mark.kafka
def test_contract_on_the_broker(stack: Stack) -> None:
    cfg = stack.config
    assert cfg.partitions == PARTITIONS
    proc = Processor(cfg)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            proc.run()
        except BaseException as exc:  # named by the barrier
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    producer = stack.producer()
    try:
        for scenario in SCENARIOS:
            for step in scenario.steps:
                sid = _sid(scenario, step.sid)
                if isinstance(step, Ev):
                    producer.produce(
                        cfg.topics.events,
                        key=sid.encode(),
                        value=codec.encode_parsed_event(sid, step.event()),
                    )
                elif isinstance(step, Raw):
                    producer.produce(cfg.topics.events, key=sid.encode(), value=step.value)
                else:
                    assert producer.flush(30) == 0
                    _barrier(cfg, errors)  # the operator saw the quarantine
                    stack.produce_control(sid, redrive(sid, LOG[step.index].seq).encode())
                    _barrier(cfg, errors)  # ... and the command was taken
            assert producer.flush(30) == 0
        _barrier(cfg, errors)
    finally:
        proc.stop()
        thread.join(60)
    assert not errors, errors
    views = materialize_views(cfg)
    letters: dict[str, Counter[str]] = {}
    for d in read_dead_letters(cfg):
        letters.setdefault(d.session_id or "", Counter())[d.rule] += 1
    for scenario in SCENARIOS:
        _check(scenario, views, letters)
