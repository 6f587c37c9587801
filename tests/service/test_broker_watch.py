"""BrokerWatch: /readyz goes 503 while no broker answers past the bound, and back.

Pure (an injected probe and clock); the real-broker case is in
tests/faults/test_brokers_down.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from processor.kafka.client_errors import ClientProblems
from processor.service.ops.broker_watch import BrokerWatch
from processor.service.ops.http import readiness
from processor.telemetry.metrics import Metrics


class Cluster:
    def __init__(self) -> None:
        self.up = True
        self.probes = 0

    def probe(self) -> None:
        self.probes += 1
        if not self.up:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "down"))


@pytest.fixture
def setup() -> tuple[ClientProblems, Metrics, Cluster, list[float], BrokerWatch]:
    problems, metrics, cluster, now = ClientProblems(), Metrics(), Cluster(), [1000.0]
    metrics.health.ready = True
    watch = BrokerWatch(
        problems, metrics, cluster.probe, bound_s=30, every_s=5, clock=lambda: now[0]
    )
    return problems, metrics, cluster, now, watch


def test_no_probe_while_no_broker_went_down(setup: Any) -> None:
    _problems, metrics, cluster, now, watch = setup
    for _ in range(100):
        now[0] += 1
        watch.tick()
    assert cluster.probes == 0 and readiness(metrics)[0] == 200


def test_all_brokers_down_past_the_bound_is_not_ready_until_one_answers(setup: Any) -> None:
    problems, metrics, cluster, now, watch = setup
    cluster.up = False
    problems.error_cb(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    problems.brokers_down_at = now[0]
    for _ in range(29):  # within the bound: still ready (a broker restart is normal)
        now[0] += 1
        watch.tick()
    assert readiness(metrics)[0] == 200
    assert 5 <= cluster.probes <= 6  # one probe per every_s, not per loop turn
    now[0] += 2
    watch.tick()
    code, body = readiness(metrics)
    assert code == 503 and b"no broker answers for 3" in body and b"_ALL_BROKERS_DOWN" in body
    assert metrics.degraded_gauge._value.get() == 1
    cluster.up = True
    now[0] += 5
    watch.tick()
    assert readiness(metrics) == (200, b"ready\n") and problems.brokers_down_at is None
    assert metrics.degraded_gauge._value.get() == 0


def test_a_broker_back_within_the_bound_never_reports(setup: Any) -> None:
    problems, metrics, cluster, now, watch = setup
    cluster.up = False
    problems.brokers_down_at = now[0]
    now[0] += 10
    watch.tick()
    cluster.up = True
    now[0] += 5
    watch.tick()
    assert problems.brokers_down_at is None and metrics.health.unreachable is None
    now[0] += 100
    watch.tick()
    assert readiness(metrics)[0] == 200
