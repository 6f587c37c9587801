"""Partitions coming and going: assign (restore), revoke, lost, and rewind after an abort.

On assign, a partition's checkpoints are brought into the local store
(``state.py``: verified, then caught up from the store's offset), the
newest one proves the events log is still the one they were folded from
(``restore.check_anchor``), and the partition is handed to the engine with
the store as its checkpoint source: no session is materialised until its
first event arrives.  The events are consumed from the group's committed
offset (committed in the same transaction as those checkpoints), or from
offset zero when the anchor check asks for a rebuild.

A revoke first commits the open batch while the member still owns the
partitions (within ``revoke_budget_ms``); a failing commit aborts and
rewinds only the partitions being kept.  A lost partition is dropped
without a commit: its new owner refolds the batch.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable

from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition

from processor.codec import Codec
from processor.config import ServiceConfig
from processor.core.errors import ProcessorError
from processor.engine import Engine, PartitionState
from processor.gcpolicy import settle_heap
from processor.service.commit import Committer
from processor.service.control import ControlChannel
from processor.service.metrics import Metrics
from processor.service.restore import (
    AnchorError,
    PartitionRestore,
    check_anchor,
    committed_offsets,
    fetch_events,
    stable_bound_s,
    wait_stable,
)
from processor.service.retry import retry
from processor.service.state import CheckpointStore, session_of
from processor.service.transport import GroupConsumer, Reader, Transport

log = logging.getLogger("processor.runner")


class Rebalance:
    """The rebalance callbacks and the restore of newly owned partitions."""

    def __init__(
        self,
        config: ServiceConfig,
        transport: Transport,
        codec: Codec,
        engine: Engine,
        store: CheckpointStore,
        committer: Committer,
        metrics: Metrics,
        *,
        fail: Callable[[ProcessorError], ProcessorError],
        control: Callable[[], ControlChannel | None],
        dead: Callable[[], bool],
        changed: Callable[[], None],
    ) -> None:
        self.config = config
        self.topics = config.topics
        self.transport = transport
        self.codec = codec
        self.engine = engine
        self.store = store
        self.committer = committer
        self.metrics = metrics
        self.health = metrics.health
        self._fail = fail
        self._control = control
        self._dead = dead
        self._changed = changed  # gauges to refresh
        self.consumer: GroupConsumer | None = None
        self.reader: Reader | None = None  # the restore consumer
        self.assigned_at = 0.0
        #: partitions of the events topic (co-partitioned with the checkpoints)
        self.partition_count = 0
        committer.rewind = self.rewind

    # ------------------------------------------------------------ callbacks

    def on_assign(self, consumer: GroupConsumer, partitions: list[TopicPartition]) -> None:
        self.metrics.rebalances.labels("assign").inc()
        self.health.ready = False
        starts = self.restore([tp.partition for tp in partitions])
        assignment = []
        for tp in partitions:
            start = starts.get(tp.partition)
            assignment.append(
                TopicPartition(tp.topic, tp.partition)
                if start is None
                else TopicPartition(tp.topic, tp.partition, start)
            )
        consumer.incremental_assign(assignment)
        if self.committer.queries is not None:
            self.committer.queries.assigned([tp.partition for tp in partitions])
        control = self._control()
        if control is not None:
            control.assign(consumer, [tp.partition for tp in partitions])
        self.assigned_at = time.monotonic()
        # the restored sessions are long-lived and cycle-free: keep the cyclic
        # collector from walking them again (a full pass over 100k sessions
        # stalls every partition ~6 s; gcpolicy.py, BENCHMARKS.md)
        settle_heap()
        self.health.ready = True

    def on_revoke(self, consumer: GroupConsumer, partitions: list[TopicPartition]) -> None:
        self.metrics.rebalances.labels("revoke").inc()
        # A failing commit here aborts the batch and rewinds only the partitions
        # we keep: the revoked ones are the next owner's to restore, and a
        # back-off would only delay the whole group's rebalance.
        c = self.committer
        c.leaving = {tp.partition for tp in partitions}
        c.deadline = time.monotonic() + self.config.revoke_budget_ms / 1000
        try:
            if not self._dead():
                c.commit()  # finish the open batch while we still own the partitions
        except KafkaException as exc:
            log.warning("commit on revoke failed (%s); aborting the batch", exc)
            c.abort(set())
        finally:
            # the store's queued writes, within what is left of the revoke budget
            # (what misses it is caught up if the partitions come back)
            self.store.flush(max(0.0, c.deadline - time.monotonic()) if c.deadline else 0.0)
            c.leaving = set()
            c.deadline = None
        for tp in partitions:
            self.engine.drop_partition(tp.partition)
        if self.committer.queries is not None:
            self.committer.queries.revoked(tp.partition for tp in partitions)
        consumer.incremental_unassign(partitions)
        control = self._control()
        if control is not None:
            control.unassign({tp.partition for tp in partitions})
        self._changed()

    def on_lost(self, consumer: GroupConsumer, partitions: list[TopicPartition]) -> None:
        self.metrics.rebalances.labels("lost").inc()
        lost = {tp.partition for tp in partitions}
        self.committer.abort(lost, rewind=False)
        for p in lost:
            self.engine.drop_partition(p)
        if self.committer.queries is not None:
            self.committer.queries.revoked(lost)
        consumer.incremental_unassign(partitions)
        control = self._control()
        if control is not None:
            control.unassign(lost)
        self._changed()

    def rewind(self, numbers: list[int]) -> None:
        """After an abort: restore these partitions and seek back to the committed offsets."""
        assert self.consumer is not None
        starts = self.restore(numbers)
        committed = committed_offsets(self.consumer, self.topics.events, numbers)
        for number in numbers:
            start = starts.get(number)
            at = committed[number]
            offset = start if start is not None else (at if at is not None else OFFSET_BEGINNING)
            tp = TopicPartition(self.topics.events, number, offset)
            retry(functools.partial(self.consumer.seek, tp), f"seek {tp.topic}[{number}]")
        control = self._control()
        if control is not None:
            control.rewind(self.consumer, set(numbers))

    # ------------------------------------------------------------ restore

    def restore(self, numbers: list[int]) -> dict[int, int | None]:
        """Bring newly owned partitions' checkpoints into the store; start-offset overrides.

        All partitions are read in one assignment of the restore consumer,
        from where the store stands — never the events behind them.
        """
        assert self.consumer is not None and self.reader is not None
        if not numbers:
            return {}
        t0 = time.monotonic()
        rc, events, store = self.reader, self.topics.events, self.store
        if self.config.exactly_once:
            # never restore behind a zombie's open transaction (see restore.py)
            unstable = set(
                wait_stable(
                    self.transport.admin,
                    self.topics.checkpoints,
                    numbers,
                    stable_bound_s(self.config),
                )
            )
        else:
            unstable = set()
        # the restore consumer's metadata, not the group consumer's: a call on the
        # group consumer inside its own rebalance callback clears its call state
        # and librdkafka's next callback aborts the process (seen in test_revoke)
        checkpoints = self.topics.checkpoints
        cluster = retry(lambda: rc.list_topics(checkpoints, timeout=10), "cluster metadata")
        cluster_id = str(getattr(cluster, "cluster_id", "") or "")
        meta = cluster.topics.get(checkpoints) if hasattr(cluster, "topics") else None
        if meta is not None and meta.partitions:
            self.partition_count = len(meta.partitions)
        store.open(cluster_id, self.transport.topic_id(checkpoints))
        for number in numbers:
            self.engine.drop_partition(number)
        filled = store.fill(rc, numbers)
        committed = committed_offsets(self.consumer, events, numbers)
        newest = {p: store.newest(p) for p in numbers}
        anchors = {p: cp.anchor.offset for p, cp in newest.items() if cp is not None}
        found = fetch_events(rc, self.codec, events, anchors) if anchors else {}
        starts: dict[int, int | None] = {}
        for number in numbers:
            cp = newest[number]
            restore = PartitionRestore(number, {cp.session_id: cp} if cp is not None else {})
            problem = check_anchor(
                rc,
                events,
                restore,
                committed[number],
                found.get(number),
                transactional=self.config.exactly_once,
            ) or self.engine.unusable_rows(restore.checkpoints.values())
            starts[number] = None
            quarantined = store.quarantined(number)
            if problem is not None:
                if self.config.anchor_policy == "fail":
                    error = self._fail(AnchorError(f"anchor check failed: {problem}"))
                    log.error("%s", error)
                    raise error
                log.warning(
                    "anchor check failed (%s); rebuilding partition %d from offset zero",
                    problem,
                    number,
                )
                self._tombstone_all(number)
                quarantined = set()
                starts[number] = OFFSET_BEGINNING
            part = PartitionState(number, source=store, quarantined=quarantined)
            self.engine.partitions[number] = part
            part.maybe_stale = number in unstable and starts[number] is None
            part.resumed_at = committed[number]
            held = store.sessions(number)
            self.metrics.restored_checkpoints.inc(held)
            f = filled[number]
            self.metrics.store_records_read.inc(f.records_read)
            log.info(
                "restored partition %d: %d sessions in the store (%s, %d records read), "
                "resuming at %s",
                number,
                held,
                "filled from offset 0" if f.kept_from is None else f"kept to offset {f.kept_from}",
                f.records_read,
                "offset 0"
                if starts[number] is not None
                else f"committed offset {committed[number]}",
            )
        self.metrics.restore_seconds.observe(time.monotonic() - t0)
        return starts

    def _tombstone_all(self, number: int) -> None:
        """Before a rebuild from zero: tombstone every session's checkpoint and views,
        and empty the store's partition (its records are about to be tombstoned)."""
        topic = self.topics.checkpoints
        keys = list(self.store.keys(number))
        for sid in sorted({session_of(k) for k in keys}):
            cp, _ = self.store.load(number, sid)
            if cp is not None:
                self.engine.tombstone_session(number, sid, cp)
        done = {k for t, p, k in self.engine.batch.tombstones if t == topic and p == number}
        # what no readable head names (an orphaned or unreadable part) goes too
        self.engine.batch.tombstones.extend((topic, number, k) for k in keys if k not in done)
        if self.store.store is not None:
            self.store.store.drop(self.topics.checkpoints, number)
