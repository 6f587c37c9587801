"""Restore of a partition's sessions from the checkpoints topic.

A newly assigned events partition ``p`` is restored from partition ``p`` of
the compacted checkpoints topic (co-partitioned), read with
``read_committed`` to its end: the newest checkpoint of each session wins, a
tombstone removes it.  The events are then consumed from the group's
committed offset, which was committed in the same transaction as those
checkpoints — so only the tail after the last commit is re-read, however
long the log behind it.

The anchor check proves that the events partition still is the log the
checkpoints were folded from: the event at the newest anchor's offset must
exist and carry the same session, seq and digest; the committed offset must
lie inside the log.  A recreated or truncated topic fails loudly or triggers
a rebuild from offset zero, by configuration — a stale checkpoint is never
served as current.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from processor.core.errors import SessionError
from processor.core.session import event_digest
from processor.service.codec import Checkpoint, Codec, CodecError

log = logging.getLogger("processor.restore")


class AnchorError(RuntimeError):
    """The events log no longer holds what the checkpoints were folded from."""


@dataclass
class PartitionRestore:
    partition: int
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)
    records_read: int = 0
    bad_records: int = 0


def watermarks(consumer: Consumer, topic: str, partition: int,
               timeout: float = 30.0) -> tuple[int, int]:
    """(low, high) of a partition, retrying the leader moves of a fresh topic.

    Right after a topic is created the broker answers NOT_LEADER for a few
    seconds; a restore started then must wait, not fail.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                       timeout=timeout)
            return low, high
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            retriable = isinstance(err, KafkaError) and (
                err.retriable() or err.code() in (KafkaError.NOT_LEADER_FOR_PARTITION,
                                                  KafkaError.LEADER_NOT_AVAILABLE,
                                                  KafkaError.UNKNOWN_TOPIC_OR_PART))
            if not retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def read_partitions(consumer: Consumer, topic: str, starts: Mapping[int, int],
                    limit_per_partition: int | None = None, timeout: float = 30.0,
                    ) -> dict[int, list[Message]]:
    """Committed records of several partitions from ``starts`` to their end, read at once.

    One assignment for all partitions: restoring twelve partitions costs one
    round of fetches, not twelve.
    """
    out: dict[int, list[Message]] = {p: [] for p in starts}
    highs: dict[int, int] = {}
    for p in starts:
        highs[p] = watermarks(consumer, topic, p, timeout)[1]
    todo = {p for p, start in starts.items() if highs[p] > max(start, 0)}
    if not todo:
        return out
    consumer.assign([TopicPartition(topic, p, starts[p]) for p in todo])
    deadline = time.monotonic() + timeout
    try:
        while todo:
            if time.monotonic() > deadline:
                raise RuntimeError(f"reading {topic} partitions {sorted(todo)} timed out")
            for m in consumer.consume(num_messages=10_000, timeout=0.05):
                p = m.partition() or 0
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        todo.discard(p)
                        continue
                    raise RuntimeError(f"reading {topic}[{p}]: {err}")
                if p not in todo:
                    continue
                out[p].append(m)
                if (m.offset() or 0) >= highs[p] - 1 or (
                    limit_per_partition is not None and len(out[p]) >= limit_per_partition
                ):
                    todo.discard(p)
    finally:
        consumer.unassign()
    return out


def read_to_end(consumer: Consumer, topic: str, partition: int, timeout: float = 30.0,
                ) -> list[tuple[bytes | None, bytes | None]]:
    """All committed (key, value) records of one partition, from the start."""
    msgs = read_partitions(consumer, topic, {partition: OFFSET_BEGINNING}, timeout=timeout)
    return [(m.key(), m.value()) for m in msgs[partition]]


def load_checkpoints(consumer: Consumer, codec: Codec, topic: str,
                     partitions: Iterable[int]) -> dict[int, PartitionRestore]:
    """The newest checkpoint of every session of each partition (tombstones remove)."""
    parts = list(partitions)
    msgs = read_partitions(consumer, topic, {p: OFFSET_BEGINNING for p in parts})
    results = {}
    for p in parts:
        result = PartitionRestore(p)
        for m in msgs[p]:
            result.records_read += 1
            key, value = m.key(), m.value()
            if key is None:
                continue
            sid = key.decode("utf-8", "replace")
            if value is None:
                result.checkpoints.pop(sid, None)
                continue
            try:
                result.checkpoints[sid] = codec.decode_checkpoint(value)
            except CodecError as exc:
                result.bad_records += 1
                log.error("checkpoint of %s in %s[%d] is unreadable (%s); it will be refolded",
                          sid, topic, p, exc)
                result.checkpoints.pop(sid, None)
        results[p] = result
    return results


def fetch_events(consumer: Consumer, codec: Codec, topic: str,
                 offsets: Mapping[int, int]) -> dict[int, tuple[str, int, str] | None]:
    """(session, seq, digest) of the event at each partition's offset, None if absent."""
    msgs = read_partitions(consumer, topic, dict(offsets), limit_per_partition=1)
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


def check_anchor(consumer: Consumer, topic: str, restore: PartitionRestore,
                 committed: int | None, found: tuple[str, int, str] | None) -> str | None:
    """None when the log still matches, else the reason it does not.

    ``found`` is what :func:`fetch_events` read at the newest anchor's offset.
    """
    partition = restore.partition
    low, high = watermarks(consumer, topic, partition)
    if committed is not None and committed > high:
        return (f"committed offset {committed} is beyond the end of {topic}[{partition}] "
                f"({high}): the topic was truncated or recreated")
    newest = newest_anchor(restore)
    if newest is None:
        return None
    a = newest.anchor
    if committed is None or committed <= a.offset:
        return (f"checkpoints reach offset {a.offset} of {topic}[{partition}] but the group's "
                f"committed offset is {committed}: offsets were reset or the topic recreated")
    if a.offset < low:
        return (f"anchor offset {a.offset} of {topic}[{partition}] was deleted (log starts at "
                f"{low}): retention removed history the checkpoints rely on")
    expected = (newest.session_id, a.seq, a.digest.hex())
    if found != expected:
        return (f"anchor event at {topic}[{partition}]@{a.offset} is {found}, expected "
                f"session {expected[0]} seq {expected[1]}: the log is not the one the "
                "checkpoints were folded from")
    return None
