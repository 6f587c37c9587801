"""With no registry (first start, or it was lost): what the topic already holds.

Reads the events topic once, to its end, and keeps the highest seq of each
session.  The shipper then sends only what is past it, instead of every
session from seq 0: resends older than the processor's duplicate window
could not be proven duplicates and would be dead-lettered.  Memory: one int
per session id.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from processor.codec import CodecError, decode_events_batch
from processor.config import ServiceConfig
from processor.kafka import clients


def topic_floor(
    config: ServiceConfig, *, say: Callable[[str], None], timeout: float = 300.0
) -> dict[str, int]:
    """session id -> highest seq on ``config.topics.events`` (empty if it has none)."""
    topic = config.topics.events
    consumer = clients.plain_consumer(config, "ship-recover")
    floor: dict[str, int] = {}
    try:
        meta = consumer.list_topics(topic, timeout=30)
        parts = meta.topics.get(topic)
        if parts is None or parts.error is not None:
            say(f"no registry and topic {topic} not readable ({parts and parts.error}); from seq 0")
            return floor
        todo: dict[int, int] = {}
        for p in parts.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            if high > low:
                todo[p] = high
        if not todo:
            return floor
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in todo])
        deadline = time.monotonic() + timeout
        read = 0
        while todo and time.monotonic() < deadline:
            batch = consumer.consume(1000, 0.5)
            values = []
            for msg in batch:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        todo.pop(msg.partition() or 0, None)
                    continue
                values.append(msg.value())
                if (msg.offset() or 0) + 1 >= todo.get(msg.partition() or 0, 1 << 62):
                    todo.pop(msg.partition() or 0, None)
            read += len(values)
            for decoded in decode_events_batch(values):
                if isinstance(decoded, CodecError):
                    continue
                sid = decoded.session_id
                if decoded.seq > floor.get(sid, -1):
                    floor[sid] = decoded.seq
        if todo:
            say(f"no registry: {topic} not read to its end in {timeout:.0f}s; from what was read")
        say(f"no registry: {topic} holds {len(floor)} session(s) ({read} record(s) read)")
        return floor
    finally:
        consumer.close()
