"""``group_protocol = "auto"`` (issue 37): KIP-848 only where the broker's
group session timeout fits the failover budget, else classic, one line
saying which and why; a describe that fails falls back to classic.

Pure: the choice from described configs, the resolution with an admin
client that answers or fails, and the in-memory transport (classic).
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Any

import pytest

from processor.config import ServiceConfig
from processor.kafka import group_protocol
from processor.kafka.group_protocol import MAX_SESSION_TIMEOUT_MS, choose, resolve
from processor.service.loop.member_clients import with_group_protocol
from processor.telemetry.metrics import Metrics
from processor.testing.memory import MemoryBroker, MemoryTransport

BASE = ServiceConfig(
    bootstrap_servers="127.0.0.1:1", state_dir="none", group_id="g", group_protocol="auto"
)


def test_auto_is_the_default() -> None:
    """KIP-848 where the brokers allow a short session: failovers and rollouts
    wait least (BENCHMARKS.md "Failover")."""
    assert ServiceConfig().group_protocol == "auto"


def test_a_short_group_session_timeout_chooses_kip848() -> None:
    choice = choose(
        {"consumer.session.timeout.ms": "6000", "consumer.heartbeat.interval.ms": "500"}
    )
    assert (choice.protocol, choice.session_timeout_ms) == ("consumer", 6000)
    assert "6000 ms" in choice.reason


def test_a_broker_left_at_its_45_s_default_chooses_classic_naming_the_settings() -> None:
    choice = choose({"consumer.session.timeout.ms": "45000"})
    assert choice.protocol == "classic"
    assert "group.consumer.session.timeout.ms" in choice.reason
    assert "group.consumer.min.session.timeout.ms" in choice.reason
    edge = choose({"consumer.session.timeout.ms": str(MAX_SESSION_TIMEOUT_MS)})
    assert edge.protocol == "consumer"


def test_a_broker_without_kip848_group_configs_chooses_classic() -> None:
    assert choose({}).protocol == "classic"
    assert choose(None, "UNKNOWN_RESOURCE").protocol == "classic"
    assert choose({"consumer.session.timeout.ms": "x"}).protocol == "classic"


class _Entry:
    def __init__(self, value: str) -> None:
        self.value = value


class _Admin:
    """Answers DescribeConfigs with ``answer`` (an exception: fails with it)."""

    def __init__(self, answer: dict[str, str] | Exception) -> None:
        self.answer = answer
        self.calls = 0

    def describe_configs(self, resources: list[Any], request_timeout: float) -> dict[Any, Any]:
        self.calls += 1
        future: Future[Any] = Future()
        if isinstance(self.answer, Exception):
            future.set_exception(self.answer)
        else:
            future.set_result({k: _Entry(v) for k, v in self.answer.items()})
        return {resources[0]: future}

    def poll(self, timeout: float) -> int:
        return 0


def test_resolve_asks_once_and_logs_one_line(caplog: pytest.LogCaptureFixture) -> None:
    admin = _Admin({"consumer.session.timeout.ms": "6000"})
    with caplog.at_level(logging.INFO, logger=group_protocol.__name__):
        choice = resolve(BASE, admin)
    assert choice.protocol == "consumer" and admin.calls == 1
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "group 'g': protocol consumer (KIP-848: the broker's session timeout "
        "6000 ms, heartbeat ? ms)"
    ]


def test_a_failed_describe_falls_back_to_classic_with_a_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger=group_protocol.__name__):
        choice = resolve(BASE, _Admin(TimeoutError("no answer")))
    assert choice.protocol == "classic"
    assert "could not be read: TimeoutError: no answer" in caplog.records[0].getMessage()


def test_an_explicit_protocol_asks_nothing() -> None:
    admin = _Admin(RuntimeError("must not be asked"))
    for protocol in ("classic", "consumer"):
        config = BASE.with_overrides(group_protocol=protocol)
        assert resolve(config, admin).protocol == protocol
    assert admin.calls == 0


def test_the_in_memory_transport_runs_classic_and_the_metric_says_so() -> None:
    metrics = Metrics()
    config, _ = with_group_protocol(BASE, MemoryTransport(MemoryBroker(), BASE), metrics)
    assert config.group_protocol == "classic"
    assert b'processor_group_protocol{protocol="classic"} 1.0' in metrics.exposition()


def test_a_classic_only_override_makes_auto_run_classic_without_asking() -> None:
    admin = _Admin(RuntimeError("must not be asked"))
    config = BASE.with_overrides(kafka={"session.timeout.ms": "10000"})
    choice = resolve(config, admin)
    assert choice.protocol == "classic" and "session.timeout.ms" in choice.reason
    assert admin.calls == 0
