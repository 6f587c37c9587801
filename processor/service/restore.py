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
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

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


def read_to_end(consumer: Consumer, topic: str, partition: int, timeout: float = 30.0,
                ) -> list[tuple[bytes | None, bytes | None]]:
    """All committed (key, value) records of one partition, from the start."""
    tp = TopicPartition(topic, partition)
    low, high = consumer.get_watermark_offsets(tp, timeout=timeout)
    if high <= low:
        return []
    consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
    out: list[tuple[bytes | None, bytes | None]] = []
    try:
        while True:
            msgs = consumer.consume(num_messages=10_000, timeout=1.0)
            done = False
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done = True
                        continue
                    raise RuntimeError(f"reading {topic}[{partition}]: {err}")
                out.append((m.key(), m.value()))
                if (m.offset() or 0) >= high - 1:
                    done = True
            if done:
                return out
            if not msgs:
                pos = consumer.position([tp])[0].offset
                if pos >= high:
                    return out
    finally:
        consumer.unassign()


def load_checkpoints(consumer: Consumer, codec: Codec, topic: str,
                     partition: int) -> PartitionRestore:
    result = PartitionRestore(partition)
    for key, value in read_to_end(consumer, topic, partition):
        result.records_read += 1
        if key is None:
            continue
        sid = key.decode("utf-8", "replace")
        if value is None:
            result.checkpoints.pop(sid, None)
            continue
        try:
            cp = codec.decode_checkpoint(value)
        except CodecError as exc:
            result.bad_records += 1
            log.error("checkpoint of %s in %s[%d] is unreadable (%s); it will be refolded",
                      sid, topic, partition, exc)
            result.checkpoints.pop(sid, None)
            continue
        result.checkpoints[sid] = cp
    return result


def fetch_event(consumer: Consumer, codec: Codec, topic: str, partition: int,
                offset: int) -> tuple[str, int, str] | None:
    """(session, seq, digest) of the event at ``offset``, or None if absent."""
    consumer.assign([TopicPartition(topic, partition, offset)])
    try:
        for _ in range(10):
            for m in consumer.consume(num_messages=1, timeout=1.0):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        return None
                    raise RuntimeError(f"reading {topic}[{partition}]@{offset}: {err}")
                if m.offset() != offset:
                    return None  # compacted/transaction marker gap: not our event
                try:
                    decoded = codec.decode_event(m.value() or b"")
                    event = decoded.to_event()
                except (CodecError, SessionError):
                    return None
                return decoded.session_id, event.seq, event_digest(event)
        return None
    finally:
        consumer.unassign()


def check_anchor(consumer: Consumer, codec: Codec, topic: str, partition: int,
                 restore: PartitionRestore, committed: int | None) -> str | None:
    """None when the log still matches, else the reason it does not."""
    low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
    if committed is not None and committed > high:
        return (f"committed offset {committed} is beyond the end of {topic}[{partition}] "
                f"({high}): the topic was truncated or recreated")
    if not restore.checkpoints:
        return None
    newest = max(restore.checkpoints.values(), key=lambda cp: cp.anchor.offset)
    a = newest.anchor
    if committed is None or committed <= a.offset:
        return (f"checkpoints reach offset {a.offset} of {topic}[{partition}] but the group's "
                f"committed offset is {committed}: offsets were reset or the topic recreated")
    if a.offset < low:
        return (f"anchor offset {a.offset} of {topic}[{partition}] was deleted (log starts at "
                f"{low}): retention removed history the checkpoints rely on")
    found = fetch_event(consumer, codec, topic, partition, a.offset)
    expected = (newest.session_id, a.seq, a.digest.hex())
    if found != expected:
        return (f"anchor event at {topic}[{partition}]@{a.offset} is {found}, expected "
                f"session {expected[0]} seq {expected[1]}: the log is not the one the "
                "checkpoints were folded from")
    return None
