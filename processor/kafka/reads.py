"""Reading partitions to their end: the one read path of every reader.

A read to the end assigns the partitions itself (no group), reads the
committed records from a start offset up to the end read before it began,
and stops each partition there.  What every reader needs and used to
hand-write: an end-of-partition event ends a partition (or, ``strict_end``,
only one at or past the end read before: a new leader's high watermark may
still be catching up in a broker restart), a transient error in place of a
record is skipped (librdkafka refetches by itself), any other raises, and
the read is bounded in time (a transient ``_TIMED_OUT`` the caller may retry).

- :func:`records`: the records of one ``consume`` call, an end or an error
  in place of a record handed to the caller (followers of a topic: the
  control reader, the views tail, the inspector, the background fill);
- :func:`scan`: one read to the end, record by record;
- :func:`read_partitions`, :func:`read_to_end`, :func:`read_key_range`,
  :func:`stream`: what the restore, the replay, the readers and the local
  store's fill read with it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from processor.kafka.retry import is_transient, kafka_error, retry
from processor.kafka.transport import Msg, Reader

log = logging.getLogger(__name__)


def raise_unless_transient(msg: Msg, err: KafkaError) -> None:
    """The default for an error in place of a record: skip a transient one."""
    exc = KafkaException(err)
    if not is_transient(exc):
        raise exc


def records(
    msgs: Iterable[Msg],
    *,
    on_end: Callable[[Msg], object] = lambda msg: None,
    on_error: Callable[[Msg, KafkaError], object] = raise_unless_transient,
) -> Iterator[Msg]:
    """The records of ``msgs``, in order; an end-of-partition event goes to
    ``on_end``, any other error to ``on_error`` (which may raise), each at its
    place in the order (a generator: a caller sees the end of a partition
    between its records and the next)."""
    for m in msgs:
        err = m.error()
        if err is None:
            yield m
        elif err.code() == KafkaError._PARTITION_EOF:
            on_end(m)
        else:
            on_error(m, err)


def topic_partitions(consumer: Reader, topic: str, timeout: float) -> list[int]:
    """The partition numbers of ``topic`` (it must exist)."""
    meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        raise RuntimeError(f"topic {topic} does not exist (run `processor topics create`)")
    return sorted(meta.partitions)


def watermarks(
    consumer: Reader, topic: str, partition: int, timeout: float | None = None
) -> tuple[int, int]:
    """(low, high) of a partition, retrying leader moves and broker restarts.

    Right after a topic is created, or while a broker restarts, the answer is
    NOT_LEADER, ``_TRANSPORT`` or ``_DESTROY_BROKER`` for a few seconds; a
    restore started then must wait, not fail.  (For a ``read_committed``
    consumer ``high`` is the last stable offset.)
    """
    tp = TopicPartition(topic, partition)

    def ask() -> tuple[int, int]:
        try:
            return consumer.get_watermark_offsets(tp, timeout=10)
        except KafkaException as exc:
            err = kafka_error(exc)
            if err is not None and err.code() == KafkaError._UNKNOWN_PARTITION:
                # the client's cached metadata lacks the partition (read while a
                # broker restarted) and is refreshed only every few minutes: a
                # retry alone repeats the error (~2.5 min in a chaos run); ask now
                with contextlib.suppress(KafkaException):
                    consumer.list_topics(topic, timeout=5)
            raise

    low, high = retry(ask, f"watermarks of {topic}[{partition}]", deadline_s=timeout)
    return low, high


def scan(
    reader: Reader,
    topic: str,
    starts: Mapping[int, int],
    ends: Mapping[int, int],
    *,
    timeout_s: float = 30.0,
    idle_timeout: bool = False,
    strict_end: bool = False,
    past_end: bool = True,
    limit: int | None = None,
    batch: int = 10_000,
    poll_s: float = 0.05,
    retry_consume: bool = False,
) -> Generator[tuple[int, Msg | None], None, None]:
    """Committed records of ``topic`` from ``starts`` up to ``ends``, as
    ``(partition, record)``; ``(partition, None)`` once a partition is read.

    A partition ends at its end-of-partition event (``strict_end``: only one
    at or past its end), at its record ``end - 1`` or after ``limit``
    records; ``past_end``: a record at or after the end (committed after the
    end was read) is yielded as the last one, else left out.  Raises a
    transient ``_TIMED_OUT`` after ``timeout_s`` (``idle_timeout``: without a
    record).  ``retry_consume``: a failed ``consume`` call is retried
    (:func:`retry.retry`).  The reader is unassigned at the end, also when the
    caller stops early.
    """
    todo = {p for p, start in starts.items() if ends[p] > max(start, 0)}
    if not todo:
        return
    reader.assign([TopicPartition(topic, p, starts[p]) for p in todo])
    count = dict.fromkeys(todo, 0)
    ended: list[int] = []

    def on_end(m: Msg) -> None:
        p = m.partition() or 0
        if p in todo and (not strict_end or (m.offset() or 0) >= ends[p]):
            todo.discard(p)
            ended.append(p)

    def consume() -> list[Msg]:
        return list(reader.consume(num_messages=batch, timeout=poll_s))

    deadline = time.monotonic() + timeout_s
    try:
        while todo:
            if time.monotonic() > deadline:  # transient: the caller may retry the read
                raise KafkaException(
                    KafkaError(
                        KafkaError._TIMED_OUT,
                        f"reading {topic} partitions {sorted(todo)} timed out after {timeout_s:g}s",
                    )
                )
            msgs = retry(consume, f"reading {topic}") if retry_consume else consume()
            for m in records(msgs, on_end=on_end):
                while ended:
                    yield ended.pop(0), None
                p = m.partition() or 0
                if p not in todo:
                    continue
                if idle_timeout:
                    deadline = time.monotonic() + timeout_s  # progress
                offset = m.offset() or 0
                if offset >= ends[p] and not past_end:
                    todo.discard(p)
                    yield p, None
                    continue
                count[p] += 1
                yield p, m
                if offset >= ends[p] - 1 or (limit is not None and count[p] >= limit):
                    todo.discard(p)
                    yield p, None
            while ended:
                yield ended.pop(0), None
    finally:
        reader.unassign()


def read_partitions(
    consumer: Reader,
    topic: str,
    starts: Mapping[int, int],
    limit_per_partition: int | None = None,
    timeout: float = 30.0,
) -> dict[int, list[Msg]]:
    """Committed records of several partitions from ``starts`` to their end, read at once.

    One assignment for all partitions: restoring twelve partitions costs one
    round of fetches, not twelve.
    """
    out: dict[int, list[Msg]] = {p: [] for p in starts}
    highs = {p: watermarks(consumer, topic, p, timeout)[1] for p in starts}
    for p, m in scan(consumer, topic, starts, highs, timeout_s=timeout, limit=limit_per_partition):
        if m is not None:
            out[p].append(m)
    return out


def read_to_end(
    consumer: Reader,
    topic: str,
    partition: int,
    timeout: float = 30.0,
) -> list[tuple[bytes | None, bytes | None]]:
    """All committed (key, value) records of one partition, from the start."""
    msgs = read_partitions(consumer, topic, {partition: OFFSET_BEGINNING}, timeout=timeout)
    return [(m.key(), m.value()) for m in msgs[partition]]


def read_key_range(
    consumer: Reader,
    topic: str,
    partition: int,
    start: int,
    end: int,
    key: bytes,
    deadline_s: float | None = None,
    *,
    limit: int | None = None,
) -> list[Msg]:
    """The committed records of ``key`` at offsets ``[start, end)`` of one partition.

    ``limit``: at most that many records of the key, and one more when the
    range holds more (the caller names the bound it hit)."""

    def read() -> list[Msg]:
        out: list[Msg] = []
        for _, m in scan(
            consumer, topic, {partition: start}, {partition: end}, timeout_s=60, past_end=False
        ):
            if m is not None and m.key() == key:
                out.append(m)
                if limit is not None and len(out) > limit:
                    break
        return out

    if start >= end:
        return []
    return retry(read, f"reading {topic}[{partition}] {start}..{end}", deadline_s=deadline_s)


def stream(
    reader: Reader,
    topic: str,
    starts: Mapping[int, int],
    highs: Mapping[int, int] | None,
    *,
    batch: int,
    limit: int | None = None,
    timeout_s: float = 120.0,
) -> Generator[tuple[int, list[Msg], int], None, None]:
    """Committed records of several partitions from ``starts`` to their end, in batches.

    Yields ``(partition, records, next offset)`` with at most ``batch``
    records each; the last batch of a partition carries its end as next offset.
    An end-of-partition event below the end read before (a new leader's high
    watermark catching up) is not the end: ending there would move a store
    past records it never applied.  ``timeout_s`` is the longest wait for a
    record.
    """
    ends = (
        dict(highs) if highs is not None else {p: watermarks(reader, topic, p)[1] for p in starts}
    )
    pending: dict[int, list[Msg]] = {p: [] for p in starts}
    reads = scan(
        reader,
        topic,
        {p: s if s > 0 else OFFSET_BEGINNING for p, s in starts.items()},
        ends,
        timeout_s=timeout_s,
        idle_timeout=True,
        strict_end=True,
        limit=limit,
        batch=batch,
        retry_consume=True,
    )
    with contextlib.closing(reads):  # unassigns the reader when the caller stops early
        for p, m in reads:
            if m is not None:
                if len(pending[p]) >= batch:  # a full batch, not the partition's last
                    full, pending[p] = pending[p], []
                    yield p, full, (full[-1].offset() or 0) + 1
                pending[p].append(m)
                continue
            got = pending.pop(p)
            last = (got[-1].offset() or 0) if got else None
            if last is None or (last < ends[p] - 1 and (limit is None or len(got) < limit)):
                yield p, got, ends[p]  # its end-of-partition event
            else:
                yield p, got, max(last + 1, ends[p]) if limit is None else last + 1
