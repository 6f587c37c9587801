"""Issue 39: the pieces of a bounded stop, without a broker (stopping.py)."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import KafkaError, KafkaException

from processor.kafka import client_count
from processor.kafka.retry import GaveUp, retry
from processor.service.loop.stopping import EXIT_UNCOMMITTED, STOPPING, Watchdog
from processor.service.txn import transactions
from processor.telemetry.metrics import Metrics


def test_issue39_watchdog_ends_the_process_at_the_bound(capsys: pytest.CaptureFixture[str]) -> None:
    codes: list[int] = []
    done = threading.Event()

    def exit(code: int) -> None:
        codes.append(code)
        done.set()

    dog = Watchdog(0.05, lambda: 7, exit=exit)
    dog.arm()
    dog.arm()  # a second signal does not start a second count
    assert done.wait(30)
    assert codes == [EXIT_UNCOMMITTED]
    line = capsys.readouterr().err.strip()
    assert "nothing of the open batch (7 events) was committed" in line
    assert "0.05 s stop bound" in line


def test_issue39_a_retry_gives_up_at_once_when_stopping() -> None:
    calls = 0

    def failing() -> None:
        nonlocal calls
        calls += 1
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker gone"))

    STOPPING.set()
    try:
        with pytest.raises(GaveUp):
            retry(failing, "probe", deadline_s=600)
    finally:
        STOPPING.clear()
    assert calls == 1


def test_issue39_clients_created_are_a_metric() -> None:
    before = client_count.snapshot().get("test_kind", 0)
    client_count.created("test_kind")
    text = Metrics().exposition().decode()
    assert f'processor_kafka_clients_created_total{{kind="test_kind"}} {before + 1}.0' in text


def test_issue39_a_transaction_step_is_not_retried_when_stopping() -> None:
    calls = 0

    def step() -> None:
        nonlocal calls
        calls += 1
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "coordinator gone", retriable=True))

    STOPPING.set()
    try:
        with pytest.raises(KafkaException):
            transactions.retrying(step, Metrics())
    finally:
        STOPPING.clear()
    assert calls == 1
