"""The engine: every decision between a consumed record and the records to produce.

Per record, in partition order: the key names the session (KEY), the value
decodes (CODEC) and agrees with the key, the session is not quarantined
(QUARANTINED), the event is valid (the core's rule), the seq gate admits it
(``gate.py``: apply / duplicate / refuse), the core folds it.  Any refusal is
a dead letter with its rule and reason, and quarantines the session at its
last valid seq: its ``status`` view says why, its other views stay, and its
later events are dead-lettered too until an operator re-drives it
(``commands.py``).  Every other session keeps flowing.

The engine holds the sessions of the owned partitions and the open
:class:`~processor.engine.records.Batch`; :meth:`Engine.output` turns the batch
into the records of one transaction.  It never touches a Kafka client: what
it needs from outside in the middle of a fold (the control backlog, a
session's history) it asks of its :class:`Feeds`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping

from processor.codec import Checkpoint, Codec, CodecError, DeadLetter, session_key
from processor.config import ServiceConfig
from processor.core.errors import SessionError, library_text, raised_from
from processor.core.message_projections import MessageProjectionRegistry
from processor.core.projections import ProjectionRegistry
from processor.core.session import Session, synthetic_header
from processor.engine.commands import CommandError, apply_command, parse_command, partition_of
from processor.engine.dead_letters import MAX_KEY_BYTES, bounded
from processor.engine.gate import Gate, judge, refusal
from processor.engine.held import HeldSessions
from processor.engine.output import restore_ledgers, session_output, session_tombstones
from processor.engine.ports import CheckpointSource as CheckpointSource
from processor.engine.ports import Feeds as Feeds
from processor.engine.ports import NoFeeds as NoFeeds
from processor.engine.record_bounds import fitted, record_bound
from processor.engine.records import Batch, Fate, Out, Outcome, Record, Tally
from processor.engine.replay_floor import PublishFloor
from processor.engine.run_errors import AnchorError
from processor.engine.runtime import Quarantine, SessionRuntime, ViewChange

log = logging.getLogger(__name__)


class PartitionState:
    """Sessions of one assigned events partition.

    A session is materialised when its first event (or command) arrives:
    from ``checkpoints`` (given in full, the broker-less tests) or else from
    ``source`` — so an assignment costs nothing per session it holds.
    """

    def __init__(
        self,
        number: int,
        checkpoints: dict[str, Checkpoint] | None = None,
        *,
        source: CheckpointSource | None = None,
        quarantined: set[str] | None = None,
    ) -> None:
        self.number = number
        self.checkpoints = checkpoints or {}  # not yet materialised sessions
        self.source = source
        # quarantined session ids, kept as they change so the gauge is O(partitions)
        self.quarantined = set(quarantined or ()) | {
            sid
            for sid, cp in self.checkpoints.items()
            if (cp.surface.get("service") or {}).get("quarantine")
        }
        #: no session of this partition may be evicted (its store stopped
        #: taking writes, so the newest checkpoint may exist only in memory)
        self.pinned = False
        self.sessions: dict[str, SessionRuntime] = {}
        self.view_parts: dict[tuple[str, str], int] = {}
        # Restored while a transaction was still open on the checkpoints
        # partition (the wait gave up): a checkpoint may be stale (or hidden
        # altogether), so a gap in a session with nothing folded since the
        # restore is repaired from the events (Engine._repair_stale).
        self.maybe_stale = False
        self.resumed_at: int | None = None  # committed offset the restore resumed at
        self.fresh: set[str] = set()  # sessions with no event folded since the restore


def record_session(key: bytes | None) -> str | None:
    """The session a record's key names, or None for a key no session can have."""
    if key is None or len(key) > MAX_KEY_BYTES:
        return None
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return None


