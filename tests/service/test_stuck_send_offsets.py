"""A ``send_offsets_to_transaction`` that never returns (in memory).

librdkafka 2.16 can wait for good for a group coordinator that went away
(issues 5456, 5511): the fault suite's chaos test (compiled, loaded box) saw a
member's loop wait on it for minutes after the coordinator's broker was
SIGKILLed, its partition's lag growing.  The committer gives such a call up
``hang_grace_s`` past its own timeout, replaces the producer (which fences the
stuck one) and refolds the batch.  Nothing wall-clock is asserted: the test
only needs the commit to happen while the stuck call still hangs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError

from processor.codec import default_codec
from processor.config import ServiceConfig
from processor.kafka.coordinators import TXN_STATE_TOPIC
from processor.service.loop.runner import Processor
from processor.service.txn import stuck_probe
from processor.service.txn.txn_helper import HangingBudget, HelperThread, StuckCall
from processor.telemetry.metrics import Metrics
from processor.testing.memory import MemoryBroker, MemoryProducer, MemoryTransport
from tests.engine.kit import session_log
from tests.service.running import RunningProcessor, until

CODEC = default_codec()
LOG = session_log(12, seed=3)
CONFIG = ServiceConfig(partitions=1, topic_prefix="stuck", commit_interval_ms=50)


def test_a_send_offsets_stuck_past_its_timeout_is_given_up_and_the_batch_refolded() -> None:
    broker = MemoryBroker()
    broker.create_topics(CONFIG)
    transport = MemoryTransport(broker, CONFIG)
    proc = Processor(CONFIG, metrics=Metrics(), transport=transport)
    proc.txn.offsets_timeout_s = 0.2
    proc.txn.helper.hang_grace_s = 0.2
    # broker faults spent the budget for fatal errors: a stuck call has its own
    while proc.txn.fatal_budget.allow(KafkaError(KafkaError.INVALID_TXN_STATE)):
        pass
    entered, release = broker.hold("send_offsets_to_transaction")
    for event in LOG:
        broker.produce(CONFIG.topics.events, b"s", CODEC.encode_parsed_event("s", event))
    running = RunningProcessor(proc)
    errors = running.errors
    try:
        until(entered.is_set, errors, "the first batch's offsets are being sent")
        stuck = proc.txn.producer
        until(
            lambda: proc.metrics.commits._value.get() >= 1,
            errors,
            "a batch commits while the first send_offsets_to_transaction still hangs",
        )
        assert not release.is_set()
        assert proc.txn.producer is not stuck  # replaced: it fenced the stuck one
        assert proc.metrics.aborts._value.get() >= 1  # the batch was refolded
        assert proc.metrics.registry.get_sample_value("processor_txn_calls_hanging") == 1
    finally:
        release.set()
    until(lambda: proc.txn.helper.hanging() == 0, errors, "the stuck call returns once released")
    running.stop()
    assert not running.thread.is_alive() and not errors, errors
    # the whole log committed through the new producer
    assert broker.group_offsets[(CONFIG.group_id, CONFIG.topics.events, 0)] == len(LOG)


def test_a_process_with_a_given_up_helper_still_exits() -> None:
    """The stuck call never returns: its thread must not keep the process from
    ending at shutdown (a ``ThreadPoolExecutor`` worker is joined at exit)."""
    script = (
        "import threading\n"
        "from processor.service.txn.txn_helper import Helper\n"
        "helper = Helper('txn-helper')\n"
        "helper.submit(threading.Event().wait)\n"
        "helper.shutdown(wait=False)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, timeout=60, check=False)
    assert done.returncode == 0


def test_a_commit_gives_the_fatal_budget_back() -> None:
    """Replacements are bounded per run of failures, not per run of the process:
    a member that committed since its last replacement rides out the next
    coordinator failover too (a failover storm ended every member on its fourth
    replacement)."""
    broker = MemoryBroker()
    broker.create_topics(CONFIG)
    proc = Processor(CONFIG, metrics=Metrics(), transport=MemoryTransport(broker, CONFIG))
    broken = KafkaError(KafkaError.INVALID_TXN_STATE, fatal=True)
    while proc.txn.fatal_budget.allow(broken):
        pass
    for event in LOG:
        broker.produce(CONFIG.topics.events, b"s", CODEC.encode_parsed_event("s", event))
    running = RunningProcessor(proc)
    errors = running.errors
    until(lambda: proc.metrics.commits._value.get() >= 1, errors, "a batch commits")
    running.stop()
    assert not errors, errors
    assert proc.txn.fatal_budget.allow(broken)


def _give_up(helper: HelperThread, hold: threading.Event) -> None:
    """A watched call on ``helper`` that hangs until ``hold`` is set, given up."""
    entered = threading.Event()

    def call() -> None:
        helper.watch(0.0)
        entered.set()
        hold.wait()

    sent = helper.submit(call)
    assert entered.wait(30)
    with pytest.raises(StuckCall):
        helper.await_watched(sent, "send_offsets_to_transaction")


def test_the_stuck_budget_counts_the_given_up_calls_still_hanging() -> None:
    """Each call given up holds a thread and a producer until librdkafka lets it
    return: at most ``limit`` may hang at once, and one that returns gives its
    place back, so a broker fault every 30 s (each leaving a stuck call that
    returns once the broker is back) never ends the member; three replacements
    per five minutes, never given back, ended every member of a lab run on the
    fourth such fault."""
    helper = HelperThread()
    helper.hang_grace_s = 0.0
    budget = HangingBudget(helper, limit=3)
    broken = KafkaError(KafkaError._TIMED_OUT, fatal=True)
    holds = [threading.Event() for _ in range(4)]
    try:
        for n, hold in enumerate(holds[:3], start=1):
            assert budget.spare() == (n <= 2)  # a guess keeps room for a certain one
            _give_up(helper, hold)
            assert helper.hanging() == n and budget.allow(broken)
        _give_up(helper, holds[3])
        assert helper.hanging() == 4 and not budget.allow(broken)  # one too many
        holds[0].set()  # the first stuck call returns at last
        deadline = time.monotonic() + 30
        while helper.hanging() > 3:
            assert time.monotonic() < deadline, "the returned call's thread never ended"
            time.sleep(0.01)
        assert budget.allow(broken)
        denied = KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, fatal=True)
        assert not budget.allow(denied)  # a cause that stays is never replaced
    finally:
        for hold in holds:
            hold.set()
    helper.shutdown()


def _stuck_after_a_broker_fault(
    trouble: bool, txn_coordinator: str = "", txn_now_at: str = ""
) -> tuple[Processor, RunningProcessor, Callable[[], None]]:
    """A run whose first ``send_offsets_to_transaction`` is held.  ``trouble``: a
    broker went away moments ago (client_errors.py records it); ``txn_coordinator``:
    it held the producer's transaction coordinator, ``"back"`` before the run's
    ``init_transactions`` answered, ``"away"`` since, ``"unpolled"`` since and
    not yet handed to ``error_cb`` (librdkafka's queue: until the producer is
    polled).  ``txn_now_at``: the broker (``host:port``) the cluster's metadata
    names for the transaction coordinator from then on."""
    broker = MemoryBroker()
    broker.create_topics(CONFIG)
    proc = Processor(CONFIG, metrics=Metrics(), transport=MemoryTransport(broker, CONFIG))
    proc.txn.offsets_timeout_s = 60.0  # the call's own timeout never ends the wait here
    proc.txn.helper.early_after_s = 0.2
    lost = KafkaError(KafkaError._TRANSPORT, "TxnCoordinator: b1:9092: Connect failed: refused")
    if txn_coordinator == "back":
        proc.problems.error_cb(lost)
    entered, release = broker.hold("send_offsets_to_transaction")
    for event in LOG:
        broker.produce(CONFIG.topics.events, b"s", CODEC.encode_parsed_event("s", event))
    running = RunningProcessor(proc)
    until(entered.is_set, running.errors, "the first batch's offsets are being sent")
    if txn_now_at:
        consumer = proc.txn.consumer
        assert consumer is not None
        host, port = txn_now_at.split(":")
        answer = _metadata(host, int(port))
        consumer.list_topics = lambda topic=None, timeout=-1: answer  # type: ignore[method-assign]
    if txn_coordinator == "away":
        proc.problems.error_cb(lost)
    if txn_coordinator == "unpolled":
        producer = proc.txn.producer
        assert isinstance(producer, MemoryProducer)
        producer.report(lost)
    if trouble:
        proc.problems.error_cb(KafkaError(KafkaError._TRANSPORT, "GroupCoordinator: b1: refused"))
    return proc, running, release.set


def _metadata(host: str, port: int) -> SimpleNamespace:
    """A ``list_topics`` answer whose one broker leads every transaction state partition."""
    partitions = {p: SimpleNamespace(id=p, leader=7) for p in range(50)}
    return SimpleNamespace(
        brokers={7: SimpleNamespace(id=7, host=host, port=port)},
        topics={TXN_STATE_TOPIC: SimpleNamespace(error=None, partitions=partitions)},
    )


def _given_up_early(trouble: bool, txn_coordinator: str = "", txn_now_at: str = "") -> None:
    """The held call is given up long before its 60 s timeout and the batch refolded."""
    proc, running, release = _stuck_after_a_broker_fault(trouble, txn_coordinator, txn_now_at)
    try:
        until(
            lambda: proc.metrics.commits._value.get() >= 1,
            running.errors,
            "a batch commits long before the stuck call's 60 s timeout",
        )
        assert proc.metrics.aborts._value.get() >= 1  # the batch was refolded
    finally:
        release()
    running.stop()
    assert not running.errors, running.errors


def test_after_a_broker_fault_a_call_stuck_while_the_coordinator_answers_is_given_up_early() -> (
    None
):
    """librdkafka 2.16's producer keeps waiting for a coordinator it cached after
    the coordinator moved (issue 5511); the consumer's own coordinator answering
    says it moved, and a new producer finds it at once."""
    _given_up_early(trouble=True)


def _held_until_released(trouble: bool, txn_coordinator: str = "", txn_now_at: str = "") -> None:
    """The held call is not given up early: no commit, no abort, until released."""
    proc, running, release = _stuck_after_a_broker_fault(trouble, txn_coordinator, txn_now_at)
    try:
        time.sleep(1.5)  # many probe rounds past early_after_s
        assert proc.metrics.commits._value.get() == 0
        assert proc.metrics.aborts._value.get() == 0
    finally:
        release()
    until(
        lambda: proc.metrics.commits._value.get() >= 1, running.errors, "it commits once released"
    )
    running.stop()
    assert not running.errors, running.errors


def test_without_a_broker_fault_a_slow_call_is_not_given_up_early() -> None:
    """A slow call on a healthy cluster is not replaced on a guess: each
    replacement leaves a thread and a client behind (the stuck budget)."""
    _held_until_released(trouble=False)


def test_a_call_waiting_for_a_transaction_coordinator_that_went_away_is_not_given_up_early() -> (
    None
):
    """Its first half (AddOffsetsToTxn) waits for the transaction coordinator
    until the controller moves it, and a new producer's init would wait for
    it too: only the call's own timeout ends that wait."""
    _held_until_released(trouble=True, txn_coordinator="away")


