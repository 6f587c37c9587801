"""The loop's periodic tick and a revoke meeting an overlapped commit (in memory).

No wall clock is asserted: the revoke's time is a fake clock that the
transport's calls advance by the timeouts they were given (a broker that
answers each slow call only at its timeout).
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from processor.codec import default_codec
from processor.config import ServiceConfig
from processor.service.loop import runner as runner_mod
from processor.service.loop.runner import Processor
from processor.service.partitions import rebalance as rebalance_mod
from processor.service.txn import commit as commit_mod
from processor.telemetry.metrics import Metrics
from processor.testing.memory import MemoryBroker, MemoryConsumer, MemoryProducer, MemoryTransport
from tests.engine.kit import session_log
from tests.service.running import RunningProcessor

CODEC = default_codec()
LOG = session_log(20, seed=5)
BUDGET_S = 10.0
CONFIG = ServiceConfig(
    partitions=1,
    topic_prefix="steps",
    revoke_budget_ms=int(BUDGET_S * 1000),
    commit_interval_ms=600_000,  # batches close when full only
    max_batch_events=8,
)


def _produce(broker: MemoryBroker, start: int, end: int) -> None:
    for event in LOG[start:end]:
        broker.produce(CONFIG.topics.events, b"s", CODEC.encode_parsed_event("s", event))


def _wait(done: Any, errors: list[BaseException], what: str) -> None:
    deadline = time.monotonic() + 60
    while not done():
        assert not errors, errors
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


# ------------------------------------------------------------------ the tick


def test_the_gauge_tick_evicts_once_when_it_settles_a_commit() -> None:
    """The 5 s tick settles a commit in flight; its after-commit work evicts and
    sets the gauges, and the tick must not evict a second time."""
    broker = MemoryBroker()
    broker.create_topics(CONFIG)
    proc = Processor(CONFIG, metrics=Metrics(), transport=MemoryTransport(broker, CONFIG))
    evictions: list[float] = []
    evict = proc._evict  # (the Processor's own: the compiled Engine refuses patching)

    def counted() -> None:
        evictions.append(time.monotonic())
        evict()

    proc._evict = counted  # type: ignore[method-assign]
    proc.heap.committed = lambda: None  # type: ignore[method-assign]
    proc.txn._fresh = True  # a commit settled since the loop last looked
    proc._tick()
    assert len(evictions) == 1
    proc._tick()  # nothing committed: the tick evicts by itself
    assert len(evictions) == 2


def test_the_heap_settle_does_not_walk_the_folded_batch_s_messages() -> None:
    """The consumed messages of a folded batch are let go before the next heap
    settle: they are garbage once folded, and a settle that finds them alive
    walks and freezes every one (5,000 per batch: a fifth of the settle)."""
    import gc

    from processor.service.loop.heap import HeapPolicy
    from processor.testing.memory import MemoryMessage

    broker = MemoryBroker()
    broker.create_topics(CONFIG)
    _produce(broker, 0, 16)  # two full batches
    proc = Processor(CONFIG, metrics=Metrics(), transport=MemoryTransport(broker, CONFIG))
    seen: list[int] = []

    class Watched(HeapPolicy):
        def committed(self) -> None:
            events = CONFIG.topics.events  # (a delivery report waits for its commit)
            consumed = (o for o in gc.get_objects() if isinstance(o, MemoryMessage))
            seen.append(sum(m.topic() == events for m in consumed))
            super().committed()

    proc.heap = Watched()
    proc.run(until_offsets={0: 16}, max_idle_s=10)
    assert len(seen) >= 2  # batches of 8: settles between folds
    assert seen == [0] * len(seen)


# ------------------------------------------------------------------ a revoke


class _Clock:
    def __init__(self) -> None:
        self.now = time.monotonic()
        self.lock = threading.Lock()

    def monotonic(self) -> float:
        with self.lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self.lock:
            self.now += seconds


class _SlowProducer(MemoryProducer):
    """Records the timed calls that end after the revoke began; while ``slow``
    (the in-flight transaction), a call takes its whole timeout."""

    def __init__(self, broker: MemoryBroker, txn_id: str | None, clock: _Clock) -> None:
        super().__init__(broker, txn_id)
        self.clock = clock
        self.slow = True
        self.revoking = threading.Event()  # set by the test once the revoke began
        self.calls: list[tuple[str, float, bool]] = []  # (step, timeout, slow)

    def _timed(self, step: str, timeout: float) -> None:
        if not self.revoking.is_set():  # before the revoke: not what is bounded
            return
        slow = self.slow
        self.calls.append((step, timeout, slow))
        if slow:
            self.clock.advance(timeout)

    def begin_transaction(self) -> None:
        if self.revoking.is_set():  # the revoke's own transaction: the broker answers
            self.slow = False
        super().begin_transaction()

    def send_offsets_to_transaction(
        self, positions: Any, group_metadata: Any, timeout: float = -1
    ) -> None:
        super().send_offsets_to_transaction(positions, group_metadata, timeout)
        self._timed("send_offsets_to_transaction", timeout)

    def commit_transaction(self, timeout: float = -1) -> None:
        super().commit_transaction(timeout)  # held by the test first
        self._timed("commit_transaction", timeout)

    def flush(self, timeout: float = -1) -> int:
        self._timed("flush", timeout)
        return 0


class _RevokingConsumer(MemoryConsumer):
    """Revokes its partitions at the next consume once asked (a rebalance)."""

    revoke = False

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        if self.revoke and self._owned:
            self.revoke = False
            owned, self._owned = list(self._owned), []
            on_revoke = self._callbacks.get("revoke")
            assert on_revoke is not None
            on_revoke(self, owned)
            return []
        return super().consume(num_messages, timeout)


class _Transport(MemoryTransport):
    def __init__(self, broker: MemoryBroker, config: ServiceConfig, clock: _Clock) -> None:
        super().__init__(broker, config)
        self.clock = clock
        self.consumer: _RevokingConsumer | None = None
        self.producer: _SlowProducer | None = None

    def group_consumer(self, instance_id: str, problems: Any) -> MemoryConsumer:
        self.consumer = _RevokingConsumer(self.broker, self.config.group_id, eof=False)
        return self.consumer

    def output_producer(self, instance_id: str, problems: Any) -> MemoryProducer:
        txn_id = f"{self.config.group_id}-{instance_id}"
        self.producer = _SlowProducer(self.broker, txn_id, self.clock)
        return self.producer


def test_a_revoke_waits_for_the_in_flight_commit_within_half_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A revoke meeting an overlapped commit: the in-flight commit's steps end
    within the first half of ``revoke_budget_ms`` (each was capped at half the
    budget), the revoke's own commit gets the rest (down to 0.1 s a step), and
    the whole revoke stays within the budget the transaction timeout assumes."""
    clock = _Clock()
    fake = SimpleNamespace(
        monotonic=clock.monotonic, perf_counter=time.perf_counter, sleep=time.sleep
    )
    monkeypatch.setattr(commit_mod, "time", fake)
    monkeypatch.setattr(rebalance_mod, "time", fake)
    monkeypatch.setattr(runner_mod, "GAUGE_EVERY_S", 3600.0)  # no tick settles it early
    broker = MemoryBroker()
    broker.create_topics(CONFIG)
    transport = _Transport(broker, CONFIG, clock)
    proc = Processor(CONFIG, metrics=Metrics(), transport=transport)
    entered, release = broker.hold("commit_transaction")
    _produce(broker, 0, 8)  # a full batch: committed with overlap, held
    running = RunningProcessor(proc)
    errors = running.errors
    try:
        _wait(entered.is_set, errors, "the first batch's commit is in flight")
        _produce(broker, 8, 11)  # the open batch the revoke commits
        _wait(
            lambda: proc.metrics.records_consumed._value.get() >= 11,
            errors,
            "the next batch is folded while the commit is held",
        )
        producer, consumer = transport.producer, transport.consumer
        assert producer is not None and consumer is not None
        producer.revoking.set()
        consumer.revoke = True
        _wait(lambda: proc.txn.deadline is not None, errors, "the revoke began")
        deadline = proc.txn.deadline
        assert deadline is not None
        began = deadline - BUDGET_S
    finally:
        release.set()
    _wait(lambda: proc.metrics.commits._value.get() >= 2, errors, "both batches commit")
    running.stop()
    assert not running.thread.is_alive() and not errors, errors
    calls = producer.calls
    in_flight = [c for c in calls if c[2]]
    own = [c for c in calls if not c[2]]
    # the held commit_transaction was given half the budget before the revoke
    # began; every in-flight step after it is cut to what is left of that half
    assert in_flight[0] == ("commit_transaction", BUDGET_S / 2, True)
    assert sum(t for _, t, _ in in_flight) <= BUDGET_S / 2 + 0.1 * (len(in_flight) - 1) + 1e-6
    # the revoke's own commit: its transaction steps get the second half
    own_commit = [t for step, t, _ in own if step == "commit_transaction"]
    assert own_commit and own_commit[0] >= BUDGET_S / 2 - 0.1 * len(in_flight) - 1e-6
    # and the revoke as a whole (the fake clock only moves in the slow calls)
    assert clock.monotonic() - began <= BUDGET_S + 0.1 * len(calls)