class Engine:
    """The sessions of the owned partitions, the seq gate, quarantine and the open batch."""

    def __init__(
        self,
        config: ServiceConfig,
        codec: Codec,
        registry: ProjectionRegistry,
        message_projections: MessageProjectionRegistry,
        *,
        instance_id: str = "",
        publish_floor: Mapping[str, int | PublishFloor] | None = None,
        feeds: Feeds | None = None,
    ) -> None:
        """``publish_floor``: session -> seq below which views are not published (an
        in-place replay refolds from seq 0 while the views topic holds the old
        views: holding them back keeps ``asOfSeq`` from going backwards)."""
        self.config = config
        self.topics = config.topics
        self.codec = codec
        self.registry = registry
        self.message_projections = message_projections
        self.instance_id = instance_id
        self.feeds: Feeds = feeds or NoFeeds()
        self.partitions: dict[int, PartitionState] = {}
        self.batch = Batch()
        self.tally = Tally()
        self.replaying = False  # refolding history another owner already committed
        #: partitions of the events topic (0: not known yet, nothing is checked);
        #: a record in a partition its key does not hash to is refused (fold)
        self.partition_count = 0
        floors = publish_floor or {}
        self._publish_floor = {s: f if isinstance(f, int) else f.seq for s, f in floors.items()}
        self._old_views = {s: f for s, f in floors.items() if isinstance(f, PublishFloor)}
        #: sessions held in memory, least recently used first (memory.py)
        self.held = HeldSessions()

    # ------------------------------------------------------------ sessions

    def runtime(self, part: PartitionState, sid: str) -> SessionRuntime:
        rt = part.sessions.get(sid)
        if rt is not None:
            self.held.touch(rt)
            return rt
        cp = part.checkpoints.pop(sid, None)
        size = 0
        if cp is None and part.source is not None:
            cp, size = part.source.load(part.number, sid)
            self.tally.loads += cp is not None
        session: Session
        if cp is None:
            session = Session(
                synthetic_header(sid),
                message_projections=self.message_projections,
                projections=self.registry,
            )
        else:
            session = self._session_from_checkpoint(cp)
        rt = SessionRuntime(sid, part.number, session, window=self.config.duplicate_window)
        if cp is not None:
            service = cp.surface.get("service", {})
            rt.load_service_state(service)
            split = restore_ledgers(rt, service.get("parted"), self.config.transcript_page_size)
            part.view_parts.update(((sid, unit), n) for unit, n in split)  # shrinks tombstone
        if part.maybe_stale:
            part.fresh.add(sid)  # without a checkpoint: its first one may be the hidden one
        part.sessions[sid] = rt
        self.held.add(rt, size)
        return rt

    def lookup(self, part: PartitionState, sid: str) -> SessionRuntime | None:
        """A session's runtime for a reader (a query): held, or loaded from its
        checkpoint; None when the session has no state (nothing is created)."""
        if sid in part.sessions or sid in part.checkpoints:
            return self.runtime(part, sid)
        if part.source is None:
            return None
        cp, size = part.source.load(part.number, sid)
        if cp is None:
            return None
        part.checkpoints[sid] = cp
        rt = self.runtime(part, sid)
        self.held.add(rt, size)
        self.tally.loads += 1
        return rt

    def _session_from_checkpoint(self, cp: Checkpoint) -> Session:
        core = dict(cp.surface["core"])
        core["rows"] = cp.rows
        try:
            return Session.from_checkpoint(
                core,
                cp.surface.get("header"),
                message_projections=self.message_projections,
                projections=self.registry,
            )
        except SessionError as exc:
            # A bumped stateVersion (or an unreadable row) needs the prefix:
            # the replay command rebuilds such sessions from offset zero.
            err = AnchorError(f"session {cp.session_id}: {exc}; run `processor replay`")
            raise raised_from(err, exc) from exc

    def unusable_rows(self, checkpoints: Iterable[Checkpoint]) -> str | None:
        """A unit whose checkpoint row cannot be used needs the log prefix (P-7, P-10)."""
        wanted = {d.key: d.state_version for d in self.registry.definitions()}
        for cp in checkpoints:
            for key, ver in wanted.items():
                row = cp.rows.get(key)
                if row is None or row.get("ver") != ver:
                    have = "no row" if row is None else f"stateVersion {row.get('ver')}"
                    return (
                        f"session {cp.session_id}: projection {key!r} has {have} in its "
                        f"checkpoint, the code has stateVersion {ver}; the views must be "
                        "refolded from offset zero (`processor replay`)"
                    )
        return None

    def tombstone_session(self, partition: int, sid: str, cp: Checkpoint) -> None:
        """Remove a session's checkpoint (head and parts) and views before it is
        rebuilt from zero.

        Its views are about to restart at a lower ``asOfSeq`` (the log
        changed), which readers would otherwise ignore as stale.
        """
        units = [d.key for d in self.registry.definitions() if d.wire]
        self.batch.tombstones.extend(session_tombstones(partition, sid, cp, units, self.config))

    def close_batch(self) -> tuple[Batch, Tally]:
        """Hand the open batch and its decisions over to be committed; a new one opens."""
        closed = self.batch, self.tally
        self.batch, self.tally = Batch(), Tally()
        return closed

    def take_state_counts(self) -> Tally:
        """Sessions loaded and evicted since the last call (zeroed); decisions stay."""
        t = self.tally
        taken, t.loads, t.evictions = Tally(loads=t.loads, evictions=t.evictions), 0, 0
        return taken

    def drop_decisions(self) -> None:
        """The open batch's decisions never commit (it is refolded): never counted."""
        self.tally = Tally(loads=self.tally.loads, evictions=self.tally.evictions)

    def discard_batch(self) -> set[int]:
        """Drop the open batch (aborted: its sessions are restored from the
        checkpoints); the partitions it touched."""
        touched = self.batch.partitions()
        self.batch = Batch()
        return touched

    def sessions_held(self) -> int:
        return sum(len(p.sessions) + len(p.checkpoints) for p in self.partitions.values())

    def drop_partition(self, number: int) -> None:
        """Forget a partition (revoked, lost, or restored anew after an abort)."""
        part = self.partitions.pop(number, None)
        if part is not None:
            for rt in part.sessions.values():
                self.held.remove(rt)

    def evict(
        self,
        budget_bytes: int,
        idle_s: float,
        now: float,
        committing: Mapping[tuple[int, str], object] | None = None,
    ) -> int:
        """Evict least recently used sessions while over budget, and idle ones.

        Only a session whose state is in its committed checkpoint may go: not
        one changed in the open batch, nor in the batch still ``committing``
        (its commit overlaps the fold: the store gets it when it settles, and a
        reload before that would read the state before it: a gap, quarantine),
        not one that never had an event (it has no checkpoint), not one of a
        partition whose store stopped taking writes.
        """
        evicted = 0
        dirty = self.batch.dirty
        busy: Mapping[tuple[int, str], object] = committing or {}
        for rt in self.held.oldest():
            over = self.held.bytes > budget_bytes
            idle = idle_s > 0 and now - rt.last_used > idle_s
            if not over and not idle:
                break
            part = self.partitions.get(rt.partition)
            if part is None or part.sessions.get(rt.session_id) is not rt:
                self.held.remove(rt)  # a partition no longer ours: not held anyway
                continue
            if (
                part.source is None  # nowhere to reload it from
                or part.pinned
                or rt.last_seq < 0
                or (rt.partition, rt.session_id) in dirty
                or (rt.partition, rt.session_id) in busy
            ):
                continue
            del part.sessions[rt.session_id]
            part.fresh.discard(rt.session_id)
            self.held.remove(rt)
            evicted += 1
        self.tally.evictions += evicted
        return evicted

    def sessions_quarantined(self) -> int:
        return sum(len(p.quarantined) for p in self.partitions.values())

    # ------------------------------------------------------------ folding

    def fold(self, part: PartitionState, rec: Record) -> Outcome:
        """Judge and fold one event record of ``part``."""
        # Bounds first: a key no session can have quarantines nothing (there is
        # no session to protect) but is never dropped silently.  Headers are
        # never read: commands travel on the control topic only.
        key = rec.key
        sid: str | None = None
        if key is not None and len(key) <= MAX_KEY_BYTES:  # record_session, inlined
            try:
                sid = key.decode("utf-8")
            except UnicodeDecodeError:
                sid = None
        if key is None or sid is None:
            why = (
                "has no key (events are keyed by session id)"
                if key is None
                else f"key of {len(key)} bytes exceeds {MAX_KEY_BYTES}"
                if len(key) > MAX_KEY_BYTES
                else "key is not UTF-8"
            )
            return self._refuse_key(part, None, rec, f"record {why}")
        # a held session passed the route check below when it was first held here
        rt = part.sessions.get(sid)
        if rt is None and self.partition_count:
            want = partition_of(key, self.partition_count)
            if want != part.number:
                # A session lives in the partition its key hashes to (murmur2, as
                # the writers, redrives and queries find it).  Folded here, the
                # record would start a second copy of the session whose views and
                # checkpoints land in this partition's number: readers would see
                # two values per view (a gap quarantining one of them).  Refused
                # before anything of the session is touched; nothing quarantined.
                why = (
                    f"record of session {sid!r} in partition {part.number}, but its key "
                    f"hashes to partition {want} of {self.partition_count} (produce "
                    "events with the murmur2 partitioner)"
                )
                return self._refuse_key(part, sid, rec, why)
        try:
            value = rec.value
            if value is None:
                raise CodecError("record value is null (a tombstone on the events topic)")
            decoded = self.codec.decode_event(value)
        except CodecError as exc:
            return self.reject(part, sid, rec, None, "CODEC", f"undecodable record: {exc}")
        if decoded.session_id != sid:
            return self.reject(
                part,
                sid,
                rec,
                decoded.seq,
                "KEY",
                f"record key {sid!r} does not match sessionId {decoded.session_id!r}",
            )
        # a held session is touched (LRU) with its fold below, in one lookup
        if rt is None:
            rt = self.runtime(part, sid)
        if rt.quarantine is not None and decoded.seq == rt.quarantine.seq + 1:
            # the fix of a quarantine: apply a redrive acknowledged before it first
            self.apply_commands(self.feeds.control_backlog(part.number))
        if rt.quarantine is not None:
            q = rt.quarantine
            reason = f"session quarantined at seq {q.seq} ({q.rule}: {q.reason})"
            self.dead_letter(part, sid, rec, decoded.seq, "QUARANTINED", reason)
            self.held.touch(rt)
            self.tally.events["quarantined"] += 1
            return Outcome(Fate.QUARANTINED, sid, decoded.seq, "QUARANTINED", reason)
        try:
            event = decoded.take_event()  # the decoded event is dropped after this fold
        except SessionError as exc:
            self.held.touch(rt)
            return self.reject(part, sid, rec, decoded.seq, exc.rule, str(exc), rt)
        last = rt.last_seq
        gate = judge(rt, event, rec.offset)
        if gate is not Gate.APPLY:
            self.held.touch(rt)
            if gate is Gate.DUPLICATE:
                self.tally.events["duplicate"] += 1
                return Outcome(Fate.DUPLICATE, sid, event.seq)
            if gate is Gate.GAP and part.fresh and self._repair_stale(part, rt):
                return self.fold(part, rec)  # judged again against the repaired state
            rule, reason = refusal(gate, event.seq, last)
            return self.reject(part, sid, rec, event.seq, rule, reason, rt)
        try:
            rt.session.append(event)
        except SessionError as exc:
            self.held.touch(rt)
            return self.reject(part, sid, rec, event.seq, exc.rule, str(exc), rt)
        rt.record_applied(event, rec.offset)
        self.held.used(rt, len(value))
        if part.fresh:
            part.fresh.discard(sid)
        rt.session.log.trim_before(event.seq + 1)
        self.batch.dirty[(part.number, sid)] = rt
        if not self.replaying:  # the owner that first folded it counted it
            self.tally.events["applied"] += 1
        return Outcome(Fate.APPLIED, sid, event.seq)

    def fail(self, part: PartitionState, rec: Record, exc: Exception) -> Outcome:
        """Interpreting ``rec`` raised: that record's dead letter, never a stuck partition."""
        return self.reject(
            part,
            record_session(rec.key),
            rec,
            None,
            "INTERNAL",
            f"interpreting the record raised {library_text(exc)}",
        )

    def _repair_stale(self, part: PartitionState, rt: SessionRuntime) -> bool:
        """A gap in a session fresh from a maybe-stale checkpoint (restored behind an
        open transaction): refold its events from the checkpoint's anchor to the
        offset the restore resumed at, which a later owner folded and committed
        (so no dead letter or view is re-published for them).  True if the
        session moved on: the gap was a stale restore, not bad input."""
        part.fresh.discard(rt.session_id)
        if part.resumed_at is None:
            return False
        start = rt.last_offset + 1 if rt.last_offset >= 0 else 0
        records = self.feeds.session_history(
            part.number, start, part.resumed_at, session_key(rt.session_id)
        )
        if records is None:
            return False
        before = rt.last_seq
        self.replaying = True
        try:
            for rec in records:
                self.fold(part, rec)
        finally:
            self.replaying = False
        log.warning(
            "session %s was restored stale at seq %d (a newer checkpoint was hidden "
            "behind an open transaction); refolded %d records from offset %d, now at "
            "seq %d",
            rt.session_id,
            before,
            len(records),
            start,
            rt.last_seq,
        )
        return rt.last_seq > before

    def apply_commands(self, records: Iterable[Record]) -> list[str]:
        """Operator commands from the control topic (``commands.py``); their outcomes.

        Each outcome is ``"lifted"``, ``"pending"``, ``"noop"`` or ``"refused"``
        (dead-lettered, rule CONTROL); records of partitions not owned are skipped.
        """
        batch = self.batch
        outcomes: list[str] = []
        for rec in records:
            part = self.partitions.get(rec.partition)
            if part is None:
                continue
            batch.control_offsets[part.number] = rec.offset + 1
            try:
                command = parse_command(rec.key, rec.value)
                self.feeds.check_route(command, part.number)
            except CommandError as exc:
                self.tally.control["rejected"] += 1
                self.dead_letter(
                    part,
                    record_session(rec.key),
                    rec,
                    None,
                    "CONTROL",
                    f"control command refused: {exc}",
                )
                outcomes.append("refused")
                continue
            rt = self.runtime(part, command.session_id)
            outcome = apply_command(rt, command)
            self.tally.control["noop" if outcome == "noop" else "applied"] += 1
            if outcome == "lifted":
                part.quarantined.discard(rt.session_id)
            if outcome == "lifted" or (outcome == "pending" and rt.last_seq >= 0):
                # (an event-less session gets no checkpoint: an anchor-less one
                # would fail the restore's anchor check; such a command holds
                # until this process stops)
                batch.dirty[(part.number, rt.session_id)] = rt
            outcomes.append(outcome)
        return outcomes

    def _refuse_key(
        self, part: PartitionState, sid: str | None, rec: Record, reason: str
    ) -> Outcome:
        """A ``KEY`` dead letter for a record refused before its value is read:
        no session of it is touched, so nothing is quarantined."""
        self.dead_letter(part, sid, rec, None, "KEY", reason)
        self.tally.events["rejected"] += 1
        return Outcome(Fate.REJECTED, sid, None, "KEY", reason)

    def reject(
        self,
        part: PartitionState,
        sid: str | None,
        rec: Record,
        seq: int | None,
        rule: str,
        reason: str,
        rt: SessionRuntime | None = None,
    ) -> Outcome:
        """Dead-letter ``rec`` and quarantine its session at its last valid seq."""
        self.dead_letter(part, sid, rec, seq, rule, reason)
        if not self.replaying:
            self.tally.events["rejected"] += 1
        if sid is None:
            return Outcome(Fate.REJECTED, None, seq, rule, reason)
        rt = rt if rt is not None else self.runtime(part, sid)
        if rt.quarantine is None and rt.redrive_at == rt.last_seq:
            log.info(
                "session %s: quarantine at seq %d lifted by a redrive read earlier",
                sid,
                rt.last_seq,
            )
            rt.redrive_at = None
            rt.lifted_at = rt.last_seq
            self.batch.dirty[(part.number, sid)] = rt
        elif rt.quarantine is None:
            rt.quarantine = Quarantine(rt.last_seq, rule, reason, rec.offset)
            part.quarantined.add(sid)
            self.batch.dirty[(part.number, sid)] = rt
        return Outcome(Fate.REJECTED, sid, seq, rule, reason)

    def dead_letter(
        self,
        part: PartitionState,
        sid: str | None,
        rec: Record,
        seq: int | None,
        rule: str,
        reason: str,
    ) -> None:
        if self.replaying:
            return  # the owner that first folded this record dead-lettered it
        self.tally.dlq[rule] += 1
        letter, referenced = bounded(
            DeadLetter(
                session_id=sid,
                topic=rec.topic or self.topics.events,
                partition=part.number,
                offset=rec.offset,
                seq=seq,
                rule=rule,
                reason=reason,
                key=rec.key,
                value=rec.value,
                timestamp=rec.timestamp,
                processor=self.instance_id,
            )
        )
        if referenced:
            self.tally.dlq_oversized += 1
        self.batch.dead_letters.append((part.number, letter))
        if letter.value is not None:
            self.batch.dead_letter_bytes += len(letter.value)

    # ------------------------------------------------------------ output

    def output(self) -> Iterator[Out]:
        """The records of the open batch's transaction, in produce order.

        Tombstones, dead letters, then per changed session its changed views
        and its checkpoint.  Publishing marks the views published, so iterate
        it once per transaction (an abort restores the sessions anyway).
        """
        batch = self.batch
        for topic, partition, key in batch.tombstones:
            yield Out(topic, partition, key, None)
        for partition, letter in batch.dead_letters:
            dlq_key = session_key(letter.session_id) if letter.session_id is not None else None
            yield Out(self.topics.dlq, partition, dlq_key, self.codec.encode_dead_letter(letter))
        bound = record_bound(self.config)
        for rt in batch.dirty.values():
            part = self.partitions.get(rt.partition)
            if part is not None:
                yield from fitted(self, part, rt, bound)  # VF-7

    def session_records(self, part: PartitionState, rt: SessionRuntime) -> list[Out]:
        """A changed session's records of the open batch (marks its views published)."""
        changes = self._changes(rt)
        out = session_output(
            rt, changes, part.view_parts, config=self.config, codec=self.codec, tally=self.tally
        )
        return list(out)

    def _changes(self, rt: SessionRuntime) -> Iterable[ViewChange] | None:
        floor = self._publish_floor.get(rt.session_id)
        if floor is not None and rt.last_seq < floor and rt.quarantine is None:
            return None  # held back until the old asOfSeq
        self._publish_floor.pop(rt.session_id, None)
        old = self._old_views.pop(rt.session_id, None)
        if old is not None:  # an in-place replay's: no old record left behind
            old.adopt(rt.view_ledger)
        return rt.view_changes(self.config.transcript_page_size)
