"""How many Kafka clients this process has created, by kind.

A member that waits for brokers that do not answer must not pile up clients
(each one a librdkafka instance with its own threads and connection
attempts): one that made a new admin client per watch tick was found with 78
after a 45-minute outage.  Every factory in ``clients.py`` counts here, and
``processor_kafka_clients_created_total{kind}`` exposes the count, so
"clients stay bounded" is something an operator (and a test) can read.

Process-wide, like the clients themselves; each :class:`Metrics` registry
exposes the same numbers.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

_lock = threading.Lock()
_created: dict[str, int] = {}


def created(kind: str) -> None:
    """One more client of ``kind`` (a bounded set: the factory names it)."""
    with _lock:
        _created[kind] = _created.get(kind, 0) + 1


def snapshot() -> dict[str, int]:
    with _lock:
        return dict(_created)


class CreatedCollector(Collector):
    """``processor_kafka_clients_created_total{kind}`` for a registry."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "processor_kafka_clients_created",
            "Kafka clients (librdkafka instances) this process created, by kind",
            labels=["kind"],
        )
        for kind, count in sorted(snapshot().items()):
            family.add_metric([kind], count)
        yield family
