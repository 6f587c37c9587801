"""Partitions coming and going: assign (restore), revoke, lost, and rewind after an abort.

On assign, each partition's stored position is verified (``checkpoint_store.py``) and
the partition is assigned *paused*; the poll loop then fills its store in
bounded slices (``background_fill.py``) while the other partitions fold.
When its fill ends, the newest checkpoint proves the events log is still the
one they were folded from (``restore.check_anchor``), the partition is
handed to the engine with the store as its checkpoint source (no session is
materialised until its first event arrives) and resumed.  The events are
consumed from the group's committed offset (committed in the same
transaction as those checkpoints), or from offset zero when the anchor
check asks for a rebuild.

A restore that cannot read the broker within the retry deadline
(``retry.GaveUp``, or a read timing out) does not end the run: its
partitions stay assigned and paused, ``/readyz`` names the partition and the
error, and the restore is tried again from the start after a back-off
(``BackgroundFill.wait``); a permanent error still ends the run with its one
line.  Every Kafka retry of the restore is counted and, while one lasts,
named by ``/readyz`` (``retry.RetryWatch``).  A background fill that stalls
(or whose read fails with a transient error) is put off the same way by
``BackgroundFill.step``; :meth:`Rebalance.fill_step` restores it again once
due, as a put-off restore.

A revoke first commits the open batch while the member still owns the
partitions (within ``revoke_budget_ms``); a failing commit aborts and
rewinds only the partitions being kept.  A lost partition is dropped
without a commit: its new owner refolds the batch.
"""

from __future__ import annotations

import contextlib
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
from processor.kafka.reads import watermarks
from processor.kafka.retry import GaveUp, is_transient, observing, retry, run_all
from processor.kafka.transport import GroupConsumer, Reader
from processor.service.loop.control import ControlChannel
from processor.service.loop.member_clients import MemberClients
from processor.service.partitions.background_fill import BackgroundFill
from processor.service.partitions.restore import (
    AnchorError,
    PartitionRestore,
    check_anchor,
    committed_behind,
    committed_offsets,
    fetch_events,
    stable_bound_s,
    wait_stable,
)
from processor.service.partitions.standby import Standby
from processor.service.queries.query_cache import QueryCache
from processor.service.store.checkpoint_store import CheckpointStore, Filled, session_of
from processor.service.txn.commit import Committer
from processor.telemetry.metrics import Metrics
from processor.testing import faultpoints

log = logging.getLogger(__name__)

#: Seconds between checks of the local store's live bytes against ``store_bytes``.
BUDGET_EVERY_S = 5.0


