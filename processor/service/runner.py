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

Bad input never stops a partition: an undecodable record, an invalid event,
a gap, a conflicting duplicate or an unknown required type goes to the DLQ
with its reason, the session is quarantined at its last valid seq (its
``status`` view says why, its other views stay), and its later events go to
the DLQ as well until an operator re-drives it (``control.py``: commands on
their own topic; headers on event records are never commands).  Any failure
interpreting one record is that record's dead letter, and a dead letter
always fits (``dead_letters.py``).  Every other session keeps flowing.

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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from processor.core.builtin import default_registry
from processor.core.errors import SessionError
from processor.core.message_projections import default_message_projections
from processor.core.projections import ProjectionRegistry
from processor.core.session import CHECKPOINT_VERSION, Session, synthetic_header
from processor.service import clients, faultpoints, preflight, transactions
from processor.service.broker_watch import BrokerWatch
from processor.service.codec import (
    Anchor,
    Checkpoint,
    Codec,
    CodecError,
    DeadLetter,
    View,
    default_codec,
    session_key,
    split_view,
    stale_part_keys,
    view_key,
)
from processor.service.config import ServiceConfig
from processor.service.control import (
    CommandError,
    ControlChannel,
    apply_command,
    parse_command,
)
from processor.service.dead_letters import MAX_KEY_BYTES, bounded
from processor.service.failures import FailureTracker
from processor.service.kafka_errors import (
    ClientProblems,
    KafkaFatal,
    Kind,
    error_of,
    message_error,
)
from processor.service.metrics import Metrics
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
from processor.service.state import Quarantine, SessionRuntime, ViewChange

log = logging.getLogger("processor.runner")
GAUGE_EVERY_S = 5.0  # lag and session gauges refresh at least this often

#: Header name the old protocol read as a command; it is now ignored on events
#: (kept so tests can prove a forged header does nothing).
CONTROL_HEADER = "processor-control"
CORE_VIEW_NAMES = ("messages", "surface", "transcript", "status")


@dataclass
class _Pending:
    """Work folded since the last commit, by partition."""

    offsets: dict[int, int] = field(default_factory=dict)
    control_offsets: dict[int, int] = field(default_factory=dict)
    dirty: dict[tuple[int, str], SessionRuntime] = field(default_factory=dict)
    dead_letters: list[tuple[int, DeadLetter]] = field(default_factory=list)
    tombstones: list[tuple[str, int, bytes]] = field(default_factory=list)
    events: int = 0
    started: float = 0.0

    def empty(self) -> bool:
        return not (self.offsets or self.dirty or self.dead_letters or self.tombstones
                    or self.control_offsets)

    def partitions(self) -> set[int]:
        return (set(self.offsets) | set(self.control_offsets) | {p for p, _ in self.dirty}
                | {p for p, _ in self.dead_letters} | {p for _, p, _ in self.tombstones})


def _offset(msg: Message) -> int:
    offset = msg.offset()
    return offset if offset is not None else -1


class _Partition:
    """Sessions of one assigned events partition."""

    def __init__(self, number: int, checkpoints: dict[str, Checkpoint]) -> None:
        self.number = number
        self.checkpoints = checkpoints  # not yet materialised sessions
        # quarantined session ids, kept as they change so the gauge is O(partitions)
        self.quarantined = {sid for sid, cp in checkpoints.items()
                            if (cp.surface.get("service") or {}).get("quarantine")}
        self.sessions: dict[str, SessionRuntime] = {}
        self.view_parts: dict[tuple[str, str], int] = {}
        # Restored while a transaction was still open on the checkpoints
        # partition (the wait gave up): a checkpoint may be stale (or hidden
        # altogether), so a gap in a session with nothing folded since the
        # restore is repaired from the events (_repair_stale).
        self.maybe_stale = False
        self.resumed_at: int | None = None  # committed offset the restore resumed at
        self.fresh: set[str] = set()  # sessions with no event folded since the restore


