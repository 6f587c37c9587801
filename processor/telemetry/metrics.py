"""Prometheus metrics and the health report of one processor process.

One registry per :class:`Metrics` (not the global default) so several
processors can live in one test process.  The HTTP port that exposes them
(``/metrics``, ``/healthz``, ``/readyz``, the queries) is
``processor/service/ops/http.py``; :attr:`Metrics.health` is ``health.py``
(a report the run loop writes, never read to decide).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from processor.core.sharing import SharedTable
from processor.engine import Tally
from processor.kafka.client_count import CreatedCollector
from processor.kafka.retry import RetryWatch
from processor.telemetry.health import Health

OUTCOMES = ("applied", "duplicate", "rejected", "quarantined")


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.events = Counter(
            "processor_events_total", "Events by outcome", ["outcome"], registry=r
        )
        for outcome in OUTCOMES:
            self.events.labels(outcome)
        self.records_consumed = Counter(
            "processor_records_consumed_total", "Records read from the events topic", registry=r
        )
        self.dlq = Counter(
            "processor_dlq_records_total", "Records sent to the DLQ", ["rule"], registry=r
        )
        self.views_published = Counter(
            "processor_views_published_total", "View records produced", registry=r
        )
        self.checkpoints_published = Counter(
            "processor_checkpoints_published_total", "Checkpoint records produced", registry=r
        )
        self.fold_seconds = Histogram(
            "processor_fold_seconds", "Fold time per batch", registry=r, buckets=_buckets()
        )
        self.commit_seconds = Histogram(
            "processor_commit_seconds",
            "Produce + transaction commit time per batch",
            registry=r,
            buckets=_buckets(),
        )
        self.batch_events = Histogram(
            "processor_batch_events",
            "Events per committed batch",
            registry=r,
            buckets=(1, 10, 100, 1_000, 5_000, 20_000, 100_000),
        )
        self.aborts = Counter(
            "processor_transaction_aborts_total", "Aborted transactions", registry=r
        )
        self.commits = Counter("processor_transactions_total", "Committed transactions", registry=r)
        self.commits_outside_group = Counter(
            "processor_commits_outside_group_total",
            "Batches not committed because the consumer was no longer a group member "
            "(its partitions lost, the lost callback not served yet)",
            registry=r,
        )
        self.lag = Gauge(
            "processor_partition_lag", "Events not yet consumed", ["partition"], registry=r
        )
        self.partition_stalls = Counter(
            "processor_partition_stalls_total",
            "Times a partition with lag did not move for stall_s (stall_watch.py)",
            ["partition"],
            registry=r,
        )
        self.stall_reseeks = Counter(
            "processor_partition_stall_reseeks_total",
            "Seeks the progress watchdog issued to restart a stalled partition's fetch",
            registry=r,
        )
        self.partitions_stalled = Gauge(
            "processor_partitions_stalled",
            "Assigned partitions with lag whose position has not moved for stall_s",
            registry=r,
        )
        self.sessions = Gauge("processor_sessions_in_memory", "Sessions held in memory", registry=r)
        self.quarantined = Gauge(
            "processor_sessions_quarantined", "Quarantined sessions", registry=r
        )
        self.state_bytes = Gauge(
            "processor_session_state_bytes",
            "Estimated bytes of the sessions held in memory (state_budget_bytes bounds it)",
            registry=r,
        )
        self.evictions = Counter(
            "processor_session_evictions_total",
            "Sessions evicted from memory (over the budget or idle)",
            registry=r,
        )
        self.session_loads = Counter(
            "processor_session_loads_total",
            "Sessions loaded from the local store (first event since assign or eviction)",
            registry=r,
        )
        self.store_records_read = Counter(
            "processor_store_records_read_total",
            "Checkpoint records read from the topic into the local store on assignments",
            registry=r,
        )
        self.store_partitions_dropped = Counter(
            "processor_store_partitions_dropped_total",
            "Stored partitions an assignment dropped and refilled from offset 0: the "
            "topic did not prove them (recreated, truncated or rewritten; the log says why)",
            registry=r,
        )
        self.store_bytes = Gauge(
            "processor_store_bytes",
            "Live bytes of the local store (checked every few seconds; bound: store_bytes)",
            registry=r,
        )
        self.store_copies_dropped = Counter(
            "processor_store_copies_dropped_total",
            "Stored copies of partitions the member does not own, dropped to keep the "
            "local store under store_bytes",
            registry=r,
        )
        self.partitions_filling = Gauge(
            "processor_partitions_filling",
            "Assigned partitions still filling the local store (paused meanwhile)",
            registry=r,
        )
        self.fill_failures = Counter(
            "processor_fill_failures_total",
            "Store fills that failed and were retried (bounded, then the run fails)",
            registry=r,
        )
        self.store_write_queue_full = Counter(
            "processor_store_write_queue_full_total",
            "Commits that waited for room in the local store's write queue "
            "(store_write_queue commits; the loop waits, nothing is dropped)",
            registry=r,
        )
        self.restore_seconds = Histogram(
            "processor_restore_seconds",
            "Restore time per assigned partition",
            registry=r,
            buckets=_buckets(),
        )
        self.restored_checkpoints = Counter(
            "processor_restored_checkpoints_total", "Checkpoints read during restores", registry=r
        )
        self.rebalances = Counter(
            "processor_rebalances_total", "Rebalance callbacks", ["kind"], registry=r
        )
        for kind in ("assign", "revoke", "lost"):
            self.rebalances.labels(kind)
        self.zombie_fences = Counter(
            "processor_zombie_fences_total",
            "Dead members' transactional ids fenced on assignment (fenced, failed, bounded)",
            ["outcome"],
            registry=r,
        )
        for outcome in ("fenced", "failed", "bounded"):
            self.zombie_fences.labels(outcome)
        self.txn_calls_hanging = Gauge(
            "processor_txn_calls_hanging",
            "Transaction calls given up stuck in the Kafka client that have not "
            "returned yet (more than 3 end the process)",
            registry=r,
        )
        self.txn_failures = Counter(
            "processor_transaction_failures_total",
            "Failed transaction steps by kind (retriable, abortable, fatal, denied)",
            ["kind"],
            registry=r,
        )
        for kind in ("retriable", "abortable", "fatal", "denied"):
            self.txn_failures.labels(kind)
        self.consecutive_failures = Gauge(
            "processor_consecutive_transaction_failures",
            "Transactions failed in a row (0 after a commit)",
            registry=r,
        )
        self.degraded_gauge = Gauge(
            "processor_degraded",
            "1 while a repeating failure is past its bound or no broker answers",
            registry=r,
        )
        self.control = Counter(
            "processor_control_commands_total",
            "Control commands by outcome (applied, noop, rejected)",
            ["outcome"],
            registry=r,
        )
        for outcome in ("applied", "noop", "rejected"):
            self.control.labels(outcome)
        self.dlq_batch_closes = Counter(
            "processor_dlq_batch_bound_total",
            "Batches committed early because their dead letters reached "
            "MAX_BATCH_DEAD_LETTER_BYTES (a flood of bad records)",
            registry=r,
        )
        self.dlq_oversized = Counter(
            "processor_dlq_values_referenced_total",
            "Dead letters whose record was too big to copy (kept as "
            "partition, offset, size and digest)",
            registry=r,
        )
        self.shared_values = Gauge(
            "processor_shared_values",
            "Values each sharing table holds (held sessions share one copy of equal "
            "event types, part names, unit keys and dispatch tables; each table is bounded)",
            ["table"],
            registry=r,
        )
        self.shared_table_full = Counter(
            "processor_shared_table_full_total",
            "Values a sharing table turned away (or dropped for a newer one) at its bound: "
            "they are kept as copies, which costs memory per held session, never correctness",
            ["table"],
            registry=r,
        )
        self._shared_full_seen: dict[str, int] = {}
        self.kafka_retries = Counter(
            "processor_kafka_retries_total",
            "Kafka calls of the restore path retried after a transient error, "
            "by call and error code (retry.py; each retry rides out a broker fault)",
            ["call", "code"],
            registry=r,
        )
        #: the loop thread's retries (rebalance.py observes them)
        self.retries = RetryWatch(lambda call, code: self.kafka_retries.labels(call, code).inc())
        self.retry_waiting = Gauge(
            "processor_kafka_retry_waiting_seconds",
            "How long the oldest Kafka call still being retried has failed (0: none)",
            registry=r,
        )
        self.retry_waiting.set_function(lambda: (self.retries.oldest() or (0.0, ""))[0])
        self.restore_waits = Counter(
            "processor_restore_waits_total",
            "Partition restores put off because the broker did not answer within the "
            "retry deadline or their store fill stalled (held paused and tried again "
            "later; /readyz names them)",
            registry=r,
        )
        self.committed_behind = Counter(
            "processor_restore_committed_behind_waits_total",
            "Restores that found a checkpoint at or past the group's committed offset "
            "and waited (loop blocked, /readyz names it) for the commit to show, by "
            "outcome: caught_up, expired (past the bound: the partition goes on after its "
            "newest checkpoint's anchor), failed (the offsets query gave up)",
            ["outcome"],
            registry=r,
        )
        for outcome in ("caught_up", "expired", "failed"):
            self.committed_behind.labels(outcome)
        self.committed_behind_waiting = Gauge(
            "processor_restore_committed_behind_seconds",
            "How long the restore's wait for the committed offsets to pass their "
            "checkpoints has lasted (0: none)",
            registry=r,
        )
        self.committed_behind_waiting.set_function(
            lambda: max((s for s, _ in self.retries.waits()), default=0.0)
        )
        self.foreign_members = Gauge(
            "processor_group_foreign_members",
            "Members of the group that are not processors (client.id) and hold events "
            "partitions: those partitions are not folded (group_watch.py; /readyz names them)",
            registry=r,
        )
        self.group_protocol = Gauge(
            "processor_group_protocol",
            "1 for the consumer group protocol this member runs (classic or consumer, "
            "KIP-848; ``auto`` chose it at start: group_protocol.py)",
            ["protocol"],
            registry=r,
        )
        self.join_refusals = Counter(
            "processor_group_join_refusals_total",
            "Joins of this static member the group refused because a member with its "
            "instance id had not left (UNRELEASED_INSTANCE_ID; it joins again: rejoin.py)",
            registry=r,
        )
        #: what /healthz and /readyz report (``health.py``); the degraded gauge follows it
        self.health = Health(on_degraded=self.degraded_gauge.set)
        r.register(CreatedCollector())  # processor_kafka_clients_created_total (client_count.py)
        self.health.retrying = self.retries.oldest
        self.health.waiting = self.retries.waits

    def report_sharing(self, tables: Iterable[SharedTable]) -> None:
        """Set the sharing gauges from the process's tables; the full counter
        grows by what each table counted since the last report."""
        for table in tables:
            self.shared_values.labels(table.name).set(table.size())
            seen = self._shared_full_seen.get(table.name, 0)
            counter = self.shared_table_full.labels(table.name)
            if table.full > seen:
                counter.inc(table.full - seen)
                self._shared_full_seen[table.name] = table.full

    def count_state(self, tally: Tally) -> None:
        """Count the tally's state changes (loads, evictions) and zero them."""
        if tally.loads:
            self.session_loads.inc(tally.loads)
        if tally.evictions:
            self.evictions.inc(tally.evictions)
        tally.loads = tally.evictions = 0

    def count_decisions(self, tally: Tally) -> None:
        """Count a committed batch's decisions (applied, rejected, dead letters,
        commands, records published)."""
        for label, n in tally.events.items():
            self.events.labels(label).inc(n)
        for rule, n in tally.dlq.items():
            self.dlq.labels(rule).inc(n)
        if tally.dlq_oversized:
            self.dlq_oversized.inc(tally.dlq_oversized)
        for label, n in tally.control.items():
            self.control.labels(label).inc(n)
        if tally.views_published:
            self.views_published.inc(tally.views_published)
        if tally.checkpoints_published:
            self.checkpoints_published.inc(tally.checkpoints_published)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _buckets() -> tuple[float, ...]:
    return (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
