"""A sharing table that reached its bound shows on ``/metrics``.

Past its bound a table turns values away (they stay copies: memory per held
session, never correctness); an operator sees it as
``processor_shared_table_full_total{table}`` growing, and each table's size
as ``processor_shared_values{table}``.
"""

from __future__ import annotations

from processor.core.sharing import BoundedTable, tables
from processor.telemetry.metrics import Metrics
from processor.testing.memory import MemoryBroker
from tests.service.test_memory_transport import CONFIG, Loop, _committed, _produce, _wait


def _sample(metrics: Metrics, name: str, table: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"table": table})


def test_the_full_counter_follows_the_tables_count_once_per_turned_away_value() -> None:
    table: BoundedTable[str] = BoundedTable("test_metrics_direct", 1)
    metrics = Metrics()
    metrics.report_sharing(tables())
    assert _sample(metrics, "processor_shared_table_full_total", table.name) == 0
    assert _sample(metrics, "processor_shared_values", table.name) == 0
    for value in ("a1", "b1", "c1"):
        table.share(value)
    metrics.report_sharing(tables())
    metrics.report_sharing(tables())  # a second report adds nothing new
    assert _sample(metrics, "processor_shared_table_full_total", table.name) == 2
    assert _sample(metrics, "processor_shared_values", table.name) == 1
    text = metrics.exposition().decode()
    assert 'processor_shared_table_full_total{table="test_metrics_direct"} 2.0' in text
    for name in ("event_strings", "part_names", "unit_keys", "published_units", "dispatch"):
        assert f'processor_shared_values{{table="{name}"}}' in text


def test_the_loop_exports_a_table_that_hit_its_bound() -> None:
    table: BoundedTable[str] = BoundedTable("test_metrics_loop", 1)
    table.share("first")
    table.share("second")  # turned away: the bound is hit before the loop runs
    broker = MemoryBroker()
    broker.create_topics(CONFIG)
    _produce(broker, "s", 0, 10)
    loop = Loop(broker)
    try:
        _wait(lambda: _committed(broker), loop, "the loop commits")
        _wait(
            lambda: _sample(loop.metrics, "processor_shared_table_full_total", table.name) == 1,
            loop,
            "the gauges refresh after the commit",
        )
    finally:
        loop.stop()
    assert _sample(loop.metrics, "processor_shared_values", table.name) == 1
    assert (_sample(loop.metrics, "processor_shared_values", "event_strings") or 0) > 0
