"""Restore of a partition's sessions from the checkpoints topic.

A newly assigned events partition ``p`` is restored from partition ``p`` of
the compacted checkpoints topic (co-partitioned), read with
``read_committed`` to its end: the newest checkpoint of each session wins, a
tombstone removes it.  The events are then consumed from the group's
committed offset, which was committed in the same transaction as those
checkpoints — so only the tail after the last commit is re-read, however
long the log behind it.

Stability first: a transaction still open on the checkpoints partition (a
member that died under an id never reused, or a paused one that has not
noticed it lost the partition) hides every checkpoint committed after it
from a ``read_committed`` reader, while the offsets committed with those
checkpoints are visible — restoring then would resume a stale state at a
newer offset.  :func:`wait_stable` therefore waits until the partition's
last stable offset reaches its high watermark before the checkpoints are
read; the broker aborts such a transaction at most ``transaction.timeout.ms``
(plus its cleanup interval) after it began, which bounds the wait.

The anchor check proves that the events partition still is the log the
checkpoints were folded from: the event at the newest anchor's offset must
exist and carry the same session, seq and digest; the committed offset must
lie inside the log.  A recreated or truncated topic fails loudly or triggers
a rebuild from offset zero, by configuration — a stale checkpoint is never
served as current.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

from processor.codec import Checkpoint, Codec, CodecError
from processor.config import ServiceConfig
from processor.core.errors import SessionError
from processor.core.session import event_digest
from processor.engine.checkpoints import latest_checkpoints
from processor.engine.run_errors import AnchorError as AnchorError  # the CLI catches it here
from processor.kafka.reads import read_partitions
from processor.kafka.retry import default_deadline, kafka_error, retry, waiting
from processor.kafka.transport import OffsetsAdmin, Reader

log = logging.getLogger(__name__)


@dataclass
class PartitionRestore:
    partition: int
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)
    records_read: int = 0
    bad_records: int = 0


def committed_offsets(
    consumer: Reader,
    topic: str,
    partitions: Iterable[int],
    deadline_s: float | None = None,
) -> dict[int, int | None]:
    """The group's committed offset of each partition (None: nothing committed).

    A ``read_committed`` consumer asks for stable offsets: while a member's
    transaction holds offsets for a partition the broker answers
    UNSTABLE_OFFSET_COMMIT, and librdkafka gives up with ``_TIMED_OUT`` — both
    retried here until the transaction ends or ``deadline_s`` passes.
    """
    tps = [TopicPartition(topic, p) for p in partitions]
    if not tps:  # librdkafka answers an empty list with _TIMED_OUT, not an empty one
        return {}
    got = retry(
        lambda: consumer.committed(tps, timeout=30),
        f"committed offsets of {topic}",
        deadline_s=deadline_s,
    )
    out: dict[int, int | None] = {}
    for tp in got:
        if tp.error is not None:
            raise KafkaException(tp.error)
        out[tp.partition] = tp.offset if tp.offset >= 0 else None
    return out


def committed_behind(
    consumer: Reader,
    topic: str,
    anchors: Mapping[int, int],
    committed: dict[int, int | None],
    bound_s: float,
    poll_s: float = 1.0,
    counted: Callable[[str], object] = lambda outcome: None,
) -> tuple[dict[int, int | None], dict[int, int]]:
    """The committed offsets again while a checkpoint is at or past one, up to
    ``bound_s``; and, for each partition still behind then, where it goes on:
    ``(committed, {partition: anchor + 1})``.

    A transaction's checkpoints and its offsets commit together, but the
    coordinator writes the commit markers partition by partition: when the
    group coordinator's broker restarts, the checkpoints read committed while
    the offsets still answer the older value (a chaos run: 16 s and more).
    A gap that outlasts the bound is not an anchor failure: in a CI chaos run
    the offsets of a committed transaction never showed, and every member
    that took the partition exited while it was one.  Its checkpoints are
    atomic with its views and dead letters and the partition is folded in
    order, so every record up to the newest anchor is in committed output:
    the partition goes on after it.  Waiting first keeps the records
    of the last batch past its anchor (dead-lettered ones) from being
    dead-lettered twice when the commit only shows late.

    The wait blocks the loop: ``/readyz`` names it while it lasts (the thread's
    ``RetryWatch``, :func:`retry.waiting`) and ``counted`` gets its outcome
    once it ends (``caught_up``, ``expired``: went on after the anchor, or
    ``failed``: the query gave up).
    """

    def behind() -> list[int]:  # no offset at all is a reset (or a new topic): not waited
        return sorted(
            p for p, a in anchors.items() if (c := committed.get(p)) is not None and c <= a
        )

    todo = behind()
    if not todo:
        return committed, {}
    log.warning(
        "checkpoints of %s %s are ahead of the group's committed offsets %s; waiting for "
        "the commit to show (at most %.0fs)",
        topic,
        todo,
        {p: committed.get(p) for p in todo},
        bound_s,
    )
    deadline = time.monotonic() + bound_s
    outcome = "failed"
    line = (
        f"the group's committed offsets of {topic}{todo} to pass their checkpoints "
        f"(commit markers not written yet; at most {bound_s:.0f}s)"
    )
    try:
        with waiting(line):
            while todo and time.monotonic() < deadline:
                time.sleep(poll_s)
                committed = {**committed, **committed_offsets(consumer, topic, todo)}
                todo = behind()
        outcome = "expired" if todo else "caught_up"
    finally:
        counted(outcome)
    if not todo:
        log.info("%s committed offsets caught up with the checkpoints", topic)
    for p in todo:
        log.warning(
            "the group's committed offset %s of %s[%d] stayed behind its checkpoints "
            "(anchor %d) for %.0fs: the offsets of a committed transaction were lost or "
            "moved back; going on at offset %d, after the anchor",
            committed.get(p),
            topic,
            p,
            anchors[p],
            bound_s,
            anchors[p] + 1,
        )
    return committed, {p: anchors[p] + 1 for p in todo}


def wait_stable(
    admin_factory: Callable[[], OffsetsAdmin],
    topic: str,
    partitions: Iterable[int],
    bound_s: float,
    poll_s: float = 0.25,
    on_open: Callable[[list[int], Callable[[], bool]], object] | None = None,
) -> list[int]:
    """Wait until no transaction is open on these partitions; return those still open.

    Open means the last stable offset (``read_committed`` end) is below the
    high watermark.  Only a zombie writes to the checkpoints of a partition
    this member was just assigned (the previous owner committed or aborted
    before it gave the partition up), and the broker aborts a zombie's
    transaction once ``transaction.timeout.ms`` has passed — or at once when
    its generation-checked ``send_offsets_to_transaction`` is refused.  The
    bound is reported by the caller; waiting beyond it would stall forever
    on a broker that never resolves the transaction.  ``on_open`` (fencing.py)
    is called once with the partitions still open after ``FENCE_AFTER_S`` and a
    check that they still are; it may end a dead member's transaction at once.
    """
    admin = FreshAdmin(admin_factory)
    try:
        return _wait_stable(admin, topic, sorted(set(partitions)), bound_s, poll_s, on_open)
    finally:
        admin.release()


def _wait_stable(
    admin: FreshAdmin,
    topic: str,
    todo: list[int],
    bound_s: float,
    poll_s: float,
    on_open: Callable[[list[int], Callable[[], bool]], object] | None,
) -> list[int]:
    t0 = time.monotonic()
    deadline = t0 + bound_s
    warned = False
    while todo:
        stable = _stable_offsets(admin, topic, todo, deadline)
        todo = [p for p in todo if not stable[p]]
        if not todo:
            break
        if on_open is not None and time.monotonic() - t0 >= FENCE_AFTER_S:
            on_open(todo, functools.partial(_any_open, admin, topic, list(todo), deadline))
            on_open = None
            continue  # checked again at once: the fence may have ended it
        if time.monotonic() >= deadline:
            log.error(
                "%s partitions %s still hold an open transaction after %.0fs; restoring "
                "from what is visible (a gap will be repaired from the events)",
                topic,
                todo,
                bound_s,
            )
            return todo
        # the previous owner's commit markers take a moment; longer is a zombie
        if not warned and time.monotonic() - t0 > 2.0:
            log.warning(
                "%s partitions %s hold an open transaction (a zombie member's); "
                "waiting for it to end before restoring (at most %.0fs)",
                topic,
                todo,
                bound_s,
            )
            warned = True
        # the first half second in short steps: the previous owner's commit markers
        # usually land within milliseconds (a rolling restart's every restore)
        time.sleep(poll_s if time.monotonic() - t0 > 0.5 else min(poll_s, 0.05))
    if warned:
        log.info("%s stable after %.1fs", topic, time.monotonic() - t0)
    return []


#: How long an open transaction may last on a newly assigned partition before
#: its writer is fenced if it left the group: the previous owner's commit
#: markers take milliseconds, a dead member's transaction up to its timeout.
#: A member of the group is never fenced, so looking early risks only an admin
#: call; at 1 s the wait was 1 s of the ~2.2 s a takeover after a member
#: killed under a new id spent on its transaction (issue 37).
FENCE_AFTER_S = 0.3


class FreshAdmin:
    """A stability wait's admin client: made for the wait, made anew after a
    failed call, and asking for the topic's metadata before its first
    ListOffsets.

    New per wait: its metadata is the cluster's now.  A client kept across
    restores sent a restore's ListOffsets to the leader it had cached, a
    broker killed 11 s before, and waited out the 10 s request timeout
    (a rolling restart's lab run, issue 37).  Metadata first: a new client's first
    ListOffsets took 3 s in one call of six (40 new clients on a 3-node
    cluster: 7 at 3.0 s, the others under 40 ms; asking
    ``list_topics(topic)`` first: all 80 under 100 ms).  librdkafka sends a
    new client's query for the partitions' leaders to a bootstrap broker,
    which it decommissions once it knows the cluster's own brokers; the lost
    query is asked again by a 3 s timer, and in a rolling restart the loop
    waited for it.  Anew after a failure: librdkafka's admin ListOffsets does
    not refresh its metadata on FENCED_LEADER_EPOCH / NOT_LEADER, and after a
    broker restart the same client kept failing for a minute (seen in the
    fault suite); a new one answers.
    """

    def __init__(self, factory: Callable[[], OffsetsAdmin]) -> None:
        self.factory = factory
        self.client: OffsetsAdmin | None = None

    def release(self) -> None:
        """Drop the client, its queued log lines served, in the thread that used it."""
        if self.client is not None:
            self.client.poll(0)
        self.client = None

    def list_offsets(
        self,
        spec: dict[TopicPartition, Any],
        level: IsolationLevel,
        timeout: float = 10.0,
    ) -> dict[int, int]:
        try:
            if self.client is None:
                self.client = self.factory()
                for topic in sorted({tp.topic for tp in spec}):  # the leaders into its cache
                    self.client.list_topics(topic, timeout=min(timeout, 5.0))
            futures = self.client.list_offsets(spec, isolation_level=level, request_timeout=timeout)
            return {tp.partition: f.result().offset for tp, f in futures.items()}
        except KafkaException as exc:
            self.release()
            err = kafka_error(exc)
            if err is not None and err.code() == KafkaError._NOENT:
                # "Failed to query partition leaders: No leaders found": every broker
                # down (or just back, no leader elected yet).  A leader that is not
                # there yet, never the end of the run (a chaos run's member exited
                # of it when a whole-cluster outage met its restore)
                raise KafkaException(
                    KafkaError(KafkaError.LEADER_NOT_AVAILABLE, err.str())
                ) from exc
            raise


def _any_open(admin: FreshAdmin, topic: str, partitions: list[int], deadline: float) -> bool:
    return not all(_stable_offsets(admin, topic, partitions, deadline).values())


def _stable_offsets(
    admin: FreshAdmin, topic: str, partitions: list[int], deadline: float
) -> dict[int, bool]:
    """``{partition: last stable offset == high watermark}``, retrying broker faults."""

    # a broker fault is ridden out no longer than the restore's deadline (a
    # restore put off then, not held for the whole stable bound), one request
    # no longer either
    left = min(max(deadline - time.monotonic(), 5.0), default_deadline())

    def ends(level: IsolationLevel) -> dict[int, int]:
        spec = {
            TopicPartition(topic, p): OffsetSpec.latest()  # type: ignore[no-untyped-call]
            for p in partitions
        }
        return admin.list_offsets(spec, level, min(10.0, left))

    # the committed end first: a transaction ending between the two calls
    # then reads as "open" once more, never as stable too early
    lso = retry(
        lambda: ends(IsolationLevel.READ_COMMITTED), f"stable offsets of {topic}", deadline_s=left
    )
    hwm = retry(
        lambda: ends(IsolationLevel.READ_UNCOMMITTED), f"end offsets of {topic}", deadline_s=left
    )
    return {p: lso[p] >= hwm[p] for p in partitions}


def load_checkpoints(
    consumer: Reader, codec: Codec, topic: str, partitions: Iterable[int]
) -> dict[int, PartitionRestore]:
    """The newest checkpoint of every session of each partition (tombstones remove)."""
    parts = list(partitions)
    msgs = retry(
        lambda: read_partitions(consumer, topic, {p: OFFSET_BEGINNING for p in parts}),
        f"reading {topic}",
    )
    results = {}
    for p in parts:

        def bad(sid: str, exc: CodecError, p: int = p) -> None:
            log.error(
                "checkpoint of %s in %s[%d] is unreadable (%s); it will be refolded",
                sid,
                topic,
                p,
                exc,
            )

        latest = latest_checkpoints(codec, ((m.key(), m.value()) for m in msgs[p]), bad)
        result = PartitionRestore(p)
        result.checkpoints = latest.checkpoints
        result.records_read = latest.records_read
        result.bad_records = latest.bad_records
        results[p] = result
    return results


def fetch_events(
    consumer: Reader, codec: Codec, topic: str, offsets: Mapping[int, int]
) -> dict[int, tuple[str, int, str] | None]:
    """(session, seq, digest) of the event at each partition's offset, None if absent."""
    msgs = retry(
        lambda: read_partitions(consumer, topic, dict(offsets), limit_per_partition=1),
        f"reading anchors of {topic}",
    )
    found: dict[int, tuple[str, int, str] | None] = {}
    for p, offset in offsets.items():
        first = msgs[p][0] if msgs[p] else None
        found[p] = None
        if first is None or first.offset() != offset:
            continue  # compacted away, or a transaction marker: not our event
        try:
            decoded = codec.decode_event(first.value() or b"")
            event = decoded.to_event()
        except (CodecError, SessionError):
            continue
        found[p] = (decoded.session_id, event.seq, event_digest(event))
    return found


def newest_anchor(restore: PartitionRestore) -> Checkpoint | None:
    if not restore.checkpoints:
        return None
    return max(restore.checkpoints.values(), key=lambda cp: cp.anchor.offset)


def check_anchor(
    topic: str,
    restore: PartitionRestore,
    committed: int | None,
    found: tuple[str, int, str] | None,
    marks: tuple[int, int],
) -> str | None:
    """None when the log still matches, else the reason it does not.

    ``found`` is what :func:`fetch_events` read at the newest anchor's offset.
    Checkpoints ahead of the committed offset are not a mismatch.  Without
    transactions a batch that failed or crashed after its records were
    delivered leaves them: the tail from the committed offset is folded again
    and the seq gate drops what the checkpoints already hold.  With them, a
    transaction whose offsets never showed (:func:`committed_behind`): the
    partition goes on after the anchor.  A missing committed offset still
    fails the check (offsets deleted or never committed).
    ``marks``: the partition's ``(low, high)``, read by the caller before any
    change (a restore put off then has changed nothing); the check does no I/O.
    """
    partition = restore.partition
    low, high = marks
    if committed is not None and committed > high:
        return (
            f"committed offset {committed} is beyond the end of {topic}[{partition}] "
            f"({high}): the topic was truncated or recreated"
        )
    newest = newest_anchor(restore)
    if newest is None:
        return None
    a = newest.anchor
    if committed is None:
        return (
            f"checkpoints reach offset {a.offset} of {topic}[{partition}] but the group "
            "has no committed offset: its offsets were deleted or the topic recreated"
        )
    if a.offset < low:
        return (
            f"anchor offset {a.offset} of {topic}[{partition}] was deleted (log starts at "
            f"{low}): retention removed history the checkpoints rely on"
        )
    expected = (newest.session_id, a.seq, a.digest.hex())
    if found != expected:
        return (
            f"anchor event at {topic}[{partition}]@{a.offset} is {found}, expected "
            f"session {expected[0]} seq {expected[1]}: the log is not the one the "
            "checkpoints were folded from"
        )
    return None


def stable_bound_s(config: ServiceConfig) -> float:
    """How long a restore waits for a zombie's transaction to end.

    ``restore_stable_wait_ms`` overrides it (0: do not wait; a restore behind
    an open transaction is then repaired session by session when a gap shows
    it stale).

    The broker aborts it ``transaction.timeout.ms`` after it began, noticed
    within its cleanup interval (``transaction.abort.timed.out.transaction.
    cleanup.interval.ms``, 10 s by default); the rest is margin for a broker
    that is itself recovering.
    """
    if config.restore_stable_wait_ms >= 0:
        return config.restore_stable_wait_ms / 1000
    return config.effective_transaction_timeout_ms / 1000 + 10 + 30