class Processor:
    """One member of the processor consumer group."""

    def __init__(self, config: ServiceConfig, *, metrics: Metrics | None = None,
                 registry_factory: Callable[[], ProjectionRegistry] = default_registry,
                 codec: Codec | None = None,
                 publish_floor: dict[str, int] | None = None) -> None:
        """``publish_floor``: session -> seq below which views are not published.

        An in-place replay refolds from seq 0 while the views topic still holds
        the old views; holding each session's views back until it reaches the
        seq it had published keeps ``asOfSeq`` from going backwards.
        """
        self.config = config
        self.topics = config.topics
        self.instance_id = config.effective_instance_id
        self.metrics = metrics or Metrics()
        self.codec = codec or default_codec()
        self.registry = registry_factory()
        self.message_projections = default_message_projections()
        self._stop = threading.Event()
        self._partitions: dict[int, _Partition] = {}
        self._pending = _Pending()
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._restore_consumer: Consumer | None = None
        self.problems = ClientProblems()
        self._failures = FailureTracker(self.metrics)
        self._control: ControlChannel | None = None
        self._dead = False  # a KafkaFatal ended the run: close without committing
        self._gauges_at = 0.0
        self._lag_labels: set[int] = set()
        self._publish_floor = dict(publish_floor or {})
        self._assigned_at = 0.0
        self._applied = 0
        self._replaying = False  # refolding history another owner already committed
        self._fatal_budget = FatalBudget()

    # ------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        self._stop.set()

    def run(self, *, max_idle_s: float | None = None,
            until_offsets: dict[int, int] | None = None) -> None:
        """Consume until :meth:`stop`, ``max_idle_s`` without records, or until every
        partition in ``until_offsets`` is committed up to its target offset."""
        cfg = self.config
        problems = self.problems
        self._consumer = consumer = clients.group_consumer(cfg, self.instance_id, problems)
        self._producer = producer = clients.output_producer(cfg, self.instance_id, problems)
        own = {"group": cfg.group_id}  # covered by the group's READ ACL
        self._restore_consumer = clients.plain_consumer(cfg, "restore", problems, **own)
        self._control = ControlChannel(clients.plain_consumer(cfg, "control", problems, **own),
                                       self.topics.control, cfg.group_id)
        if cfg.exactly_once:
            transactions.init(producer, problems, f"{cfg.group_id}-{self.instance_id}",
                              deadline_s=RETRY_DEADLINE_S)
        preflight.require_permissions(self.config, self.problems, self.metrics)
        brokers = BrokerWatch(problems, self.metrics,
                              lambda: consumer.list_topics(self.topics.events, timeout=2))
        consumer.subscribe([self.topics.events], on_assign=self._on_assign,
                           on_revoke=self._on_revoke, on_lost=self._on_lost)
        idle_since = time.monotonic()
        interval = cfg.commit_interval_ms / 1000
        try:
            while not self._stop.is_set():
                self.metrics.tick()
                brokers.tick()
                if time.monotonic() - self._gauges_at >= GAUGE_EVERY_S:
                    self._update_gauges()
                # A batch consume returns only when it is full or its timeout is
                # over, so poll in short slices and date the batch from the poll
                # that brought its first record: the batch then stays open one
                # commit interval, not two (measured: p99 latency ~2x -> ~1x).
                polled_at = time.monotonic()
                msgs = consumer.consume(num_messages=min(cfg.max_batch_events, 5_000),
                                        timeout=min(0.02, interval))
                if self.metrics.fatal:
                    raise AnchorError(self.metrics.fatal)
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
                if not p.empty() and (p.events >= cfg.max_batch_events
                                      or time.monotonic() - p.started >= interval):
                    self._commit()
                if until_offsets is not None and self._reached(until_offsets):
                    break
            self._commit()
        except Exception:
            # the run failed (a refusing broker, a failed restore): leave without
            # the revoke's commit and abort, each of which would wait out its
            # timeout; the uncommitted batch is refolded by the next owner
            self._dead = True
            self._pending = _Pending()
            raise
        finally:
            self._close()

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
        run_all([("control consumer close", k.close if k else None),
                 ("consumer close", c.close if c else None),  # revoke runs _commit
                 ("producer flush", (lambda: p.flush(0 if self._dead else 10)) if p else None),
                 ("restore consumer close", r.close if r else None)])
        self._consumer = self._producer = self._restore_consumer = None

    # ------------------------------------------------------------ rebalance

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.metrics.rebalances.labels("assign").inc()
        self.metrics.ready = False
        starts = self._restore_partitions([tp.partition for tp in partitions])
        assignment = []
        for tp in partitions:
            start = starts.get(tp.partition)
            assignment.append(TopicPartition(tp.topic, tp.partition) if start is None
                              else TopicPartition(tp.topic, tp.partition, start))
        consumer.incremental_assign(assignment)
        if self._control is not None:
            self._control.assign(consumer, [tp.partition for tp in partitions])
        self._assigned_at = time.monotonic()
        self.metrics.ready = True

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.metrics.rebalances.labels("revoke").inc()
        try:
            if not self._dead:
                self._commit()  # finish the open batch while we still own the partitions
        except KafkaException as exc:
            log.warning("commit on revoke failed (%s); aborting the batch", exc)
            self._abort({tp.partition for tp in partitions})
        for tp in partitions:
            self._partitions.pop(tp.partition, None)
        consumer.incremental_unassign(partitions)
        if self._control is not None:
            self._control.unassign({tp.partition for tp in partitions})
        self._update_gauges()

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.metrics.rebalances.labels("lost").inc()
        lost = {tp.partition for tp in partitions}
        self._abort(lost, rewind=False)
        for p in lost:
            self._partitions.pop(p, None)
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
            unstable = set(wait_stable(lambda: clients.admin(self.config),
                                       self.topics.checkpoints, numbers,
                                       stable_bound_s(self.config)))
        else:
            unstable = set()
        restores = load_checkpoints(rc, self.codec, self.topics.checkpoints, numbers)
        committed = committed_offsets(self._consumer, events, numbers)
        anchors = {p: cp.anchor.offset for p, r in restores.items()
                   if (cp := newest_anchor(r)) is not None}
        found = fetch_events(rc, self.codec, events, anchors) if anchors else {}
        starts: dict[int, int | None] = {}
        for number in numbers:
            restore = restores[number]
            problem = (check_anchor(rc, events, restore, committed[number], found.get(number))
                       or self._unusable_rows(restore.checkpoints.values()))
            starts[number] = None
            if problem is not None:
                if self.config.anchor_policy == "fail":
                    self.metrics.fatal = f"anchor check failed: {problem}"
                    log.error("%s", self.metrics.fatal)
                    raise AnchorError(self.metrics.fatal)
                log.warning("anchor check failed (%s); rebuilding partition %d from offset "
                            "zero", problem, number)
                for sid, cp in restore.checkpoints.items():
                    self._tombstone_session(number, sid, cp)
                restore.checkpoints.clear()
                starts[number] = OFFSET_BEGINNING
            part = self._partitions[number] = _Partition(number, restore.checkpoints)
            part.maybe_stale = number in unstable and starts[number] is None
            part.resumed_at = committed[number]
            self.metrics.restored_checkpoints.inc(len(restore.checkpoints))
            log.info("restored partition %d: %d checkpoints from %d records, resuming at %s",
                     number, len(restore.checkpoints), restore.records_read,
                     "offset 0" if starts[number] is not None
                     else f"committed offset {committed[number]}")
        self.metrics.restore_seconds.observe(time.monotonic() - t0)
        return starts

    def _tombstone_session(self, partition: int, sid: str, cp: Checkpoint) -> None:
        """Remove a session's checkpoint and views before it is rebuilt from zero.

        Its views are about to restart at a lower ``asOfSeq`` (the log
        changed), which readers would otherwise ignore as stale.
        """
        pending = self._pending.tombstones
        pending.append((self.topics.checkpoints, partition, session_key(sid)))
        published = cp.surface.get("service", {}).get("published", {})
        pages = -(-int(published.get("transcript", 0)) // self.config.transcript_page_size)
        names = [*CORE_VIEW_NAMES, *(d.key for d in self.registry.definitions() if d.wire),
                 *(f"transcript.{n}" for n in range(pages))]
        pending.extend((self.topics.views, partition, view_key(sid, name)) for name in names)

    def _unusable_rows(self, checkpoints: Iterable[Checkpoint]) -> str | None:
        """A unit whose checkpoint row cannot be used needs the log prefix (P-7, P-10)."""
        wanted = {d.key: d.state_version for d in self.registry.definitions()}
        for cp in checkpoints:
            for key, ver in wanted.items():
                row = cp.rows.get(key)
                if row is None or row.get("ver") != ver:
                    have = "no row" if row is None else f"stateVersion {row.get('ver')}"
                    return (f"session {cp.session_id}: projection {key!r} has {have} in its "
                            f"checkpoint, the code has stateVersion {ver}; the views must be "
                            "refolded from offset zero (`processor replay`)")
        return None

    # ------------------------------------------------------------ folding

    def _runtime(self, part: _Partition, sid: str) -> SessionRuntime:
        rt = part.sessions.get(sid)
        if rt is not None:
            return rt
        cp = part.checkpoints.pop(sid, None)
        session: Session
        if cp is None:
            session = Session(synthetic_header(sid),
                              message_projections=self.message_projections,
                              projections=self.registry)
        else:
            session = self._session_from_checkpoint(cp)
        rt = SessionRuntime(sid, part.number, session, window=self.config.duplicate_window)
        if cp is not None:
            rt.load_service_state(cp.surface.get("service", {}))
        if part.maybe_stale:
            part.fresh.add(sid)  # without a checkpoint: its first one may be the hidden one
        part.sessions[sid] = rt
        return rt

    def _session_from_checkpoint(self, cp: Checkpoint) -> Session:
        core = dict(cp.surface["core"])
        core["rows"] = cp.rows
        try:
            return Session.from_checkpoint(core, cp.surface.get("header"),
                                           message_projections=self.message_projections,
                                           projections=self.registry)
        except SessionError as exc:
            # A bumped stateVersion (or an unreadable row) needs the prefix:
            # the replay command rebuilds such sessions from offset zero.
            raise AnchorError(f"session {cp.session_id}: {exc}; run `processor replay`") from exc

    def _fold_batch(self, msgs: Iterable[Message], polled_at: float | None = None) -> None:
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
                    self.metrics.fatal = str(fatal)
                    raise fatal
                log.warning("consume error: %s", err)
                continue
            part = self._partitions.get(msg.partition() or 0)
            if part is None:
                continue  # fetched just before a revoke
            consumed += 1
            try:
                self._fold_record(part, msg)
            except (AnchorError, KafkaException):
                raise
            except Exception as exc:  # one record's failure is that record's dead letter
                log.exception("record %s[%d]@%d could not be interpreted", msg.topic(),
                              part.number, _offset(msg))
                sid = self._record_session(msg)
                self._reject(part, sid, msg, None, "INTERNAL",
                             f"interpreting the record raised {type(exc).__name__}: {exc}")
            pending.offsets[part.number] = _offset(msg) + 1
        pending.events += consumed
        self.metrics.records_consumed.inc(consumed)
        if self._applied:  # one labelled counter update per batch, not per event
            self.metrics.events.labels("applied").inc(self._applied)
            self._applied = 0
        self.metrics.fold_seconds.observe(time.perf_counter() - t0)

    @staticmethod
    def _record_session(msg: Message) -> str | None:
        """The session a record's key names, or None for a key no session can have."""
        key = msg.key()
        if key is None or len(key) > MAX_KEY_BYTES:
            return None
        try:
            return key.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def _fold_record(self, part: _Partition, msg: Message) -> None:
        # Bounds first: a key no session can have quarantines nothing (there is
        # no session to protect) but is never dropped silently.  Headers are
        # never read: commands travel on the control topic only.
        key = msg.key()
        sid = self._record_session(msg)
        if key is None or sid is None:
            why = ("has no key (events are keyed by session id)" if key is None else
                   f"key of {len(key)} bytes exceeds {MAX_KEY_BYTES}" if len(key) > MAX_KEY_BYTES
                   else "key is not UTF-8")
            self._dead_letter(part, None, msg, None, "KEY", f"record {why}")
            self.metrics.events.labels("rejected").inc()
            return
        try:
            value = msg.value()
            if value is None:
                raise CodecError("record value is null (a tombstone on the events topic)")
            decoded = self.codec.decode_event(value)
        except CodecError as exc:
            self._reject(part, sid, msg, None, "CODEC", f"undecodable record: {exc}")
            return
        if decoded.session_id != sid:
            self._reject(part, sid, msg, decoded.seq, "KEY",
                         f"record key {sid!r} does not match sessionId "
                         f"{decoded.session_id!r}")
            return
        rt = self._runtime(part, sid)
        if (rt.quarantine is not None and decoded.seq == rt.quarantine.seq + 1
                and self._control is not None):
            # the fix of a quarantine: apply a redrive acknowledged before it first
            self._apply_commands(self._control.drain(part.number))
        if rt.quarantine is not None:
            q = rt.quarantine
            self._dead_letter(part, sid, msg, decoded.seq, "QUARANTINED",
                              f"session quarantined at seq {q.seq} ({q.rule}: {q.reason})")
            self.metrics.events.labels("quarantined").inc()
            return
        try:
            event = decoded.to_event()
        except SessionError as exc:
            self._reject(part, sid, msg, decoded.seq, exc.rule, str(exc), rt)
            return
        last = rt.last_seq
        if event.seq <= last:
            verdict = rt.duplicate_verdict(event)
            if verdict == "same":
                self.metrics.events.labels("duplicate").inc()
                return
            reason = ("conflicting duplicate: differs from the folded event"
                      if verdict == "different" else
                      "duplicate older than the verification window; cannot prove it equal")
            self._reject(part, sid, msg, event.seq, "SEQ-GATE",
                         f"seq {event.seq}: {reason} (watermark {last})", rt)
            return
        if event.seq > last + 1:
            if part.fresh and self._repair_stale(part, rt):
                self._fold_record(part, msg)  # judged again against the repaired state
                return
            self._reject(part, sid, msg, event.seq, "S-1",
                         f"seq {event.seq}: gap, expected {last + 1} (S-1)", rt)
            return
        try:
            rt.session.append(event)
        except SessionError as exc:
            self._reject(part, sid, msg, event.seq, exc.rule, str(exc), rt)
            return
        rt.record_applied(event, _offset(msg))
        if part.fresh:
            part.fresh.discard(sid)
        rt.session.log.trim_before(event.seq + 1)
        self._pending.dirty[(part.number, sid)] = rt
        self._applied += 1

    def _repair_stale(self, part: _Partition, rt: SessionRuntime) -> bool:
        """A gap in a session fresh from a maybe-stale checkpoint (restored behind an
        open transaction): refold its events from the checkpoint's anchor to the
        offset the restore resumed at, which a later owner folded and committed
        (so no dead letter or view is re-published for them).  True if the
        session moved on: the gap was a stale restore, not bad input."""
        part.fresh.discard(rt.session_id)
        if part.resumed_at is None or self._restore_consumer is None:
            return False
        start = rt.last_offset + 1 if rt.last_offset >= 0 else 0
        records = read_key_range(self._restore_consumer, self.topics.events, part.number,
                                 start, part.resumed_at, session_key(rt.session_id))
        before = rt.last_seq
        applied, self._replaying = self._applied, True
        try:
            for m in records:
                self._fold_record(part, m)
        finally:
            self._applied, self._replaying = applied, False
        log.warning("session %s was restored stale at seq %d (a newer checkpoint was hidden "
                    "behind an open transaction); refolded %d records from offset %d, now at "
                    "seq %d", rt.session_id, before, len(records), start, rt.last_seq)
        return rt.last_seq > before

    def _apply_commands(self, msgs: list[Message]) -> None:
        """Operator commands from the control topic (see ``control.py``)."""
        pending = self._pending
        if pending.empty():
            pending.started = time.monotonic()
        for msg in msgs:
            part = self._partitions.get(msg.partition() or 0)
            if part is None:
                continue
            pending.control_offsets[part.number] = _offset(msg) + 1
            try:
                command = parse_command(msg.key(), msg.value())
                if self._control is not None:
                    self._control.check_route(command, part.number)
            except CommandError as exc:
                self.metrics.control.labels("rejected").inc()
                self._dead_letter(part, self._record_session(msg), msg, None, "CONTROL",
                                  f"control command refused: {exc}")
                continue
            rt = self._runtime(part, command.session_id)
            outcome = apply_command(rt, command)
            self.metrics.control.labels("noop" if outcome == "noop" else "applied").inc()
            if outcome == "lifted":
                part.quarantined.discard(rt.session_id)
            if outcome == "lifted" or (outcome == "pending" and rt.last_seq >= 0):
                # (an event-less session gets no checkpoint: an anchor-less one
                # would fail the restore's anchor check; such a command holds
                # until this process stops)
                pending.dirty[(part.number, rt.session_id)] = rt

    def _reject(self, part: _Partition, sid: str | None, msg: Message, seq: int | None,
                rule: str, reason: str, rt: SessionRuntime | None = None) -> None:
        self._dead_letter(part, sid, msg, seq, rule, reason)
        if not self._replaying:
            self.metrics.events.labels("rejected").inc()
        if sid is None:
            return
        rt = rt or self._runtime(part, sid)
        if rt.quarantine is None and rt.redrive_at == rt.last_seq:
            log.info("session %s: quarantine at seq %d lifted by a redrive read earlier",
                     sid, rt.last_seq)
            rt.redrive_at = None
            self._pending.dirty[(part.number, sid)] = rt
        elif rt.quarantine is None:
            rt.quarantine = Quarantine(rt.last_seq, rule, reason, _offset(msg))
            part.quarantined.add(sid)
            self._pending.dirty[(part.number, sid)] = rt

    def _dead_letter(self, part: _Partition, sid: str | None, msg: Message, seq: int | None,
                     rule: str, reason: str) -> None:
        if self._replaying:
            return  # the owner that first folded this record dead-lettered it
        self.metrics.dlq.labels(rule).inc()
        ts = msg.timestamp()[1]
        letter, referenced = bounded(DeadLetter(
            session_id=sid, topic=msg.topic() or self.topics.events, partition=part.number,
            offset=_offset(msg), seq=seq, rule=rule, reason=reason, key=msg.key(),
            value=msg.value(), timestamp=ts if ts > 0 else int(time.time() * 1000),
            processor=self.instance_id))
        if referenced:
            self.metrics.dlq_oversized.inc()
        self._pending.dead_letters.append((part.number, letter))

    # ------------------------------------------------------------ output

    def _produce(self, topic: str, partition: int, key: bytes | None,
                 value: bytes | None) -> None:
        assert self._producer is not None
        while True:
            try:
                self._producer.produce(topic, value=value, key=key, partition=partition)
                return
            except BufferError:
                self._producer.poll(0.05)

    def _emit_session(self, rt: SessionRuntime) -> None:
        cfg = self.config
        part = self._partitions[rt.partition]
        as_of = rt.last_seq
        floor = self._publish_floor.get(rt.session_id)
        if floor is not None and as_of < floor and rt.quarantine is None:
            changes: Iterable[ViewChange] = ()  # held back until the old asOfSeq
        else:
            self._publish_floor.pop(rt.session_id, None)
            changes = rt.view_changes(cfg.transcript_page_size)
        for change in changes:
            ident = (rt.session_id, change.name)
            old_parts = part.view_parts.get(ident, 1)
            if change.removed:
                for k in stale_part_keys(rt.session_id, change.name, old_parts, 0):
                    self._produce(self.topics.views, rt.partition, k, None)
                part.view_parts.pop(ident, None)
                continue
            records = split_view(View.of(rt.session_id, change.name, as_of,
                                         change.state_version, change.value),
                                 cfg.max_view_bytes)
            for k in stale_part_keys(rt.session_id, change.name, old_parts, len(records)):
                self._produce(self.topics.views, rt.partition, k, None)
            for record in sorted(records, key=lambda r: -r.part):  # parts first, head last
                self._produce(self.topics.views, rt.partition,
                              view_key(rt.session_id, change.name, record.part),
                              self.codec.encode_view(record))
            part.view_parts[ident] = len(records)
            self.metrics.views_published.inc(len(records))
        self._produce(self.topics.checkpoints, rt.partition, session_key(rt.session_id),
                      self.codec.encode_checkpoint(self._checkpoint_of(rt)))
        self.metrics.checkpoints_published.inc()

    def _checkpoint_of(self, rt: SessionRuntime) -> Checkpoint:
        session = rt.session
        core = session.checkpoint()
        rows = core.pop("rows")
        digest = session.last_digest
        return Checkpoint(
            session_id=rt.session_id,
            last_seq=session.last_seq,
            anchor=Anchor(rt.partition, rt.last_offset, session.last_seq,
                          bytes.fromhex(digest) if digest else b""),
            rows=rows,
            surface={"core": core, "service": rt.service_state(), "header": session.header},
            core_version=CHECKPOINT_VERSION,
        )

    def _commit(self) -> None:
        pending = self._pending
        if pending.empty() or self._producer is None or self._consumer is None:
            return
        t0 = time.perf_counter()
        opened = time.monotonic()  # counts a SIGSTOP too, as the coordinator's timeout does
        producer, consumer = self._producer, self._consumer
        eos = self.config.exactly_once
        try:
            if eos:
                producer.begin_transaction()
            for topic, partition, key in pending.tombstones:
                self._produce(topic, partition, key, None)
            for partition, letter in pending.dead_letters:
                dlq_key = (session_key(letter.session_id) if letter.session_id is not None
                           else None)
                self._produce(self.topics.dlq, partition, dlq_key,
                              self.codec.encode_dead_letter(letter))
            for rt in pending.dirty.values():
                if rt.partition in self._partitions:
                    self._emit_session(rt)
            offsets = [TopicPartition(self.topics.events, p, o)
                       for p, o in pending.offsets.items()]
            offsets += [TopicPartition(self.topics.control, p, o)
                        for p, o in pending.control_offsets.items()]
            if eos:
                faultpoints.hit(faultpoints.BEFORE_SEND_OFFSETS, lambda: producer.flush(30))
                if offsets:
                    transactions.retrying(lambda: producer.send_offsets_to_transaction(
                        offsets, consumer.consumer_group_metadata(), 30), self.metrics)
                transactions.retrying(lambda: producer.commit_transaction(60), self.metrics)
            else:
                remaining = producer.flush(60)
                if remaining:
                    raise KafkaException(KafkaError(KafkaError._TIMED_OUT,
                                                    f"{remaining} records not delivered"))
                if offsets:
                    consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            # serve the delivery reports of failed records (poll re-raises a fatal
            # error, classified just below)
            with contextlib.suppress(KafkaException):
                producer.poll(0)
            verdict = transactions.verdict(exc, self.problems, self.config.group_id)
            self.metrics.txn_failures.labels(verdict.kind.value).inc()
            err = error_of(exc)
            if (verdict.kind is Kind.FATAL and eos and err is not None
                    and self._replace_producer(err, time.monotonic() - opened)):
                pass  # the new producer fenced the broken one; refold below
            elif verdict.kind in (Kind.FATAL, Kind.DENIED):
                line = verdict.line
                if verdict.kind is Kind.DENIED:  # the broker rarely says which ACL
                    line = "; ".join(preflight.missing_or_fatal(self.config,
                                                                 self.problems)) or line
                self.metrics.fatal = line
                raise KafkaFatal(line) from None
            else:
                log.warning("transaction failed (%s); aborting and rewinding", verdict.line)
            self._abort(pending.partitions())
            self._stop.wait(self._failures.failed(verdict.line))
            return
        self._failures.succeeded()
        self.metrics.commits.inc()
        self.metrics.batch_events.observe(pending.events)
        self.metrics.commit_seconds.observe(time.perf_counter() - t0)
        self._pending = _Pending()
        self._update_gauges()

    def _replace_producer(self, err: KafkaError, open_s: float) -> bool:
        """Survive a fatal producer error that a broker fault caused.

        A coordinator moving during a commit can leave librdkafka's
        transactional producer fatally broken (INVALID_TXN_STATE, seen in the
        fault suite); a new producer with the same transactional id fences
        the old one and aborts its open transaction, and the batch is then
        refolded from the checkpoints.  A fence within the transaction
        timeout (``open_s``: how long the failed transaction was open) means
        another live member has our instance id: that ends the process
        (``FENCED``).  Bounded (FatalBudget): a cause that persists — missing
        ACLs — still ends the process.
        """
        timeout_s = self.config.effective_transaction_timeout_ms / 1000
        if err.code() in FENCED and open_s < timeout_s:
            log.error("producer fenced after %.1f s, within the transaction timeout (%.1f s): "
                      "another member runs with instance id %r", open_s, timeout_s,
                      self.instance_id)
            return False
        if not self._fatal_budget.allow(err):
            return False
        log.error("producer fatal error (%s); replacing the producer", err)
        self._producer = producer = clients.output_producer(self.config, self.instance_id,
                                                            self.problems)
        transactions.init(producer, self.problems, f"{self.config.group_id}-{self.instance_id}",
                          deadline_s=RETRY_DEADLINE_S)
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
        self._pending = _Pending()
        if not rewind or self._consumer is None:
            return
        numbers = sorted(touched & set(self._partitions))
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
        live = sum(len(p.sessions) + len(p.checkpoints) for p in self._partitions.values())
        quarantined = sum(len(p.quarantined) for p in self._partitions.values())
        self.metrics.sessions.set(live)
        self.metrics.quarantined.set(quarantined)
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

