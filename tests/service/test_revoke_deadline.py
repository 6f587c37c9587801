"""Every wait of a revoke ends by its deadline (``revoke_budget_ms``), in memory.

The derived transaction timeout assumes a revoke ends within the budget:
the abort of a failed revoke commit and the back-off between retried
transaction steps are cut by it too.  No wall clock is asserted: time is a
fake clock that each slow broker call advances by the timeout it was given
(a broker that answers only at the timeout) and each back-off by its sleep.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from processor.config import ServiceConfig
from processor.kafka import retry as retry_mod
from processor.kafka.client_errors import KafkaFatal
from processor.service.loop import runner as runner_mod
from processor.service.loop.runner import Processor
from processor.service.partitions import rebalance as rebalance_mod
from processor.service.txn import commit as commit_mod
from processor.service.txn import transactions as transactions_mod
from processor.telemetry.metrics import Metrics
from processor.testing.memory import MemoryBroker, MemoryProducer, MemoryTransport
from tests.service.running import RunningProcessor
from tests.service.test_loop_steps import CODEC, LOG, _Clock, _wait
from tests.service.test_loop_steps import _Transport as _LoopTransport

BUDGET_S = 10.0
CONFIG = ServiceConfig(
    partitions=1,
    topic_prefix="deadline",
    revoke_budget_ms=int(BUDGET_S * 1000),
    commit_interval_ms=600_000,
    max_batch_events=1000,  # nothing commits before the revoke
)
#: a retriable error that is neither abortable nor fatal (retried in place)
RETRIABLE = KafkaError(KafkaError.REQUEST_TIMED_OUT, "slow broker", retriable=True)
#: a transient error of the abort (retried by ``retry``)
TRANSIENT = KafkaError(KafkaError._TIMED_OUT, "slow broker")


class _Stalling(MemoryProducer):
    """Once ``armed``: ``commit_transaction`` and ``abort_transaction`` take
    their whole timeout (advancing the fake clock) and are recorded."""

    def __init__(self, broker: MemoryBroker, txn_id: str | None, clock: _Clock) -> None:
        super().__init__(broker, txn_id)
        self.clock = clock
        self.armed = False
        self.calls: list[tuple[str, float]] = []

    def _stall(self, step: str, timeout: float) -> None:
        if self.armed:
            self.calls.append((step, timeout))
            self.clock.advance(timeout)

    def commit_transaction(self, timeout: float = -1) -> None:
        self._stall("commit_transaction", timeout)
        super().commit_transaction(timeout)

    def abort_transaction(self, timeout: float = -1) -> None:
        self._stall("abort_transaction", timeout)
        super().abort_transaction(timeout)


class _Transport(_LoopTransport):
    """test_loop_steps' transport (a consumer that revokes when asked), with a
    producer that stalls."""

    stalling: _Stalling | None = None

    def output_producer(self, instance_id: str, problems: Any) -> MemoryProducer:
        txn_id = f"{self.config.group_id}-{instance_id}"
        self.stalling = _Stalling(self.broker, txn_id, self.clock)
        return self.stalling


def _fake_time(monkeypatch: pytest.MonkeyPatch, clock: _Clock) -> None:
    fake = SimpleNamespace(
        monotonic=clock.monotonic, perf_counter=time.perf_counter, sleep=clock.advance
    )
    for module in (commit_mod, rebalance_mod, retry_mod, transactions_mod):
        monkeypatch.setattr(module, "time", fake)
    monkeypatch.setattr(runner_mod, "GAUGE_EVERY_S", 3600.0)


def _committer(clock: _Clock) -> tuple[commit_mod.Committer, _Stalling]:
    """A Committer with an open transaction whose abort stalls and fails."""
    broker = MemoryBroker()
    broker.create_topics(CONFIG)
    proc = Processor(CONFIG, metrics=Metrics(), transport=MemoryTransport(broker, CONFIG))
    producer = _Stalling(broker, "deadline-txn", clock)
    producer.init_transactions()
    producer.begin_transaction()
    proc.clients.producer = producer
    broker.fail("abort_transaction", TRANSIENT, times=1000)
    producer.armed = True
    return proc.txn, producer


def test_an_abort_while_revoking_ends_by_the_revoke_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not 30 s per attempt plus 120 s of retries: what is left of the budget."""
    clock = _Clock()
    _fake_time(monkeypatch, clock)
    committer, producer = _committer(clock)
    began = clock.monotonic()
    committer.deadline = began + BUDGET_S
    committer.abort(set())
    assert producer.calls and producer.calls[0] == ("abort_transaction", BUDGET_S)
    assert clock.monotonic() - began <= BUDGET_S


def test_an_abort_after_the_revoke_deadline_makes_one_short_attempt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _Clock()
    _fake_time(monkeypatch, clock)
    committer, producer = _committer(clock)
    committer.deadline = clock.monotonic() - 1.0  # spent
    committer.abort(set())
    assert producer.calls == [("abort_transaction", 0.1)]


