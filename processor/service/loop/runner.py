"""The processor: consume → fold → one transaction per batch.

Loop:

1. ``consume`` a batch, decode, route each record to its session;
2. the seq gate and the core fold, per session, in partition order;
3. when the commit interval has passed (or the batch is full): produce the
   changed views (coalesced, one record per session and view), the dirty
   checkpoints and the DLQ records, ``send_offsets_to_transaction`` and
   commit — views, checkpoints, dead letters and consumer offsets become
   visible together or not at all.

Folding mutates in-memory sessions before the transaction commits; if the
transaction aborts, the sessions of the affected partitions are dropped,
restored from their checkpoints and the consumer is sent back to the
committed offsets, so an abort can never leak half a batch.

Every decision that is not I/O — the seq gate, dead letters, quarantine and
its redrive, which views and checkpoints a batch produces — is the pure
engine's (``processor/engine``); this module moves bytes and offsets: it
turns messages into engine records, produces the engine's output and owns
the transaction, the rebalance callbacks and the restore.  Bad input never
stops a partition: any failure interpreting one record is that record's
dead letter (headers on event records are never commands: commands travel
on their own topic, ``control.py``).  The clients come from a
:class:`~processor.kafka.transport.Transport`: Kafka, or the in-memory
cluster (``testing/memory.py``) the contract suite also runs this loop on.

Transaction errors follow confluent-kafka's model (``kafka/client_errors.py``):
retriable steps are retried, abortable ones abort and rewind with a
back-off, and a failure repeating past its bound marks ``/readyz`` 503
(``failures.py``); missing permissions and failed handshakes end the
process with one line (:class:`KafkaFatal`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from processor.codec import Codec
from processor.config import ServiceConfig
from processor.core.builtin import default_registry
from processor.core.defaults import default_message_projections
from processor.core.errors import ProcessorError
from processor.core.projections import ProjectionRegistry
from processor.core.sharing import tables as sharing_tables
from processor.engine import Batch, Engine, PartitionState, Record
from processor.engine.commands import Command
from processor.engine.dead_letters import MAX_BATCH_DEAD_LETTER_BYTES
from processor.engine.replay_floor import PublishFloor
from processor.kafka.client_errors import ClientProblems, message_error
from processor.kafka.reads import read_key_range
from processor.kafka.retry import observing, run_all
from processor.kafka.schema_registry import codec_for
from processor.kafka.transport import GroupConsumer, Msg, Transport
from processor.service.loop.control import ControlChannel
from processor.service.loop.fold_loop import fold_messages, record_of
from processor.service.loop.heap import HeapPolicy
from processor.service.loop.idle import Behind, IdleClock, behind_end
from processor.service.loop.member_clients import MemberClients, with_group_protocol
from processor.service.ops.broker_watch import BrokerWatch
from processor.service.ops.group_watch import GroupWatch, in_trouble
from processor.service.ops.join_refusal import join_refused
from processor.service.ops.stall_watch import ProgressWatch
from processor.service.partitions.rebalance import Rebalance
from processor.service.queries.queries import Queries
from processor.service.queries.query_cache import QueryCache
from processor.service.queries.query_setup import member_cache
from processor.service.store.checkpoint_store import CheckpointStore
from processor.service.txn.commit import Committer
from processor.telemetry.metrics import Metrics

log = logging.getLogger(__name__)
GAUGE_EVERY_S = 5.0  # lag and session gauges refresh at least this often
#: records one ``consume`` asks for at most (fewer when ``max_batch_events`` is lower);
#: a call that comes back with this many finds the consumer behind (catch-up)
CONSUME_AT_MOST = 5_000


class Processor:
    """One member of the processor consumer group."""

    def __init__(
        self,
        config: ServiceConfig,
        *,
        metrics: Metrics | None = None,
        registry_factory: Callable[[], ProjectionRegistry] = default_registry,
        codec: Codec | None = None,
        publish_floor: Mapping[str, int | PublishFloor] | None = None,
        transport: Transport | None = None,
        queries: Queries | None = None,
    ) -> None:
        """``publish_floor``: session -> seq below which views are not published.

        An in-place replay refolds from seq 0 while the views topic still holds
        the old views; holding each session's views back until it reaches the
        seq it had published keeps ``asOfSeq`` from going backwards.
        ``transport``: where the clients come from (Kafka unless given; the
        contract suite passes the in-memory one, ``testing/memory.py``).
        ``queries``: answer queries by session from a cache of the committed
        views of the owned partitions (``query_setup.py``).
        """
        self.metrics = metrics or Metrics()
        # ``group_protocol = "auto"``: the broker asked once (group_protocol.py)
        config, self.transport = with_group_protocol(config, transport, self.metrics)
        self.config = config
        self.topics = config.topics
        self.instance_id = config.effective_instance_id
        self.codec = codec or codec_for(config, writer=True)  # Confluent framing with a registry
        self.registry = registry_factory()
        self.message_projections = default_message_projections()
        # every decision that is not I/O; it asks this object for the control
        # backlog and a session's history (the Feeds methods below)
        self.engine = Engine(
            config,
            self.codec,
            self.registry,
            self.message_projections,
            instance_id=self.instance_id,
            publish_floor=publish_floor,
            feeds=self,
        )
        self._stop = threading.Event()
        #: events of the open batch a stop left uncommitted (no broker answered)
        self.uncommitted: int | None = None
        self.problems = ClientProblems()
        #: the run's Kafka clients, made by run() (member_clients.py)
        self.clients = MemberClients(
            config, self.transport, self.problems, self.metrics, instance_id=self.instance_id
        )
        self._control: ControlChannel | None = None
        self._dead = False  # a KafkaFatal ended the run: close without committing
        self._gauges_at = 0.0
        self._lag_labels: set[int] = set()
        #: (position, high watermark) of each folding partition, as the gauges last read
        self._seen: dict[int, tuple[int, int]] = {}
        #: where the watchdog last sought a partition (its state then): the client
        #: forgets the position at a seek until it reads again
        self._sought: dict[int, tuple[PartitionState, int]] = {}
        #: partitions with lag whose position stopped moving (stall_watch.py)
        self.progress = ProgressWatch(
            self.metrics,
            self._reseek,
            stall_s=config.effective_stall_s,
            reseeks=config.stall_reseeks,
        )
        #: what ended the run, when it was found in a callback (re-raised by the loop)
        self._fatal: ProcessorError | None = None
        #: the collector's thresholds and periodic heap settles (heap.py)
        self.heap = HeapPolicy()
        self.health = self.metrics.health  # the report; never read to decide
        self._group_watch: GroupWatch | None = None
        #: the checkpoints of the owned partitions on local disk (checkpoint_store.py)
        self.store = CheckpointStore(
            config,
            self.codec,
            on_queue_full=self.metrics.store_write_queue_full.inc,
            on_drop=self.metrics.store_partitions_dropped.inc,  # verify's drops
            size_gauge=self.metrics.store_bytes,
        )
        #: the committed views of the owned partitions, for queries (query_setup.py)
        self.queries: QueryCache | None = None
        if queries is not None:
            self.queries = member_cache(
                config, self.codec, self.clients.plain, self.metrics.registry, queries
            )
        #: the transaction of the open batch (commit.py)
        self.txn = Committer(
            config,
            self.clients,
            self.engine,
            self.store,
            self.metrics,
            queries=self.queries,
            rewinder=self,
            fail=self._fail,
            stop=self._stop,
        )
        #: the rebalance callbacks and the restore (rebalance.py)
        self.rebalance = Rebalance(
            config,
            self.clients,
            self.codec,
            self.engine,
            self.store,
            self.txn,
            self.metrics,
            queries=self.queries,
            fail=self._fail,
            control=lambda: self._control,
            dead=lambda: self._dead,
            changed=self._update_gauges,
        )

    @property
    def _consumer(self) -> GroupConsumer | None:
        return self.clients.consumer

    def rewind(self, numbers: list[int]) -> None:
        """Rewinder (commit.py): after an abort, restore the partitions (rebalance.py)."""
        self.rebalance.rewind(numbers)

    @property
    def _partitions(self) -> dict[int, PartitionState]:
        return self.engine.partitions

    @property
    def _pending(self) -> Batch:
        return self.engine.batch

    # ------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        self._stop.set()

    def run(
        self,
        *,
        max_idle_s: float | None = None,
        until_offsets: dict[int, int] | None = None,
        max_wait_s: float | None = None,
    ) -> None:
        """Consume until :meth:`stop`, ``max_idle_s`` idle, or until every
        partition in ``until_offsets`` is committed up to its target offset.

        Idle time counts only while every assigned partition is fetched to its
        end and no batch, commit, fill or command is in flight (``idle.py``): a
        slow first fetch never ends a run that has records waiting.  Partitions
        that never reach their end (no leader, a stalled fetch) hold the run at
        most ``max_wait_s`` without records or watermark movement (default
        ``max(10 x max_idle_s, 60 s)``); then it ends with a warning naming them.
        """
        cfg = self.config
        problems = self.problems
        transport = self.transport
        consumer = self.clients.open()
        self._control = ControlChannel(
            self.clients.plain("control"), self.topics.control, cfg.group_id
        )
        # the producer's init beside the permission check (member_clients.py)
        self.clients.start(self.txn.start)
        probe = lambda: consumer.list_topics(self.topics.events, timeout=2)  # noqa: E731
        brokers = BrokerWatch(problems, self.metrics, probe, every_s=cfg.broker_probe_s)
        # another application's consumers in the group (group_watch.py); only a
        # transport that can describe the group has the watch
        describe = getattr(transport, "group_members", None)
        if describe is not None:
            down = lambda: in_trouble(problems)  # noqa: E731
            self._group_watch = GroupWatch(
                cfg.group_id, describe, self._report_foreign, cfg.group_watch_s, down
            )
            self._group_watch.start()
        consumer.subscribe(
            [self.topics.events],
            on_assign=self.rebalance.on_assign,
            on_revoke=self.rebalance.on_revoke,
            on_lost=self.rebalance.on_lost,
        )
        drained_at = time.monotonic()
        idle = IdleClock(max_idle_s or 0.0, max_wait_s, drained_at)
        interval = cfg.commit_interval_ms / 1000
        self.heap.start()
        try:
            while not self._stop.is_set():
                self.health.tick()
                brokers.tick()
                # finish the commit in flight if it has ended; here, not after the
                # consume: the heap settle would walk and freeze the fresh records
                self.txn.poll()
                self._after_commit()
                if time.monotonic() - self._gauges_at >= GAUGE_EVERY_S:
                    self._tick()
                # A batch consume returns only when it is full or its timeout is
                # over, so poll in short slices.  Date a new batch from when the
                # queue was last seen drained (the previous consume's return):
                # records that arrived while the loop was committing have waited
                # since then, so the batch closes one interval after its oldest
                # record could have arrived, not one interval after the commit
                # that made it wait (measured, figure 5: p99 ~ I + 2C -> I + C
                # for a transaction time C).  Never older than one interval (a
                # long restore inside the poll).  A slice ends when the open
                # batch is due, so it closes on time, not up to a slice late.
                polled_at = time.monotonic()
                slice_s = min(0.02, interval)
                if not self._pending.empty():
                    due = self._pending.started + interval - polled_at
                    slice_s = max(0.0, min(slice_s, due))
                    if slice_s <= 0 and self.txn.busy:
                        # due while the previous commit still runs: wait for that
                        # commit, not for records, then take what came meanwhile
                        self.txn.wait_in_flight(0.02)
                asked = min(cfg.max_batch_events, CONSUME_AT_MOST)
                msgs = consumer.consume(num_messages=asked, timeout=slice_s)
                # a full call: more records were queued, the consumer is behind
                behind = len(msgs) >= asked
                dated = max(drained_at, polled_at - interval)
                drained_at = time.monotonic()
                if self._fatal is not None:  # raised in a rebalance callback
                    raise self._fatal
                problems.raise_if_fatal()
                filling = self.rebalance.fill.jobs
                # one bounded slice of the new partitions' fills (background_fill.py),
                # else of the standby copies' catch-up (standby.py)
                self.rebalance.fill_step(behind)
                commands = self._control.poll() if self._partitions else []
                if commands:
                    self._apply_commands(commands)
                # idle counts only with nothing in flight and every partition
                # fetched to its end (idle.py), never from the assignment alone
                now = time.monotonic()
                if (
                    msgs
                    or commands
                    or filling
                    or not self._partitions
                    or not self._pending.empty()
                    or self.txn.in_flight
                    or self.rebalance.assigned_at > idle.idle_since
                ):
                    idle.busy(now)
                if msgs:
                    # /readyz names a wait inside the fold (a schema registry lookup)
                    with observing(self.metrics.retries):
                        self._fold_batch(msgs, dated)
                    # let the batch's messages go before the next heap settle, which
                    # would otherwise walk and freeze all of them (heap.py)
                    msgs = []
                elif max_idle_s is not None and idle.over(now, self._behind()):
                    break
                p = self._pending
                # bounded: a flood of dead letters is committed, not held (dead_letters.py)
                flood = p.dead_letter_bytes >= MAX_BATCH_DEAD_LETTER_BYTES
                if not p.empty() and (
                    p.events >= cfg.max_batch_events
                    or flood
                    # A due batch whose predecessor still commits keeps folding
                    # until that commit ends: it could not begin sooner, and what
                    # arrives meanwhile rides along instead of waiting for the
                    # next transaction, a whole commit later (figure 5)
                    or (
                        time.monotonic() - p.started >= interval
                        and not self.txn.busy
                        and not self._catching_up(behind)
                    )
                ):
                    if flood:
                        self.metrics.dlq_batch_closes.inc()
                    # commit_transaction overlaps the next batch's fold (commit.py)
                    self._commit(overlap=True)
                if until_offsets is not None and self._reached(until_offsets):
                    break
            if self._stop.is_set() and problems.brokers_down_at is not None:
                # no broker answers: a commit could only wait out its timeouts;
                # the next owner folds the open batch again (stopping.py)
                self.uncommitted, self._dead = self._pending.events, True
                self.engine.discard_batch()
            else:
                self._commit()
        except Exception:
            # the run failed (a refusing broker, a failed restore): leave without
            # the revoke's commit and abort, each of which would wait out its
            # timeout; the uncommitted batch is refolded by the next owner
            self._dead = True
            self.engine.discard_batch()
            raise
        finally:
            self.heap.stop()
            if self._group_watch is not None:
                self._group_watch.stop()
            self._close()

    def _report_foreign(self, count: int, line: str | None) -> None:
        self.metrics.foreign_members.set(count)
        self.health.foreign = line

    def _behind(self) -> Behind:
        """The events and control partitions not fetched to their end (idle.py)."""
        assert self._consumer is not None
        behind = behind_end(self._consumer, self.topics.events, self._partitions)
        if self._control is not None:
            control = self.topics.control
            behind.update({f"{control}[{n}]": (-1, -1) for n in self._control.behind()})
        return behind

    def _catching_up(self, behind: bool) -> bool:
        """A due batch keeps folding while the consumer is behind (its last consume
        came back full): those records are late already, and fewer, larger
        transactions catch up sooner -- each produces a session's views and
        checkpoint once, however many of its events it holds (a backlog at the
        200 ms interval spent half the loop's time producing them, figure 1).
        Bounded by ``max_batch_events`` (the close above) and by the
        state budget (sessions are evicted only after a commit)."""
        budget = self.config.state_budget_bytes
        return behind and (budget <= 0 or self.engine.held.bytes < budget)

    def _fail(self, error: ProcessorError) -> ProcessorError:
        """Remember what ends the run (a callback cannot end it) and report it."""
        self._fatal = self._fatal or error
        self.health.fatal = self.health.fatal or str(error)
        return error

    def _reached(self, targets: dict[int, int]) -> bool:
        if self.txn.in_flight or not self._pending.empty() or set(targets) - set(self._partitions):
            return False
        assert self._consumer is not None
        tps = [TopicPartition(self.topics.events, p) for p in targets]
        positions = {tp.partition: tp.offset for tp in self._consumer.position(tps)}
        if any(o < 0 for o in positions.values()):
            # no record consumed since the assignment: the committed offset is
            # where this member stands
            for tp in self._consumer.committed(tps, timeout=30):
                if positions[tp.partition] < 0:
                    positions[tp.partition] = tp.offset
        return all(positions[p] >= target or target <= 0 for p, target in targets.items())

    def _close(self) -> None:
        c, k, p, r = self._consumer, self._control, self.txn.producer, self.clients.reader
        self._control = None
        run_all(
            [
                ("control consumer close", k.close if k else None),
                ("consumer close", c.close if c else None),  # revoke runs the commit
                ("producer flush", (lambda: p.flush(0 if self._dead else 10)) if p else None),
                ("restore consumer close", r.close if r else None),
                ("fill consumers close", self.rebalance.close_fills),
                ("local store close", self.store.close),
                ("query cache close", self.queries.close if self.queries else None),
                ("transaction helper close", self.txn.close),
            ]
        )
        self.clients.release()

    # ------------------------------------------------------------ folding

    def _fold_batch(self, msgs: Iterable[Msg], polled_at: float | None = None) -> None:
        t0 = time.perf_counter()
        pending = self._pending
        if pending.empty():
            pending.started = polled_at if polled_at is not None else time.monotonic()
        # per record: compiled (fold_loop.py)
        consumed = fold_messages(self.engine, msgs, self._consume_error)
        pending.events += consumed
        self.metrics.records_consumed.inc(consumed)
        self._count_state()  # decisions count when committed (commit.py)
        self.metrics.fold_seconds.observe(time.perf_counter() - t0)

    def _consume_error(self, msg: Msg) -> None:
        """A consume error in a record's place: end of partition, fatal or logged."""
        err = msg.error()
        assert err is not None
        if err.code() == KafkaError._PARTITION_EOF:
            return
        fatal = message_error(err, msg.topic(), self.config.group_id)
        if fatal is not None:
            raise self._fail(fatal)
        refused = join_refused(err, self.config.group_id)
        if refused is not None:  # named on /readyz until assigned, logged once (join_refusal.py)
            if refused != self.health.group:
                log.error("%s", refused)
            self.health.group = refused
            return
        log.warning("consume error: %s", err)

    def _apply_commands(self, msgs: Sequence[Msg]) -> None:
        """Operator commands from the control topic (the engine applies them)."""
        if self._pending.empty():
            self._pending.started = time.monotonic()
        self.engine.apply_commands([record_of(m) for m in msgs])
        self._count_state()

    def _count_state(self) -> None:
        """Move the engine's state counts (loads, evictions) into the metrics.

        The decisions of the open batch (applied, rejected, dead letters,
        commands, records published) are counted once its transaction commits
        (commit.py), and dropped when it aborts, so a refolded batch is not
        counted twice.
        """
        self.metrics.count_state(self.engine.take_state_counts())

    # ------------------------------------------------------------ engine feeds

    def control_backlog(self, partition: int) -> list[Record]:
        """Feeds: the commands committed so far, so a redrive acknowledged before the
        event that follows a quarantine is applied before that event."""
        if self._control is None:
            return []
        return [record_of(m) for m in self._control.drain(partition)]

    def session_history(
        self, partition: int, start: int, end: int, key: bytes
    ) -> list[Record] | None:
        """Feeds: a session's events in [start, end), to repair a stale restore."""
        reader = self.clients.reader
        if reader is None:
            return None
        return [
            record_of(m)
            for m in read_key_range(reader, self.topics.events, partition, start, end, key)
        ]

    def check_route(self, command: Command, partition: int) -> None:
        """Feeds: a command must sit in the control partition its key hashes to."""
        if self._control is not None:
            self._control.check_route(command, partition)

    # ------------------------------------------------------------ output

    def _commit(self, *, overlap: bool = False) -> None:
        """Commit the open batch (commit.py); ``overlap``: let its
        ``commit_transaction`` run while the loop folds the next batch."""
        self.txn.commit(overlap=overlap)
        self._after_commit()

    def _after_commit(self) -> bool:
        """If a batch committed (the store has it): keep the sessions within budget.
        Whether it did (then it evicted and set the gauges)."""
        if not self.txn.take_committed():
            return False
        self.heap.committed()
        self._evict()
        self._update_gauges()
        return True

    def _tick(self) -> None:
        """Every ``GAUGE_EVERY_S``: idle sessions go and the gauges refresh even
        when nothing commits; once, also when a commit settles here."""
        self.txn.settle()  # an in-flight commit's sessions are not in the store yet
        if not self._after_commit():  # else it evicted and set the gauges
            self._evict()
            self._update_gauges()
        # here, not in _update_gauges: that also runs inside rebalance callbacks,
        # where a seek on the group consumer is not ours to make
        filling = self.rebalance.fill.jobs
        self.progress.check({n: s for n, s in self._seen.items() if n not in filling})

    def _reseek(self, number: int, offset: int) -> None:
        """The watchdog's seek: restart a stalled partition's fetch at ``offset``."""
        assert self._consumer is not None
        self._consumer.seek(TopicPartition(self.topics.events, number, offset))
        part = self._partitions.get(number)
        if part is not None:
            self._sought[number] = (part, offset)

    def _evict(self) -> None:
        cfg = self.config
        for number in self.store.broken:  # its newest checkpoints may be in memory only
            part = self._partitions.get(number)
            if part is not None:
                part.pinned = True
        self.engine.evict(
            cfg.state_budget_bytes, cfg.idle_evict_s, time.monotonic(), self.txn.committing()
        )
        self._count_state()

    def _update_gauges(self) -> None:
        """Sessions, quarantines and lag; called after commits and rebalances, and
        every ``GAUGE_EVERY_S`` from the loop, so a partition that stops moving
        shows its lag growing (an alert cannot see a gauge that is never set)."""
        self._gauges_at = time.monotonic()
        for gone in self._lag_labels - set(self._partitions):  # revoked: not ours to report
            with contextlib.suppress(KeyError):
                self.metrics.lag.remove(str(gone))
        self._lag_labels &= set(self._partitions)
        for gone in set(self._sought) - set(self._partitions):
            del self._sought[gone]
        self.metrics.sessions.set(self.engine.sessions_held())
        self.metrics.state_bytes.set(self.engine.held.bytes)
        self.metrics.report_sharing(sharing_tables())
        if self.store.problem != self.health.store:
            self.health.set_store(self.store.problem)
        self.metrics.quarantined.set(self.engine.sessions_quarantined())
        self._seen = {}
        if self._consumer is None:
            return
        for number, part in self._partitions.items():
            tp = TopicPartition(self.topics.events, number)
            try:
                low, high = self._consumer.get_watermark_offsets(tp, cached=True)
                pos = self._consumer.position([tp])[0].offset
            except KafkaException:
                continue
            sought = self._sought.pop(number, None)
            if pos < 0 and sought is not None and sought[0] is part:
                pos = sought[1]  # nothing read since the watchdog's seek: where it sought
                self._sought[number] = sought
            elif pos < 0:  # nothing consumed since the assignment: where the restore resumed
                pos = part.resumed_at if part.resumed_at is not None else low
            if high >= 0 and pos >= 0:
                self.metrics.lag.labels(str(number)).set(max(high - pos, 0))
                self._lag_labels.add(number)
                self._seen[number] = (pos, high)