# ------------------------------------------------------------------ a due batch


def _batches(metrics: Metrics) -> tuple[float, float]:
    """(transactions committed, events in them) from the batch size histogram."""
    samples = {s.name: s.value for m in metrics.batch_events.collect() for s in m.samples}
    return samples["processor_batch_events_count"], samples["processor_batch_events_sum"]


def test_a_due_batch_keeps_folding_while_the_previous_commit_runs() -> None:
    """A batch due while its predecessor's commit is still in flight could not
    begin its transaction sooner; the loop keeps folding instead of blocking on
    that commit, so a record arriving meanwhile joins this batch rather than
    waiting for the next transaction (a whole commit more: the latency tail)."""
    config = ServiceConfig(partitions=1, topic_prefix="due", commit_interval_ms=1)
    broker = MemoryBroker()
    broker.create_topics(config)
    proc = Processor(config, metrics=Metrics(), transport=MemoryTransport(broker, config))
    consumed = proc.metrics.records_consumed._value.get
    entered, release = broker.hold("commit_transaction")

    def produce(seq: int) -> None:
        broker.produce(config.topics.events, b"s", CODEC.encode_parsed_event("s", LOG[seq]))

    produce(0)
    running = RunningProcessor(proc)
    errors = running.errors
    try:
        _wait(entered.is_set, errors, "the first batch's commit is in flight")
        produce(1)  # the next batch: due at once, its predecessor held
        _wait(lambda: consumed() >= 2, errors, "the second batch is folded")
        produce(2)
        deadline = time.monotonic() + 10
        while consumed() < 3 and time.monotonic() < deadline and not errors:
            time.sleep(0.01)
        assert consumed() == 3, "a record arriving while the due batch waits is not folded"
    finally:
        release.set()
    _wait(lambda: _batches(proc.metrics)[1] >= 3, errors, "every record commits")
    running.stop()
    assert not running.thread.is_alive() and not errors, errors
    assert _batches(proc.metrics) == (2, 3)  # [0], then [1, 2] together


