"""The zombie bound is derived from the processor's own loop, and the CLI shows history.

Pure tests: no broker.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from processor.cli import views as views_cli
from processor.client.views_reader import ViewRecord, ViewUpdate
from processor.config import ServiceConfig
from processor.service.partitions.restore import stable_bound_s


def test_transaction_timeout_is_sized_to_the_commit_interval_and_revoke_budget() -> None:
    cfg = ServiceConfig()
    assert cfg.effective_transaction_timeout_ms == 10_000 + 2 * 200 + 5_000
    slow = ServiceConfig(commit_interval_ms=2_000, revoke_budget_ms=30_000)
    assert slow.effective_transaction_timeout_ms == 30_000 + 4_000 + 5_000
    assert ServiceConfig(transaction_timeout_ms=7_000).effective_transaction_timeout_ms == 7_000


def test_restore_waits_at_most_the_zombie_bound() -> None:
    cfg = ServiceConfig()
    # transaction timeout + the broker's default abort check interval + margin
    assert stable_bound_s(cfg) == pytest.approx(15.4 + 10 + 30)
    assert stable_bound_s(ServiceConfig(restore_stable_wait_ms=0)) == 0
    assert stable_bound_s(ServiceConfig(restore_stable_wait_ms=5_000)) == 5


def test_views_follow_warns_about_a_view_going_back(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_follow(config: ServiceConfig, **kwargs: Any) -> Iterator[ViewUpdate]:
        yield ViewUpdate("s", "status", ViewRecord("status", 69, -1, {"state": "ok"}))
        yield ViewUpdate(
            "s", "status", ViewRecord("status", 49, -1, {"state": "quarantined"}), regressed_from=69
        )

    monkeypatch.setattr(views_cli, "follow_views", fake_follow)
    result = CliRunner().invoke(views_cli.views, ["--follow", "--stop-after", "1"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert '"regressedFrom":69' in lines[1] and '"asOfSeq":49' in lines[1]
    assert "s/status went back from asOfSeq 69 to 49" in result.stderr
    assert "1 update(s) went back in asOfSeq" in result.stderr


def test_a_fence_within_the_transaction_timeout_is_another_member_not_a_fault() -> None:
    """Replacing the producer would fence the newer member back (they would take
    turns until both budgets ran out): a fence within the timeout ends the process."""
    from confluent_kafka import KafkaError

    from processor.kafka.clients import session_timeout_s
    from processor.service.loop.runner import Processor

    proc = Processor(ServiceConfig(bootstrap_servers="127.0.0.1:1"))
    # within the transaction timeout and the session timeout (past the session
    # timeout the group may have dropped us: a fence is then a dead member's)
    timeout_s = min(
        proc.config.effective_transaction_timeout_ms / 1000, session_timeout_s(proc.config)
    )
    for code in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED):
        assert proc.txn.replace_producer(KafkaError(code), open_s=timeout_s / 2) is False
    assert proc.txn.producer is None  # nothing was replaced
    # a broker failing moments ago explains a fence (a coordinator failover):
    # then it is not taken for another member (the replacement path is the
    # fault suite's, it needs a cluster)
    proc.problems.error_cb(KafkaError(KafkaError._TRANSPORT, "Connect failed"))
    assert proc.problems.broker_trouble_at is not None
    assert proc.txn.fatal_budget.allow(KafkaError(KafkaError.INVALID_TXN_STATE))  # budget unspent


def test_the_duplicate_verdict_names_the_broker_error_it_rests_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A chaos run saw two members exit on this verdict under CPU starvation with
    no second member: the line must carry its evidence (which error, whether a
    producer of ours was replaced) so the next such run tells what fenced it."""
    from confluent_kafka import KafkaError

    from processor.service.loop.runner import Processor

    proc = Processor(ServiceConfig(bootstrap_servers="127.0.0.1:1"))
    err = KafkaError(
        KafkaError._FENCED, "Broker: Producer attempted an operation with an old epoch"
    )
    with caplog.at_level(logging.ERROR, logger="processor"):
        assert proc.txn.replace_producer(err, open_s=1.0) is False
    line = caplog.messages[-1]
    assert "old epoch" in line and "another member runs with instance id" in line
    assert "last replaced: never" in line


def test_a_revoke_commits_within_the_revoke_budget_the_timeout_was_sized_for() -> None:
    """The derived transaction timeout assumes a revoke's commit ends within
    revoke_budget_ms; its steps' timeouts shrink to what is left of it."""
    import time

    from processor.service.loop.runner import Processor

    proc = Processor(ServiceConfig(bootstrap_servers="127.0.0.1:1", revoke_budget_ms=2_000))
    assert proc.txn.timeout(60) == 60  # not revoking: the step's own timeout
    proc.txn.deadline = time.monotonic() + 2.0
    assert 0.1 <= proc.txn.timeout(60) <= 2.0
    assert proc.txn.timeout(0.5) == 0.5
    proc.txn.deadline = time.monotonic() - 1
    assert proc.txn.timeout(60) == 0.1  # spent: fail fast, abort, let the next owner restore


def test_a_fence_after_an_abort_that_never_ended_is_not_taken_for_another_member(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """abort_transaction timing out (a starved member, a slow coordinator) leaves the
    transaction to the coordinator, which aborts it at the timeout and bumps the
    epoch: the next transaction is fenced at once (open for ~0 s).  That fence is
    explained by our own abort, not by a second member with our instance id."""
    from typing import cast

    from confluent_kafka import KafkaError, KafkaException

    from processor.kafka.retry import FatalBudget, RetryWatch, observing
    from processor.kafka.transport import TxnProducer
    from processor.service.loop.runner import Processor

    class Starved:
        def abort_transaction(self, timeout: float = -1) -> None:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "abort timed out"))

    class Clock:
        now = 0.0

        def __call__(self) -> float:
            self.now += 50.0  # the retry deadline passes in three attempts
            return self.now

    proc = Processor(ServiceConfig(bootstrap_servers="127.0.0.1:1"))
    proc.clients.producer = cast(TxnProducer, Starved())
    with observing(RetryWatch(clock=Clock())):
        proc.txn.abort(set())
    fenced = KafkaError(
        KafkaError._FENCED, "Broker: Producer attempted an operation with an old epoch"
    )
    with caplog.at_level(logging.ERROR, logger="processor"):
        # no budget: past the verdict nothing is replaced (that needs a cluster)
        proc.txn.replace_producer(fenced, open_s=0.0, budget=FatalBudget(limit=0))
    assert not any("another member runs" in m for m in caplog.messages), caplog.messages