class Rebalance:
    """The rebalance callbacks and the restore of newly owned partitions."""

    def __init__(
        self,
        config: ServiceConfig,
        clients: MemberClients,
        codec: Codec,
        engine: Engine,
        store: CheckpointStore,
        committer: Committer,
        metrics: Metrics,
        *,
        queries: QueryCache | None,
        fail: Callable[[ProcessorError], ProcessorError],
        control: Callable[[], ControlChannel | None],
        dead: Callable[[], bool],
        changed: Callable[[], None],
    ) -> None:
        self.config = config
        self.topics = config.topics
        self.clients = clients
        self.transport = clients.transport
        self.codec = codec
        self.engine = engine
        self.store = store
        self.committer = committer
        self.metrics = metrics
        #: the views of the owned partitions for queries (rebuilt on assign)
        self.queries = queries
        self.health = metrics.health
        self._fail = fail
        self._control = control
        self._dead = dead
        self._changed = changed  # gauges to refresh
        #: the fills of newly assigned partitions, run in slices by the loop
        self.fill = BackgroundFill(
            store, metrics, lambda: clients.plain("fill"), stall_s=float(config.fill_stall_s)
        )
        #: warm copies of the partitions not owned (standby.py); a file store only
        self.standby: Standby | None = None
        if config.standby_s > 0 and config.state_path is not None:
            self.standby = Standby(
                BackgroundFill(store, metrics, lambda: clients.plain("standby"), reports=False),
                config.standby_s,
                self._kept_warm,
                lambda: self.reader if self.partition_count else None,
            )
        self._budget_at = 0.0  # the next size check of the local store
        #: copies dropped to keep the store under ``store_bytes``: not kept warm
        #: again until the assignment changes (else drop and refill would cycle)
        self._over_budget: set[int] = set()
        self.assigned_at = 0.0
        #: partitions of the events topic (co-partitioned with the checkpoints)
        self.partition_count = 0
        #: when each partition's restore began (restore_seconds): per partition, as a
        #: rewind or another assignment during a background fill must not reset it
        self._started: dict[int, float] = {}
        self._unstable: set[int] = set()  # restored behind an unknown open transaction
        self._stable_s: dict[int, float] = {}  # per partition: its restore's stability wait
        #: rewound partitions whose restore was put off: seeked back to the
        #: committed offset once it ends
        self._reseek: set[int] = set()

    @property
    def consumer(self) -> GroupConsumer | None:
        return self.clients.consumer

    @property
    def reader(self) -> Reader | None:
        """The restore consumer."""
        return self.clients.reader

    # ------------------------------------------------------------ callbacks

    def on_assign(self, consumer: GroupConsumer, partitions: list[TopicPartition]) -> None:
        """Verify the new partitions' stores and assign them paused; the loop fills
        them in slices (:meth:`fill_step`) while the other partitions fold."""
        self.metrics.rebalances.labels("assign").inc()
        self._over_budget.clear()  # a new assignment: measured again before kept warm
        numbers = [tp.partition for tp in partitions]
        assignment = [TopicPartition(tp.topic, tp.partition) for tp in partitions]
        consumer.incremental_assign(assignment)
        # nothing of theirs is folded before the fill and the anchor check end
        # (assigned first: a store failing its verification ends the run with
        # the partitions assigned, so the close's revoke finds them, and a
        # restore put off keeps them paused)
        consumer.pause(assignment)
        if numbers:  # (a cooperative rebalance may assign nothing)
            faultpoints.hit(faultpoints.BEFORE_RESTORE)
        if self.standby is not None:  # the assignment's fill takes them over
            self.standby.cancel(numbers)
        with self._observing():
            self._begin(numbers)
        self.health.ready = True  # serving; /readyz names the partitions still filling
        self.health.group = None  # the group took this member (join_refusal.py)

    def _observing(self) -> contextlib.AbstractContextManager[None]:
        """The restore's retries: counted, named on /readyz, and given up (the
        restore put off) after ``restore_deadline_s``."""
        return observing(self.metrics.retries, float(self.config.restore_deadline_s))

    def _begin(self, numbers: list[int]) -> None:
        """Prepare the partitions and open their fills, or put them off."""
        try:
            self._prepare(numbers)
            assert self.reader is not None
            self.fill.start(self.reader, numbers)
        except KafkaException as exc:
            self._put_off(numbers, exc)

    def _put_off(self, numbers: list[int], exc: KafkaException) -> None:
        """A restore step failed: a transient error (the broker did not answer
        within the retry deadline) holds the partitions paused and tries them
        again later; anything else ends the run as before."""
        if not is_transient(exc):
            raise exc
        why = exc.line() if isinstance(exc, GaveUp) else str(exc)
        for number in numbers:
            self.engine.drop_partition(number)
        self.fill.wait(numbers, why)
        # a new restore consumer for the next try: one whose metadata went
        # stale in a broker restart kept failing past the deadline (chaos run)
        old = self.clients.new_reader()
        run_all([("restore consumer close", old.close if old is not None else None)])

    def _unowned(self) -> list[int]:
        held = set(self.engine.partitions) | self.fill.filling
        return [p for p in range(self.partition_count) if p not in held]

    def _kept_warm(self) -> list[int]:
        """The standby's partitions: the unowned ones the budget has not dropped."""
        return [p for p in self._unowned() if p not in self._over_budget]

    def keep_store_under_budget(self, now: float | None = None) -> None:
        """Every ``BUDGET_EVERY_S``: measure the local store and drop copies of
        partitions neither owned nor filling while it is past ``store_bytes``
        (``CheckpointStore.keep_under_budget``); a standby fill's partitions
        are left to it (dropped at a later check, once it has ended)."""
        now = time.monotonic() if now is None else now
        if now < self._budget_at or self.store.store is None:
            return
        self._budget_at = now + BUDGET_EVERY_S
        busy = self.standby.fill.filling if self.standby is not None else set()
        dropped = self.store.keep_under_budget(p for p in self._unowned() if p not in busy)
        if dropped:
            self._over_budget.update(dropped)
            self.metrics.store_copies_dropped.inc(len(dropped))

    def close_fills(self) -> None:
        self.fill.close()
        if self.standby is not None:
            self.standby.close()

    def fill_step(self, behind: bool = False) -> None:
        """One slice of the open fills (the poll loop calls this); resume the filled.
        None open: one slice of the standby copies' catch-up, if any (standby.py)."""
        if not self.fill.jobs:
            self.keep_store_under_budget()
            if self.standby is not None:
                self.standby.step(behind)
            return
        with self._observing():
            due = self.fill.due()
            if due:
                self._begin(due)
            filled = self.fill.step()
            if not filled:
                return
            numbers = sorted(filled)
            try:
                starts = self._finish(numbers, filled)
            except KafkaException as exc:
                self._put_off(numbers, exc)
                return
            self._resume(numbers, starts)

    def _resume(self, numbers: list[int], starts: dict[int, int | None]) -> None:
        assert self.consumer is not None
        consumer = self.consumer
        reseek = sorted(self._reseek & set(numbers))
        self._reseek -= set(numbers)
        committed = committed_offsets(consumer, self.topics.events, reseek) if reseek else {}
        # resumed first, then sought: librdkafka's resume does not wake the fetcher
        # of the partition's leader, which (fetching nothing else of this
        # consumer) looks again only at its idle wake-up, up to 1 s later: every
        # takeover's first records waited 0.3-0.8 s (issue 37's rolling restart).
        # A seek of an active partition wakes it.
        consumer.resume([TopicPartition(self.topics.events, n) for n in numbers])
        for number in numbers:
            start = starts.get(number)
            if start is None and number in committed:  # a rewind put off: back to the commit
                at = committed[number]
                start = at if at is not None else OFFSET_BEGINNING
            if start is not None:  # the anchor check asks for a rebuild from zero
                at_tp = TopicPartition(self.topics.events, number, start)
                retry(functools.partial(consumer.seek, at_tp), f"seek {at_tp.topic}[{number}]")
            elif (part := self.engine.partitions.get(number)) is not None:
                self._wake_fetch(consumer, number, part.resumed_at)
        fresh = [n for n in numbers if n not in reseek]
        if self.queries is not None and fresh:
            self.queries.assigned(fresh)
        control = self._control()
        if control is not None:
            if fresh:
                control.assign(consumer, fresh)
            if reseek:
                control.rewind(consumer, set(reseek))
        self.assigned_at = time.monotonic()
        # the restored sessions are long-lived and cycle-free: keep the cyclic
        # collector from walking them again (a full pass over 100k sessions
        # stalls every partition ~6 s; gcpolicy.py, BENCHMARKS.md)
        settle_heap()
        self._changed()

    def _wake_fetch(self, consumer: GroupConsumer, number: int, offset: int | None) -> None:
        """Seek a just-resumed partition to the committed offset it resumes at
        (where the consumer starts anyway): only to wake its fetcher."""
        if offset is None:  # nothing committed: auto.offset.reset decides
            return
        try:
            consumer.seek(TopicPartition(self.topics.events, number, offset))
        except KafkaException as exc:  # fetched at the fetcher's own wake-up instead
            log.info("seek of resumed %s[%d] failed: %s", self.topics.events, number, exc)

    def on_revoke(self, consumer: GroupConsumer, partitions: list[TopicPartition]) -> None:
        self.metrics.rebalances.labels("revoke").inc()
        # a fill in progress stops here: the store keeps its applied slices
        self.fill.cancel(tp.partition for tp in partitions)
        for tp in partitions:
            self._started.pop(tp.partition, None)
            self._reseek.discard(tp.partition)
        # A failing commit here aborts the batch and rewinds only the partitions
        # we keep: the revoked ones are the next owner's to restore, and a
        # back-off would only delay the whole group's rebalance.
        c = self.committer
        with c.revoking(tp.partition for tp in partitions):
            try:
                if not self._dead():
                    c.commit()  # finish the open batch while we still own the partitions
            except KafkaException as exc:
                log.warning("commit on revoke failed (%s); aborting the batch", exc)
                c.abort(set())
            finally:
                # the store's queued writes, within what is left of the revoke budget
                # (what misses it is caught up if the partitions come back)
                self.store.flush(max(0.0, c.left() or 0.0))
        for tp in partitions:
            self.engine.drop_partition(tp.partition)
        if self.queries is not None:
            self.queries.revoked(tp.partition for tp in partitions)
        consumer.incremental_unassign(partitions)
        control = self._control()
        if control is not None:
            control.unassign({tp.partition for tp in partitions})
        self._changed()

    def on_lost(self, consumer: GroupConsumer, partitions: list[TopicPartition]) -> None:
        self.metrics.rebalances.labels("lost").inc()
        lost = {tp.partition for tp in partitions}
        self.fill.cancel(lost)
        for p in lost:
            self._started.pop(p, None)
        self._reseek -= lost
        self.committer.abort(lost, rewind=False)
        for p in lost:
            self.engine.drop_partition(p)
        if self.queries is not None:
            self.queries.revoked(lost)
        consumer.incremental_unassign(partitions)
        control = self._control()
        if control is not None:
            control.unassign(lost)
        self._changed()

    def rewind(self, numbers: list[int]) -> None:
        """After an abort: restore these partitions and seek back to the committed offsets."""
        assert self.consumer is not None
        # a partition still filling folded nothing: its fill ends in its own seek
        numbers = [n for n in numbers if n not in self.fill.jobs]
        with self._observing():
            try:
                starts = self.restore(numbers)
                committed = committed_offsets(self.consumer, self.topics.events, numbers)
            except KafkaException as exc:
                # held paused like a new partition's restore put off; seeked back
                # to the committed offset once it ends (_resume)
                self.consumer.pause([TopicPartition(self.topics.events, n) for n in numbers])
                self._put_off(numbers, exc)
                self._reseek.update(numbers)
                return
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
        """Bring partitions' checkpoints into the store at once (after an abort);
        their start-offset overrides.

        The store's fill (background_fill.py) driven to the end at once, with a
        fill consumer of its own, from where the store stands — never the
        events behind them.
        """
        assert self.reader is not None
        if not numbers:
            return {}
        self._prepare(numbers)
        at_once = BackgroundFill(
            self.store,
            self.metrics,
            lambda: self.clients.plain("fill"),
            stall_s=float(self.config.fill_stall_s),
            reports=False,
        )
        filled = at_once.run(self.reader, numbers)
        return self._finish(numbers, filled)

    def _prepare(self, numbers: list[int]) -> None:
        """Before a fill: no zombie transaction open, the store open, the partitions dropped."""
        assert self.reader is not None
        now = time.monotonic()
        for number in numbers:  # a restore put off and tried again: from its first try
            self._started.setdefault(number, now)
        rc, store = self.reader, self.store
        t0 = time.monotonic()
        if self.config.exactly_once:
            # never restore behind a zombie's open transaction (see restore.py)
            unstable = set(
                wait_stable(
                    self.transport.admin,
                    self.topics.checkpoints,
                    numbers,
                    stable_bound_s(self.config),
                    on_open=self.clients.fence.fence if self.clients.fence is not None else None,
                )
            )
        else:
            unstable = set()
        for number in numbers:  # the restore's log line names the wait (issue 37)
            self._stable_s[number] = self._stable_s.get(number, 0.0) + time.monotonic() - t0
        self._unstable |= unstable
        # the restore consumer's metadata, not the group consumer's: a call on the
        # group consumer inside its own rebalance callback clears its call state
        # and librdkafka's next callback aborts the process (seen in test_revoke)
        checkpoints = self.topics.checkpoints
        cluster = retry(lambda: rc.list_topics(checkpoints, timeout=10), "cluster metadata")
        cluster_id = str(getattr(cluster, "cluster_id", "") or "")
        meta = cluster.topics.get(checkpoints) if hasattr(cluster, "topics") else None
        if meta is not None and meta.partitions:
            self.partition_count = len(meta.partitions)
            # co-partitioned with events (preflight.py checks it at start): the
            # engine refuses records outside their key's partition by this count
            self.engine.partition_count = self.partition_count
        store.open(cluster_id, self.transport.topic_id(checkpoints))
        for number in numbers:
            self.engine.drop_partition(number)

    def _finish(self, numbers: list[int], filled: dict[int, Filled]) -> dict[int, int | None]:
        """After the fill: the anchor check, the partitions handed to the engine."""
        assert self.consumer is not None and self.reader is not None
        rc, events, store = self.reader, self.topics.events, self.store
        unstable, self._unstable = self._unstable & set(numbers), self._unstable - set(numbers)
        committed = committed_offsets(self.consumer, events, numbers)
        newest = {p: store.newest(p) for p in numbers}
        anchors = {p: cp.anchor.offset for p, cp in newest.items() if cp is not None}
        # checkpoints ahead of the committed offsets: with transactions a commit
        # not shown yet, waited for (past the wait: go on after the anchor);
        # without them normal (the gate drops the re-read events)
        after: dict[int, int] = {}
        if self.config.exactly_once:
            committed, after = committed_behind(
                self.consumer,
                events,
                anchors,
                committed,
                stable_bound_s(self.config),
                counted=lambda outcome: self.metrics.committed_behind.labels(outcome).inc(),
            )
        found = fetch_events(rc, self.codec, events, anchors) if anchors else {}
        # every read before the first change: a restore put off here changed nothing
        marks = {p: watermarks(rc, events, p) for p in numbers}
        starts: dict[int, int | None] = {}
        for number in numbers:
            cp = newest[number]
            restore = PartitionRestore(number, {cp.session_id: cp} if cp is not None else {})
            problem = check_anchor(
                events,
                restore,
                committed[number],
                found.get(number),
                marks[number],
            ) or self.engine.unusable_rows(restore.checkpoints.values())
            starts[number] = after.get(number)
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
            going_on = number in after and starts[number] == after[number]
            part.maybe_stale = number in unstable and (starts[number] is None or going_on)
            part.resumed_at = starts[number] if going_on else committed[number]
            held = store.sessions(number)
            self.metrics.restored_checkpoints.inc(held)
            f = filled[number]
            log.info(
                "restored partition %d in %.2fs (%.2fs of it for open transactions to end): "
                "%d sessions in the store (%s, %d records read), resuming at %s",
                number,
                time.monotonic() - self._started.get(number, time.monotonic()),
                self._stable_s.pop(number, 0.0),
                held,
                "filled from offset 0" if f.kept_from is None else f"kept to offset {f.kept_from}",
                f.records_read,
                f"offset {starts[number]} (after the newest checkpoint's anchor)"
                if going_on
                else "offset 0"
                if starts[number] is not None
                else f"committed offset {committed[number]}",
            )
        now = time.monotonic()
        began = min((self._started.pop(n, now) for n in numbers), default=now)
        self.metrics.restore_seconds.observe(now - began)
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
            self.store.db(number).drop(self.topics.checkpoints, number)