def test_an_abort_outside_a_revoke_keeps_its_long_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Outside a revoke nothing waits on the abort: 30 s attempts, retried."""
    clock = _Clock()
    _fake_time(monkeypatch, clock)
    committer, producer = _committer(clock)
    committer.abort(set())
    assert len(producer.calls) > 1
    assert all(call == ("abort_transaction", 30) for call in producer.calls)


def test_retrying_does_not_sleep_past_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A back-off that would end past the deadline raises the step's error at
    once (as after the last attempt: same classification)."""
    clock = _Clock()
    _fake_time(monkeypatch, clock)
    end = clock.monotonic() + 0.25
    attempts: list[float] = []

    def step() -> None:
        attempts.append(clock.monotonic())
        raise KafkaException(RETRIABLE)

    with pytest.raises(KafkaException) as info:
        transactions_mod.retrying(step, Metrics(), left=lambda: end - clock.monotonic())
    assert info.value.args[0] is RETRIABLE
    assert len(attempts) == 2  # slept 0.1 s; the 0.2 s back-off would end past 0.25
    assert clock.monotonic() <= end
    attempts.clear()
    with pytest.raises(KafkaException):  # no deadline: every attempt
        transactions_mod.retrying(step, Metrics())
    assert len(attempts) == 5


def test_a_revoke_whose_commit_keeps_failing_ends_within_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The revoke's commit_transaction takes the whole budget and fails
    retriably: no back-off and no further attempts past the deadline, and the
    abort that follows makes one short attempt (the next owner restores)."""
    clock = _Clock()
    _fake_time(monkeypatch, clock)
    broker = MemoryBroker()
    broker.create_topics(CONFIG)
    transport = _Transport(broker, CONFIG, clock)
    proc = Processor(CONFIG, metrics=Metrics(), transport=transport)
    for event in LOG[:5]:
        broker.produce(CONFIG.topics.events, b"s", CODEC.encode_parsed_event("s", event))
    running = RunningProcessor(proc)
    errors = running.errors
    try:
        _wait(
            lambda: proc.metrics.records_consumed._value.get() >= 5,
            errors,
            "the open batch is folded",
        )
        producer, consumer = transport.stalling, transport.consumer
        assert producer is not None and consumer is not None
        broker.fail("commit_transaction", RETRIABLE, times=5)
        producer.armed = True
        began = clock.monotonic()
        consumer.revoke = True
        _wait(lambda: proc.metrics.aborts._value.get() >= 1, errors, "the revoke aborted")
        _wait(lambda: proc.txn.deadline is None, errors, "the revoke ended")
    finally:
        running.stop()
    assert not running.thread.is_alive() and not errors, errors
    assert producer.calls == [("commit_transaction", BUDGET_S), ("abort_transaction", 0.1)]
    assert clock.monotonic() - began <= BUDGET_S + 0.1 + 1e-6
    assert proc.metrics.commits._value.get() == 0


class _SlowInit(_Stalling):
    """A new producer whose coordinator does not answer ``init_transactions``
    while ``armed``: each call takes its whole timeout and times out."""

    def init_transactions(self, timeout: float = -1) -> None:
        if self.armed:
            self.calls.append(("init_transactions", timeout))
            self.clock.advance(timeout)
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "coordinator not answering"))
        super().init_transactions(timeout)


def _replacing(clock: _Clock) -> tuple[commit_mod.Committer, list[_SlowInit]]:
    """A Committer whose transport hands out producers with a slow init."""
    committer, _ = _committer(clock)
    made: list[_SlowInit] = []

    def output_producer(instance_id: str, problems: Any) -> MemoryProducer:
        made.append(_SlowInit(committer.clients.transport.broker, "deadline-txn", clock))  # type: ignore[attr-defined]
        made[-1].armed = True
        return made[-1]

    committer.clients.transport.output_producer = output_producer  # type: ignore[method-assign]
    committer.problems.broker_trouble_at = clock.monotonic()  # the fence is explained
    return committer, made


FENCE = KafkaError(KafkaError._FENCED, "fenced", fatal=True)


def test_a_producer_replaced_while_revoking_is_initialised_within_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fatal error during a revoke's commit gets a new producer; its
    ``init_transactions`` is cut by the revoke budget (not 120 s of 2 s slices,
    which held the group's rebalance and then ended the run), and finished
    before the next transaction, out of the rebalance."""
    clock = _Clock()
    _fake_time(monkeypatch, clock)
    committer, made = _replacing(clock)
    began = clock.monotonic()
    committer.deadline = began + BUDGET_S
    assert committer.replace_producer(FENCE, open_s=1.0)
    assert clock.monotonic() - began <= BUDGET_S + 0.1 + 1e-6
    assert committer.init_pending and committer.producer is made[0]
    assert all(name == "init_transactions" for name, _ in made[0].calls)
    # the abort that follows does not call into the uninitialised producer
    made[0].calls.clear()
    committer.abort(set())
    assert made[0].calls == []
    committer.deadline = None  # the revoke ended; the coordinator answers again
    made[0].armed = False
    committer.commit()  # nothing open: no transaction, the init stays pending
    assert committer.init_pending
    assert committer._initialised() and not committer.init_pending
    made[0].begin_transaction()  # initialised: a transaction can begin


def test_a_producer_replaced_outside_a_revoke_still_ends_the_run_when_init_never_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Outside a revoke nothing is cut: the init keeps trying for its whole
    deadline and then ends the run with one line."""
    clock = _Clock()
    _fake_time(monkeypatch, clock)
    committer, made = _replacing(clock)
    began = clock.monotonic()
    with pytest.raises(KafkaFatal, match="cannot initialise transactions"):
        committer.replace_producer(FENCE, open_s=1.0)
    assert clock.monotonic() - began >= retry_mod.DEFAULT_DEADLINE_S
    assert all(timeout <= transactions_mod.INIT_SLICE_S for _, timeout in made[0].calls)