def test_a_transaction_coordinator_lost_during_the_call_is_seen_before_the_loop_polls() -> None:
    """Its connection's failure waits in the producer's queue: the probe polls
    the producer before judging (a failover run replaced every member's
    producer while their transaction coordinator was the broker killed)."""
    _held_until_released(trouble=True, txn_coordinator="unpolled")


def test_a_transaction_coordinator_that_answered_since_its_fault_does_not_hold_the_judgement() -> (
    None
):
    """A new producer's init answered after the transaction coordinator's
    connection failed: the call now waits on the group coordinator it cached
    (a CI run held a member 25 s: two stuck calls in a row, 12 s each)."""
    _given_up_early(trouble=True, txn_coordinator="back")


def test_a_transaction_coordinator_still_named_on_the_lost_broker_holds_the_judgement() -> None:
    """The metadata still names the broker whose connection failed: the
    controller has not moved it yet (``broker.session.timeout.ms``)."""
    _held_until_released(trouble=True, txn_coordinator="away", txn_now_at="b1:9092")


def test_a_transaction_coordinator_the_controller_moved_no_longer_holds_the_judgement() -> None:
    """The metadata names another broker: librdkafka finds it within 0.5 s, so a
    call still waiting waits on the group coordinator it cached (one broker held
    both; such calls waited for their timeout, 12 s)."""
    _given_up_early(trouble=True, txn_coordinator="away", txn_now_at="b2:9092")


def test_a_transaction_coordinator_trouble_older_than_a_move_no_longer_holds_the_judgement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever the metadata says (none here: the memory broker has no
    transaction state topic), the controller has moved it by then."""
    monkeypatch.setattr(stuck_probe, "TXN_MOVED_S", 0.3)
    _given_up_early(trouble=True, txn_coordinator="away")
