"""Reading a topic's committed records: a snapshot to its end, then a tail.

Shared by the views and dead-letter readers (views_reader.py).  Readers
never assume a topic is partitioned by key hash.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from processor.config import ServiceConfig
from processor.kafka import clients
from processor.kafka.reads import read_partitions, records, topic_partitions

_partitions = topic_partitions  # the name views_reader imports

log = logging.getLogger(__name__)


#: Errors of a topic that exists but whose leaders are not known yet (just
#: created, or a broker restarting): worth a retry, not a failure.
_TRANSIENT = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
    }
)


def _snapshot(
    consumer: Consumer,
    topic: str,
    timeout: float,
) -> tuple[list[int], dict[int, list[Any]]]:
    """All committed records of every partition, from the beginning to the end."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        parts = _partitions(consumer, topic, timeout)
        try:
            msgs = read_partitions(
                consumer,
                topic,
                {p: OFFSET_BEGINNING for p in parts},
                timeout=max(deadline - time.monotonic(), 1.0),
            )
            return parts, msgs
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            transient = isinstance(err, KafkaError) and (
                err.retriable() or err.code() in _TRANSIENT
            )
            if not transient or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def read_committed_records(
    config: ServiceConfig, topic: str, *, timeout: float = 60.0, purpose: str = "reader"
) -> list[Message]:
    """Every committed record of ``topic`` (all partitions, partition by partition).

    Retries the transient "no leader yet" errors of a just-created topic, so
    tools and tests can read right after ``processor topics create``.
    """
    consumer = clients.plain_consumer(config, purpose)
    try:
        parts, msgs = _snapshot(consumer, topic, timeout)
    finally:
        consumer.close()
    return [m for p in parts for m in msgs[p]]


def _resume_offsets(parts: list[int], msgs: dict[int, list[Any]]) -> list[tuple[int, int]]:
    """Where tailing continues after a snapshot: one past its last record."""
    out = []
    for p in parts:
        last = msgs[p][-1].offset() if msgs[p] else None
        out.append((p, OFFSET_BEGINNING if last is None else last + 1))
    return out


def _tail(
    consumer: Consumer, topic: str, starts: list[tuple[int, int]], stop_after_s: float | None
) -> Iterator[Any]:
    """Committed records from ``starts`` on, until ``stop_after_s`` (or forever)."""

    def logged(m: Any, err: KafkaError) -> None:
        if err.fatal():
            raise RuntimeError(f"{topic}: {err}")
        log.warning("%s: %s", topic, err)

    consumer.assign([TopicPartition(topic, p, o) for p, o in starts])
    deadline = None if stop_after_s is None else time.monotonic() + stop_after_s
    while deadline is None or time.monotonic() < deadline:
        yield from records(consumer.consume(500, timeout=0.2), on_error=logged)
