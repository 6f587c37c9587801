"""The processor: consume → fold → one transaction per batch.

Loop (SERVICE-DESIGN "Processing loop"):

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
:class:`~processor.service.transport.Transport`: Kafka, or the in-memory
cluster (``memory.py``) the contract suite also runs this loop on.

Transaction errors follow confluent-kafka's model (``kafka_errors.py``):
retriable steps are retried, abortable ones abort and rewind with a
back-off, and a failure repeating past its bound marks ``/readyz`` 503
(``failures.py``); missing permissions and failed handshakes end the
process with one line (:class:`KafkaFatal`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from confluent_kafka import (
    OFFSET_BEGINNING,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from processor.codec import Codec
from processor.config import ServiceConfig
from processor.core.builtin import default_registry
from processor.core.defaults import default_message_projections
from processor.core.errors import ProcessorError
from processor.core.projections import ProjectionRegistry
from processor.engine import Batch, Engine, PartitionState, Record, Tally
from processor.engine.commands import Command
from processor.gcpolicy import settle_heap
from processor.service import clients, faultpoints, preflight, transactions
from processor.service.broker_watch import BrokerWatch
from processor.service.control import ControlChannel
from processor.service.failures import FailureTracker
from processor.service.kafka_errors import (
    ClientProblems,
    KafkaFatal,
    Kind,
    error_of,
    message_error,
)
from processor.service.metrics import Metrics
from processor.service.query_cache import QueryCache, ViewWrite
from processor.service.registry import codec_for
from processor.service.restore import (
    AnchorError,
    check_anchor,
    committed_offsets,
    fetch_events,
    load_checkpoints,
    newest_anchor,
    read_key_range,
    stable_bound_s,
    wait_stable,
)
from processor.service.retry import DEFAULT_DEADLINE_S as RETRY_DEADLINE_S
from processor.service.retry import FENCED, FatalBudget, retry, run_all
from processor.service.transport import (
    GroupConsumer,
    KafkaTransport,
    Msg,
    Reader,
    Transport,
    TxnProducer,
)

log = logging.getLogger("processor.runner")
GAUGE_EVERY_S = 5.0  # lag and session gauges refresh at least this often

#: Header name the old protocol read as a command; it is now ignored on events
#: (kept so tests can prove a forged header does nothing).


def _offset(msg: Msg) -> int:
    offset = msg.offset()
    return offset if offset is not None else -1


def _record(msg: Msg) -> Record:
    """A consumed message as the engine sees it (a broker-less timestamp is now)."""
    ts = msg.timestamp()[1]
    return Record(
        msg.topic() or "",
        msg.partition() or 0,
        _offset(msg),
        msg.key(),
        msg.value(),
        ts if ts > 0 else int(time.time() * 1000),
    )


class Processor:
    """One member of the processor consumer group."""

    def __init__(
        self,
        config: ServiceConfig,
        *,
        metrics: Metrics | None = None,
        registry_factory: Callable[[], ProjectionRegistry] = default_registry,
        codec: Codec | None = None,
        publish_floor: dict[str, int] | None = None,
        transport: Transport | None = None,
    ) -> None:
        """``publish_floor``: session -> seq below which views are not published.

        An in-place replay refolds from seq 0 while the views topic still holds
        the old views; holding each session's views back until it reaches the
        seq it had published keeps ``asOfSeq`` from going backwards.
        ``transport``: where the clients come from (Kafka unless given; the
        contract suite passes the in-memory one, ``memory.py``).
        """
        self.config = config
        self.transport = transport or KafkaTransport(config)
        self.topics = config.topics
        self.instance_id = config.effective_instance_id
        self.metrics = metrics or Metrics()
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
        self._consumer: GroupConsumer | None = None
        self._producer: TxnProducer | None = None
        self._restore_consumer: Reader | None = None
        self.problems = ClientProblems()
        self._failures = FailureTracker(self.metrics)
        self._control: ControlChannel | None = None
        self._dead = False  # a KafkaFatal ended the run: close without committing
        self._gauges_at = 0.0
        self._lag_labels: set[int] = set()
        self._leaving: set[int] = set()  # partitions being revoked (during _on_revoke)
        #: while revoking: the monotonic time the revoke's commit must end by
        #: (``revoke_budget_ms``; the derived transaction timeout assumes it)
        self._deadline: float | None = None
        #: what ended the run, when it was found in a callback (re-raised by the loop)
        self._fatal: ProcessorError | None = None
        self.health = self.metrics.health  # the report; never read to decide
        self._assigned_at = 0.0
        self._fatal_budget = FatalBudget()
        #: views of the owned partitions for queries by session (query_setup.py)
        self.queries: QueryCache | None = None

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
        self, *, max_idle_s: float | None = None, until_offsets: dict[int, int] | None = None
    ) -> None:
        """Consume until :meth:`stop`, ``max_idle_s`` without records, or until every
        partition in ``until_offsets`` is committed up to its target offset."""
        cfg = self.config
        problems = self.problems
        transport = self.transport
        self._consumer = consumer = transport.group_consumer(self.instance_id, problems)
        self._producer = producer = transport.output_producer(self.instance_id, problems)
        own = cfg.group_id  # covered by the group's READ ACL
        self._restore_consumer = transport.plain_consumer("restore", problems, own)
        self._control = ControlChannel(
            transport.plain_consumer("control", problems, own),
            self.topics.control,
            cfg.group_id,
        )
        if cfg.exactly_once:
            transactions.init(
                producer,
                problems,
                f"{cfg.group_id}-{self.instance_id}",
                deadline_s=RETRY_DEADLINE_S,
            )
        transport.require_permissions(self.problems, self.metrics)
        brokers = BrokerWatch(
            problems, self.metrics, lambda: consumer.list_topics(self.topics.events, timeout=2)
        )
        consumer.subscribe(
            [self.topics.events],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        idle_since = time.monotonic()
        interval = cfg.commit_interval_ms / 1000
        try:
            while not self._stop.is_set():
                self.health.tick()
                brokers.tick()
                if time.monotonic() - self._gauges_at >= GAUGE_EVERY_S:
                    self._update_gauges()
                # A batch consume returns only when it is full or its timeout is
                # over, so poll in short slices and date the batch from the poll
                # that brought its first record: the batch then stays open one
                # commit interval, not two (measured: p99 latency ~2x -> ~1x).
                polled_at = time.monotonic()
                msgs = consumer.consume(
                    num_messages=min(cfg.max_batch_events, 5_000), timeout=min(0.02, interval)
                )
                if self._fatal is not None:  # raised in a rebalance callback
                    raise self._fatal
                problems.raise_if_fatal()
                commands = self._control.poll() if self._partitions else []
                if commands:
                    self._apply_commands(commands)
                if msgs or commands or not self._partitions:
                    idle_since = time.monotonic()  # idle counts from the assignment on
                idle_since = max(idle_since, self._assigned_at)
                if msgs:
                    self._fold_batch(msgs, polled_at)
                elif max_idle_s is not None and time.monotonic() - idle_since > max_idle_s:
                    break
                p = self._pending
                if not p.empty() and (
                    p.events >= cfg.max_batch_events or time.monotonic() - p.started >= interval
                ):
                    self._commit()
                if until_offsets is not None and self._reached(until_offsets):
                    break
            self._commit()
        except Exception:
            # the run failed (a refusing broker, a failed restore): leave without
            # the revoke's commit and abort, each of which would wait out its
            # timeout; the uncommitted batch is refolded by the next owner
            self._dead = True
            self.engine.batch = Batch()
            raise
        finally:
            self._close()

    def _timeout(self, default_s: float) -> float:
        """A transaction step's timeout: ``default_s``, or what is left of the
        revoke budget while revoking (a shutdown revokes too), so a revoke
        never outlasts the budget the transaction timeout was sized for."""
        if self._deadline is None:
            return default_s
        return max(0.1, min(default_s, self._deadline - time.monotonic()))

    def _fail(self, error: ProcessorError) -> ProcessorError:
        """Remember what ends the run (a callback cannot end it) and report it."""
        self._fatal = self._fatal or error
        self.health.fatal = self.health.fatal or str(error)
        return error

    def _reached(self, targets: dict[int, int]) -> bool:
        if not self._pending.empty() or set(targets) - set(self._partitions):
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
        c, k, p, r = self._consumer, self._control, self._producer, self._restore_consumer
        self._control = None
        run_all(
            [
                ("control consumer close", k.close if k else None),
                ("consumer close", c.close if c else None),  # revoke runs _commit
                ("producer flush", (lambda: p.flush(0 if self._dead else 10)) if p else None),
                ("restore consumer close", r.close if r else None),
                ("query cache close", self.queries.close if self.queries else None),
            ]
        )
        self._consumer = self._producer = self._restore_consumer = None

    # ------------------------------------------------------------ rebalance

    def _on_assign(self, consumer: GroupConsumer, partitions: list[TopicPartition]) -> None:
        self.metrics.rebalances.labels("assign").inc()
        self.health.ready = False
        starts = self._restore_partitions([tp.partition for tp in partitions])
        assignment = []
        for tp in partitions:
            start = starts.get(tp.partition)
            assignment.append(
                TopicPartition(tp.topic, tp.partition)
                if start is None
                else TopicPartition(tp.topic, tp.partition, start)
            )
        consumer.incremental_assign(assignment)
        if self.queries is not None:
            self.queries.assigned([tp.partition for tp in partitions])
        if self._control is not None:
            self._control.assign(consumer, [tp.partition for tp in partitions])
        self._assigned_at = time.monotonic()
        # the restored sessions are long-lived and cycle-free: keep the cyclic
        # collector from walking them again (a full pass over 100k sessions
        # stalls every partition ~6 s; gcpolicy.py, BENCHMARKS.md)
        settle_heap()
        self.health.ready = True

    def _on_revoke(self, consumer: GroupConsumer, partitions: list[TopicPartition]) -> None:
        self.metrics.rebalances.labels("revoke").inc()
        # A failing commit here aborts the batch and rewinds only the partitions
        # we keep: the revoked ones are the next owner's to restore, and a
        # back-off would only delay the whole group's rebalance.
        self._leaving = {tp.partition for tp in partitions}
        self._deadline = time.monotonic() + self.config.revoke_budget_ms / 1000
        try:
            if not self._dead:
                self._commit()  # finish the open batch while we still own the partitions
        except KafkaException as exc:
            log.warning("commit on revoke failed (%s); aborting the batch", exc)
            self._abort(set())
        finally:
            self._leaving = set()
            self._deadline = None
        for tp in partitions:
            self._partitions.pop(tp.partition, None)
        if self.queries is not None:
            self.queries.revoked(tp.partition for tp in partitions)
        consumer.incremental_unassign(partitions)
        if self._control is not None:
            self._control.unassign({tp.partition for tp in partitions})
        self._update_gauges()

    def _on_lost(self, consumer: GroupConsumer, partitions: list[TopicPartition]) -> None:
        self.metrics.rebalances.labels("lost").inc()
        lost = {tp.partition for tp in partitions}
        self._abort(lost, rewind=False)
        for p in lost:
            self._partitions.pop(p, None)
        if self.queries is not None:
            self.queries.revoked(lost)
        consumer.incremental_unassign(partitions)
        if self._control is not None:
            self._control.unassign(lost)
        self._update_gauges()

    def _restore_partitions(self, numbers: list[int]) -> dict[int, int | None]:
        """Load the checkpoints of newly owned partitions; returns start-offset overrides.

        All partitions are read in one assignment of the restore consumer, so
        the cost is one pass over the (compacted) checkpoints, not one per
        partition — and never the events behind them.
        """
        assert self._consumer is not None and self._restore_consumer is not None
        if not numbers:
            return {}
        t0 = time.monotonic()
        rc, events = self._restore_consumer, self.topics.events
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
        restores = load_checkpoints(rc, self.codec, self.topics.checkpoints, numbers)
        committed = committed_offsets(self._consumer, events, numbers)
        anchors = {
            p: cp.anchor.offset for p, r in restores.items() if (cp := newest_anchor(r)) is not None
        }
        found = fetch_events(rc, self.codec, events, anchors) if anchors else {}
        starts: dict[int, int | None] = {}
        for number in numbers:
            restore = restores[number]
            problem = check_anchor(
                rc, events, restore, committed[number], found.get(number)
            ) or self.engine.unusable_rows(restore.checkpoints.values())
            starts[number] = None
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
                for sid, cp in restore.checkpoints.items():
                    self.engine.tombstone_session(number, sid, cp)
                restore.checkpoints.clear()
                starts[number] = OFFSET_BEGINNING
            part = self._partitions[number] = PartitionState(number, restore.checkpoints)
            part.maybe_stale = number in unstable and starts[number] is None
            part.resumed_at = committed[number]
            self.metrics.restored_checkpoints.inc(len(restore.checkpoints))
            log.info(
                "restored partition %d: %d checkpoints from %d records, resuming at %s",
                number,
                len(restore.checkpoints),
                restore.records_read,
                "offset 0"
                if starts[number] is not None
                else f"committed offset {committed[number]}",
            )
        self.metrics.restore_seconds.observe(time.monotonic() - t0)
        return starts

    # ------------------------------------------------------------ folding

    def _fold_batch(self, msgs: Iterable[Msg], polled_at: float | None = None) -> None:
        t0 = time.perf_counter()
        pending = self._pending
        if pending.empty():
            pending.started = polled_at if polled_at is not None else time.monotonic()
        consumed = 0
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                fatal = message_error(err, msg.topic(), self.config.group_id)
                if fatal is not None:
                    raise self._fail(fatal)
                log.warning("consume error: %s", err)
                continue
            part = self._partitions.get(msg.partition() or 0)
            if part is None:
                continue  # fetched just before a revoke
            consumed += 1
            rec = _record(msg)
            try:
                self.engine.fold(part, rec)
            except (AnchorError, KafkaException):
                raise
            except Exception as exc:  # one record's failure is that record's dead letter
                log.exception(
                    "record %s[%d]@%d could not be interpreted",
                    msg.topic(),
                    part.number,
                    rec.offset,
                )
                self.engine.fail(part, rec, exc)
            pending.offsets[part.number] = rec.offset + 1
        pending.events += consumed
        self.metrics.records_consumed.inc(consumed)
        self._flush_tally()  # one labelled counter update per batch, not per event
        self.metrics.fold_seconds.observe(time.perf_counter() - t0)

    def _apply_commands(self, msgs: Sequence[Msg]) -> None:
        """Operator commands from the control topic (the engine applies them)."""
        if self._pending.empty():
            self._pending.started = time.monotonic()
        self.engine.apply_commands([_record(m) for m in msgs])
        self._flush_tally()

    def _flush_tally(self) -> None:
        """Move the engine's counts into the metrics."""
        tally, self.engine.tally = self.engine.tally, Tally()
        m = self.metrics
        for label, n in tally.events.items():
            m.events.labels(label).inc(n)
        for rule, n in tally.dlq.items():
            m.dlq.labels(rule).inc(n)
        if tally.dlq_oversized:
            m.dlq_oversized.inc(tally.dlq_oversized)
        for label, n in tally.control.items():
            m.control.labels(label).inc(n)
        if tally.views_published:
            m.views_published.inc(tally.views_published)
        if tally.checkpoints_published:
            m.checkpoints_published.inc(tally.checkpoints_published)

    # ------------------------------------------------------------ engine feeds

    def control_backlog(self, partition: int) -> list[Record]:
        """Feeds: the commands committed so far, so a redrive acknowledged before the
        event that follows a quarantine is applied before that event."""
        if self._control is None:
            return []
        return [_record(m) for m in self._control.drain(partition)]

    def session_history(
        self, partition: int, start: int, end: int, key: bytes
    ) -> list[Record] | None:
        """Feeds: a session's events in [start, end), to repair a stale restore."""
        if self._restore_consumer is None:
            return None
        return [
            _record(m)
            for m in read_key_range(
                self._restore_consumer, self.topics.events, partition, start, end, key
            )
        ]

    def check_route(self, command: Command, partition: int) -> None:
        """Feeds: a command must sit in the control partition its key hashes to."""
        if self._control is not None:
            self._control.check_route(command, partition)

    # ------------------------------------------------------------ output

    def _produce(self, topic: str, partition: int, key: bytes | None, value: bytes | None) -> None:
        assert self._producer is not None
        clients.produce(self._producer, topic, key, value, partition=partition)

    def _commit(self) -> None:
        pending = self._pending
        if pending.empty() or self._producer is None or self._consumer is None:
            return
        t0 = time.perf_counter()
        opened = time.monotonic()  # counts a SIGSTOP too, as the coordinator's timeout does
        producer, consumer = self._producer, self._consumer
        eos = self.config.exactly_once
        views: list[ViewWrite] = []  # for the query cache once committed
        try:
            if eos:
                producer.begin_transaction()
            for out in self.engine.output():
                self._produce(out.topic, out.partition, out.key, out.value)
                if self.queries is not None and out.topic == self.topics.views and out.key:
                    views.append((out.partition, out.key, out.value))
            offsets = [TopicPartition(self.topics.events, p, o) for p, o in pending.offsets.items()]
            offsets += [
                TopicPartition(self.topics.control, p, o)
                for p, o in pending.control_offsets.items()
            ]
            if eos:
                faultpoints.hit(faultpoints.BEFORE_SEND_OFFSETS, lambda: producer.flush(30))
                if offsets:
                    transactions.retrying(
                        lambda: producer.send_offsets_to_transaction(
                            offsets, consumer.consumer_group_metadata(), self._timeout(30)
                        ),
                        self.metrics,
                    )
                transactions.retrying(
                    lambda: producer.commit_transaction(self._timeout(60)), self.metrics
                )
            else:
                remaining = producer.flush(self._timeout(60))
                if remaining:
                    raise KafkaException(
                        KafkaError(KafkaError._TIMED_OUT, f"{remaining} records not delivered")
                    )
                if self.queries is not None:  # delivered = visible without transactions
                    self.queries.committed(views)
                    views = []
                if offsets:
                    consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            self._flush_tally()
            # serve the delivery reports of failed records (poll re-raises a fatal
            # error, classified just below)
            with contextlib.suppress(KafkaException):
                producer.poll(0)
            verdict = transactions.verdict(exc, self.problems, self.config.group_id)
            self.metrics.txn_failures.labels(verdict.kind.value).inc()
            err = error_of(exc)
            if (
                verdict.kind is Kind.FATAL
                and eos
                and err is not None
                and self._replace_producer(err, time.monotonic() - opened)
            ):
                pass  # the new producer fenced the broken one; refold below
            elif verdict.kind in (Kind.FATAL, Kind.DENIED):
                line = verdict.line
                if verdict.kind is Kind.DENIED:  # the broker rarely says which ACL
                    line = "; ".join(preflight.missing_or_fatal(self.config, self.problems)) or line
                raise self._fail(KafkaFatal(line)) from None
            else:
                log.warning("transaction failed (%s); aborting and rewinding", verdict.line)
            self._abort(pending.partitions())
            backoff = self._failures.failed(verdict.line)
            if not self._leaving:
                self._stop.wait(backoff)
            return
        self._flush_tally()
        if self.queries is not None:
            self.queries.committed(views)
        self._failures.succeeded()
        self.metrics.commits.inc()
        self.metrics.batch_events.observe(pending.events)
        self.metrics.commit_seconds.observe(time.perf_counter() - t0)
        self.engine.batch = Batch()
        self._update_gauges()

    def _replace_producer(self, err: KafkaError, open_s: float) -> bool:
        """Survive a fatal producer error that a broker fault caused.

        A coordinator moving during a commit can leave librdkafka's
        transactional producer fatally broken (INVALID_TXN_STATE, seen in the
        fault suite); a new producer with the same transactional id fences
        the old one and aborts its open transaction, and the batch is then
        refolded from the checkpoints.  A fence within the transaction
        timeout (``open_s``: how long the failed transaction was open) while
        every broker answers means another live member has our instance id:
        that ends the process (``FENCED``).  Shortly after a broker went away
        a coordinator fails over and may fence the transaction itself (seen
        in the fault suite): that is answered with a new producer.  Bounded
        (FatalBudget): a cause that persists — missing ACLs — still ends the
        process.
        """
        timeout_s = self.config.effective_transaction_timeout_ms / 1000
        trouble = self.problems.broker_trouble_at
        cluster_fault = trouble is not None and time.monotonic() - trouble < 2 * timeout_s
        if err.code() in FENCED and open_s < timeout_s and not cluster_fault:
            log.error(
                "producer fenced after %.1f s, within the transaction timeout (%.1f s) "
                "and with every broker answering: another member runs with instance "
                "id %r",
                open_s,
                timeout_s,
                self.instance_id,
            )
            return False
        if not self._fatal_budget.allow(err):
            return False
        log.error("producer fatal error (%s); replacing the producer", err)
        self._producer = producer = self.transport.output_producer(self.instance_id, self.problems)
        transactions.init(
            producer,
            self.problems,
            f"{self.config.group_id}-{self.instance_id}",
            deadline_s=RETRY_DEADLINE_S,
        )
        return True

    def _abort(self, partitions: set[int], *, rewind: bool = True) -> None:
        """Drop the open batch; restore touched partitions from the checkpoints."""
        if self.config.exactly_once and self._producer is not None:
            producer = self._producer
            try:
                retry(lambda: producer.abort_transaction(30), "abort_transaction")
            except KafkaException as exc:
                log.debug("abort_transaction: %s", exc)
        self.metrics.aborts.inc()
        touched = self._pending.partitions() | partitions
        self.engine.batch = Batch()
        if not rewind or self._consumer is None:
            return
        numbers = sorted(touched & set(self._partitions) - self._leaving)
        if not numbers:  # all revoked (a shutdown): nothing of ours to rewind
            return
        starts = self._restore_partitions(numbers)
        committed = committed_offsets(self._consumer, self.topics.events, numbers)
        for number in numbers:
            start = starts.get(number)
            at = committed[number]
            offset = start if start is not None else (at if at is not None else OFFSET_BEGINNING)
            tp = TopicPartition(self.topics.events, number, offset)
            retry(functools.partial(self._consumer.seek, tp), f"seek {tp.topic}[{number}]")
        if self._control is not None:
            self._control.rewind(self._consumer, set(numbers))

    def _update_gauges(self) -> None:
        """Sessions, quarantines and lag; called after commits and rebalances, and
        every ``GAUGE_EVERY_S`` from the loop, so a partition that stops moving
        shows its lag growing (an alert cannot see a gauge that is never set)."""
        self._gauges_at = time.monotonic()
        for gone in self._lag_labels - set(self._partitions):  # revoked: not ours to report
            with contextlib.suppress(KeyError):
                self.metrics.lag.remove(str(gone))
        self._lag_labels &= set(self._partitions)
        self.metrics.sessions.set(self.engine.sessions_held())
        self.metrics.quarantined.set(self.engine.sessions_quarantined())
        if self._consumer is None:
            return
        for number, part in self._partitions.items():
            tp = TopicPartition(self.topics.events, number)
            try:
                low, high = self._consumer.get_watermark_offsets(tp, cached=True)
                pos = self._consumer.position([tp])[0].offset
            except KafkaException:
                continue
            if pos < 0:  # nothing consumed since the assignment: where the restore resumed
                pos = part.resumed_at if part.resumed_at is not None else low
            if high >= 0 and pos >= 0:
                self.metrics.lag.labels(str(number)).set(max(high - pos, 0))
                self._lag_labels.add(number)
