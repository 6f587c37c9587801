"""The processor's Grafana dashboard, as code (grafana-foundation-sdk).

    python deploy/grafana/dashboard.py > deploy/grafana/processor-dashboard.json

The JSON is committed so it can be imported without Python; the test
(tests/deploy/test_grafana.py) regenerates it, requires the committed file to
match, and checks that every metric and label a query names is one the
processor exports (processor/telemetry/metrics.py).  Queries use the raw metrics,
not the recording rules, so the dashboard works without deploy/prometheus/.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from grafana_foundation_sdk.builders.dashboard import (
    Dashboard,
    DatasourceVariable,
    QueryVariable,
    Row,
)
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.builders.stat import Panel as Stat
from grafana_foundation_sdk.builders.timeseries import Panel as Timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    VariableRefresh,
)

DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
SEL = '{job=~"$job"}'
RATE = "[$__rate_interval]"


def _query(expr: str, legend: str = "") -> Dataquery:
    q = Dataquery().expr(expr).datasource(DS)
    return q.legend_format(legend) if legend else q


def _series(title: str, unit: str, description: str, *queries: tuple[str, str]) -> Timeseries:
    panel = (
        Timeseries()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DS)
        .height(8)
        .span(12)
    )
    for expr, legend in queries:
        panel = panel.with_target(_query(expr, legend))
    return panel


def _stat(title: str, expr: str, unit: str, description: str) -> Stat:
    return (
        Stat()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DS)
        .height(4)
        .span(6)
        .with_target(_query(expr))
    )


def _quantiles(metric: str) -> list[tuple[str, str]]:
    return [
        (
            f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{SEL}{RATE})))",
            f"p{int(q * 100)}",
        )
        for q in (0.5, 0.99)
    ]


def build() -> Builder[Any]:
    lag = f"max by (partition) (processor_partition_lag{SEL})"
    return (
        Dashboard("Processor")
        .uid("processor-overview")
        .description(
            "Kafka projection service for agent session logs: throughput, lag, "
            "latency, bad input, rebalances and restores (docs/operations.md)"
        )
        .tags(["processor", "kafka"])
        .refresh("30s")
        .time("now-3h", "now")
        .timezone("browser")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .with_variable(DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(
            QueryVariable("job")
            .label("Job")
            .datasource(DS)
            .query("label_values(processor_events_total, job)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .multi(True)
            .include_all(True)
        )
        .with_row(Row("Overview"))
        .with_panel(
            _stat(
                "Lag (events)",
                f"sum({lag})",
                "short",
                "Events in the log not yet consumed, over all partitions",
            )
        )
        .with_panel(
            _stat(
                "Events/s",
                f"sum(rate(processor_events_total{SEL}{RATE}))",
                "ops",
                "Events judged by the seq gate, any outcome",
            )
        )
        .with_panel(
            _stat(
                "Quarantined sessions",
                f"sum(processor_sessions_quarantined{SEL})",
                "short",
                "Sessions stopped at their last valid seq (runbook: a quarantined session)",
            )
        )
        .with_panel(
            _stat(
                "Sessions in memory",
                f"sum(processor_sessions_in_memory{SEL})",
                "short",
                "Live sessions and not yet materialised checkpoints",
            )
        )
        .with_row(Row("Throughput and lag"))
        .with_panel(
            _series(
                "Events by outcome",
                "ops",
                "applied, duplicate, rejected, quarantined",
                (f"sum by (outcome) (rate(processor_events_total{SEL}{RATE}))", "{{outcome}}"),
            )
        )
        .with_panel(
            _series(
                "Lag by partition",
                "short",
                "Events not yet consumed per partition (a stuck partition stays flat above zero)",
                (lag, "partition {{partition}}"),
            )
        )
        .with_panel(
            _series(
                "Stalled partitions",
                "short",
                "Partitions with lag whose "
                "position did not move for stall_s (the member seeks them "
                "again, then /readyz names them), stalls and seeks",
                (f"sum by (instance) (processor_partitions_stalled{SEL})", "{{instance}} stalled"),
                (
                    f"sum by (partition) (increase(processor_partition_stalls_total{SEL}{RATE}))",
                    "stalls partition {{partition}}",
                ),
                (f"sum(increase(processor_partition_stall_reseeks_total{SEL}{RATE}))", "seeks"),
            )
        )
        .with_panel(
            _series(
                "Records consumed by member",
                "ops",
                "Records read from the events topic",
                (
                    f"sum by (instance) (rate(processor_records_consumed_total{SEL}{RATE}))",
                    "{{instance}}",
                ),
            )
        )
        .with_panel(
            _series(
                "Records produced",
                "ops",
                "View and checkpoint records per second",
                (f"sum(rate(processor_views_published_total{SEL}{RATE}))", "views"),
                (f"sum(rate(processor_checkpoints_published_total{SEL}{RATE}))", "checkpoints"),
            )
        )
        .with_row(Row("Latency and batches"))
        .with_panel(
            _series(
                "Fold time per batch",
                "s",
                "Seq gate and core fold of one batch",
                *_quantiles("processor_fold_seconds"),
            )
        )
        .with_panel(
            _series(
                "Commit time per batch",
                "s",
                "Produce and transaction commit",
                *_quantiles("processor_commit_seconds"),
            )
        )
        .with_panel(
            _series(
                "Events per batch",
                "short",
                "Committed batch sizes",
                *_quantiles("processor_batch_events"),
            )
        )
        .with_panel(
            _series(
                "Transactions",
                "ops",
                "Committed and aborted transactions",
                (f"sum(rate(processor_transactions_total{SEL}{RATE}))", "committed"),
                (f"sum(rate(processor_transaction_aborts_total{SEL}{RATE}))", "aborted"),
            )
        )
        .with_panel(
            _series(
                "Transaction failures",
                "short",
                "Failed transaction steps by "
                "kind, members past their failure bound, other "
                "applications' consumers holding partitions (/readyz 503), and "
                "given-up transaction calls still hanging in the Kafka client "
                "(a fourth at once ends the member)",
                (
                    f"sum by (kind) (increase(processor_transaction_failures_total{SEL}{RATE}))",
                    "{{kind}}",
                ),
                (
                    f"max by (instance) (processor_consecutive_transaction_failures{SEL})",
                    "in a row {{instance}}",
                ),
                (f"sum(processor_degraded{SEL})", "degraded members"),
                (
                    f"max(processor_group_foreign_members{SEL})",
                    "other applications' members holding partitions",
                ),
                (
                    f"max by (instance) (processor_txn_calls_hanging{SEL})",
                    "calls hanging {{instance}}",
                ),
            )
        )
        .with_row(Row("Bad input, rebalances, restores"))
        .with_panel(
            _series(
                "Dead letters by rule",
                "short",
                "Records sent to the DLQ",
                (f"sum by (rule) (increase(processor_dlq_records_total{SEL}{RATE}))", "{{rule}}"),
                (
                    f"sum(increase(processor_dlq_values_referenced_total{SEL}{RATE}))",
                    "too big, referenced",
                ),
                (
                    f"sum(increase(processor_dlq_batch_bound_total{SEL}{RATE}))",
                    "batches closed at the dead-letter bound",
                ),
            )
        )
        .with_panel(
            _series(
                "Control commands",
                "short",
                "Redrive commands by outcome (applied, noop, rejected)",
                (
                    f"sum by (outcome) (increase(processor_control_commands_total{SEL}{RATE}))",
                    "{{outcome}}",
                ),
            )
        )
        .with_panel(
            _series(
                "Rebalance callbacks",
                "short",
                "assign / revoke / lost per "
                "member, dead members' transactions fenced on takeover, "
                "static members' joins refused (UNRELEASED_INSTANCE_ID), "
                "batches not committed by a member no longer in its group "
                "(lost partitions not served yet) and "
                "members per group protocol (classic, consumer = KIP-848)",
                (f"sum by (kind) (increase(processor_rebalances_total{SEL}{RATE}))", "{{kind}}"),
                (
                    f"sum by (outcome) (increase(processor_zombie_fences_total{SEL}{RATE}))",
                    "fences {{outcome}}",
                ),
                (f"sum(increase(processor_group_join_refusals_total{SEL}{RATE}))", "joins refused"),
                (
                    f"sum(increase(processor_commits_outside_group_total{SEL}{RATE}))",
                    "commits refused outside the group",
                ),
                (f"sum by (protocol) (processor_group_protocol{SEL})", "members on {{protocol}}"),
            )
        )
        .with_panel(
            _series(
                "Restore time per partition",
                "s",
                "Checkpoint restore of a newly assigned partition",
                *_quantiles("processor_restore_seconds"),
            )
        )
        .with_panel(
            _series(
                "Checkpoints restored",
                "ops",
                "Sessions found by restores, and checkpoint records read into the local store",
                (f"sum(rate(processor_restored_checkpoints_total{SEL}{RATE}))", "sessions"),
                (
                    f"sum(rate(processor_store_records_read_total{SEL}{RATE}))",
                    "records read into the store",
                ),
            )
        )
        .with_panel(
            _series(
                "Store fills",
                "short",
                "Partitions assigned but still filling "
                "their local store (paused, the others fold), fills retried, "
                "commits that waited on the store's full write queue, and "
                "stored partitions dropped because the topic no longer proves "
                "them (refilled from offset 0), and copies of partitions not "
                "owned dropped to keep the store under store_bytes",
                (f"sum by (instance) (processor_partitions_filling{SEL})", "{{instance}} filling"),
                (f"sum(increase(processor_fill_failures_total{SEL}{RATE}))", "failed fills"),
                (
                    f"sum(increase(processor_store_write_queue_full_total{SEL}{RATE}))",
                    "write queue full",
                ),
                (
                    f"sum(increase(processor_store_partitions_dropped_total{SEL}{RATE}))",
                    "stored partitions dropped",
                ),
                (
                    f"sum(increase(processor_store_copies_dropped_total{SEL}{RATE}))",
                    "copies dropped (store_bytes)",
                ),
            )
        )
        .with_panel(
            _series(
                "Local store size",
                "bytes",
                "Live bytes of each member's local store (bound: store_bytes; past it "
                "with owned partitions alone /readyz says so)",
                (f"max by (instance) (processor_store_bytes{SEL})", "{{instance}}"),
            )
        )
        .with_panel(
            _series(
                "Restore retries",
                "short",
                "Kafka calls of the restore retried "
                "after a transient error (by call and code), the oldest call still "
                "failing (s), partition restores put off past the retry "
                "deadline (paused, tried again; /readyz names them), and restores "
                "waiting for the committed offsets to pass their checkpoints "
                "(s; ended waits by outcome: expired means the anchor check failed)",
                (
                    f"sum by (call, code) (increase(processor_kafka_retries_total{SEL}{RATE}))",
                    "{{call}} {{code}}",
                ),
                (
                    f"max by (instance) (processor_kafka_retry_waiting_seconds{SEL})",
                    "{{instance}} waiting (s)",
                ),
                (f"sum(increase(processor_restore_waits_total{SEL}{RATE}))", "restores put off"),
                (
                    f"max by (instance) (processor_restore_committed_behind_seconds{SEL})",
                    "{{instance}} committed behind (s)",
                ),
                (
                    f"sum by (outcome) (increase("
                    f"processor_restore_committed_behind_waits_total{SEL}{RATE}))",
                    "committed behind {{outcome}}",
                ),
            )
        )
        .with_row(Row("Session state"))
        .with_panel(
            _series(
                "Session state held",
                "bytes",
                "Estimated bytes of the sessions in memory (state_budget_bytes bounds it)",
                (f"sum by (instance) (processor_session_state_bytes{SEL})", "{{instance}}"),
            )
        )
        .with_panel(
            _series(
                "Evictions and loads",
                "ops",
                "Sessions evicted (budget or idle) "
                "and loaded from the local store on their next event",
                (f"sum(rate(processor_session_evictions_total{SEL}{RATE}))", "evicted"),
                (f"sum(rate(processor_session_loads_total{SEL}{RATE}))", "loaded"),
            )
        )
        .with_panel(
            _series(
                "Sharing tables",
                "short",
                "Values each sharing table holds "
                "(one copy of equal values for every held session), and values "
                "a full table turned away: copies, memory only, never "
                "correctness",
                (f"max by (table) (processor_shared_values{SEL})", "{{table}}"),
                (
                    f"sum by (table) (increase(processor_shared_table_full_total{SEL}{RATE}))",
                    "{{table}} full",
                ),
            )
        )
    )


def render() -> str:
    doc = json.loads(json.dumps(build().build(), cls=JSONEncoder))
    for number, panel in enumerate(doc["panels"], start=1):
        # unique ids (links and alerts refer to them); no null options (Grafana
        # fills in each panel type's defaults when the key is absent)
        panel["id"] = number
        if panel.get("options") is None:
            panel.pop("options", None)
    return json.dumps(doc, sort_keys=True, indent=2) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
