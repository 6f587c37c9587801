"""With no registry (first start, or it was lost): what the topic already holds.

Reads the events topic once, to its end, and keeps the highest seq of each
session.  The shipper then sends only what is past it, instead of every
session from seq 0: resends older than the processor's duplicate window
could not be proven duplicates and would be dead-lettered.  Memory: one int
per session id.

The read is the one read path (:func:`processor.kafka.reads.stream`): its
retry of transient errors, its end of a partition, its time bound.  A record
that does not decode cannot raise the floor; it is counted and said (the
processor dead-letters it), never passed over in silence.
"""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import OFFSET_BEGINNING, KafkaException

from processor.codec import CodecError, decode_events_batch
from processor.config import ServiceConfig
from processor.core.errors import library_text
from processor.kafka import clients, reads

#: Records per batch handed to the decoder.
BATCH = 1_000


def topic_floor(
    config: ServiceConfig, *, say: Callable[[str], None], timeout: float = 300.0
) -> dict[str, int]:
    """session id -> highest seq on ``config.topics.events`` (empty if it has none).

    ``timeout``: the longest wait for a record; past it the floor is what
    was read, and it is said.
    """
    topic = config.topics.events
    consumer = clients.plain_consumer(config, "ship-recover")
    floor: dict[str, int] = {}
    read = undecodable = 0
    try:
        try:
            partitions = reads.topic_partitions(consumer, topic, timeout=30)
        except (RuntimeError, KafkaException) as exc:
            say(f"no registry and topic {topic} not readable ({library_text(exc)}); from seq 0")
            return floor
        starts = dict.fromkeys(partitions, OFFSET_BEGINNING)
        try:
            for _, msgs, _ in reads.stream(
                consumer, topic, starts, None, batch=BATCH, timeout_s=timeout
            ):
                read += len(msgs)
                for decoded in decode_events_batch([m.value() for m in msgs]):
                    if isinstance(decoded, CodecError):
                        undecodable += 1
                    elif decoded.seq > floor.get(decoded.session_id, -1):
                        floor[decoded.session_id] = decoded.seq
        except KafkaException as exc:
            say(
                f"no registry: {topic} not read to its end ({library_text(exc)}); "
                "from what was read"
            )
        if undecodable:
            say(
                f"no registry: {undecodable} record(s) of {topic} do not decode "
                "(the processor dead-letters them); they raise no floor"
            )
        say(f"no registry: {topic} holds {len(floor)} session(s) ({read} record(s) read)")
        return floor
    finally:
        consumer.close()