def _backlog_batches(monkeypatch: pytest.MonkeyPatch, **overrides: Any) -> tuple[float, float]:
    """(transactions, events) for a backlog of 12 records folded 5 per consume, with
    a 1 ms commit interval: every batch is due as soon as its first consume is folded."""
    monkeypatch.setattr(runner_mod, "CONSUME_AT_MOST", 5)
    config = ServiceConfig(
        partitions=1, topic_prefix="behind", commit_interval_ms=1, max_batch_events=1_000
    ).with_overrides(**overrides)
    broker = MemoryBroker()
    broker.create_topics(config)
    for event in LOG[:12]:  # there before the member starts: it is behind
        broker.produce(config.topics.events, b"s", CODEC.encode_parsed_event("s", event))
    proc = Processor(config, metrics=Metrics(), transport=MemoryTransport(broker, config))
    running = RunningProcessor(proc)
    _wait(lambda: _batches(proc.metrics)[1] >= 12, running.errors, "the backlog commits")
    running.stop()
    assert not running.thread.is_alive() and not running.errors, running.errors
    return _batches(proc.metrics)


def test_a_member_behind_folds_its_backlog_into_one_transaction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While consume calls come back full the records are late already: a due batch
    keeps folding (up to max_batch_events) instead of committing every interval,
    so each session's views and checkpoint are produced once for the backlog."""
    assert _backlog_batches(monkeypatch) == (1, 12)  # full, full, then 2: one batch


def test_catching_up_stops_at_the_state_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sessions are evicted only after a commit: past the state budget a due batch
    commits even while the member is behind."""
    commits, events = _backlog_batches(monkeypatch, state_budget_bytes=1)
    assert events == 12 and commits >= 2


def test_catching_up_stops_at_max_batch_events(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _backlog_batches(monkeypatch, max_batch_events=5) == (3, 12)  # 5, 5, 2
