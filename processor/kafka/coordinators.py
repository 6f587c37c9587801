"""Which broker coordinates a key, read from cluster metadata.

Kafka places a group's coordinator and a transactional id's coordinator on
the leader of one partition of an internal topic: ``abs(key.hashCode()) %
partitions`` of ``__consumer_offsets`` and ``__transaction_state``, with
Java's ``String.hashCode``.  The stuck probe (``service/txn/stuck_probe.py``)
asks where the producer's transaction coordinator is now: once the
controller moved it off a broker that went away, a transaction call that
still waits is not waiting for it.  The fault suite kills coordinators'
brokers with the same arithmetic.
"""

from __future__ import annotations

from typing import Any

GROUP_STATE_TOPIC = "__consumer_offsets"
TXN_STATE_TOPIC = "__transaction_state"


def java_hash(text: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units), as a signed int."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def coordinator_partition(key: str, partitions: int) -> int:
    """Kafka's ``Utils.abs(key.hashCode) % partitions`` (the coordinator's partition)."""
    h = java_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def coordinator_address(metadata: Any, topic: str, key: str) -> str | None:
    """``host:port`` of the broker leading ``key``'s partition of ``topic`` in
    ``metadata`` (a ``list_topics`` answer), as librdkafka names a broker in
    its errors; None when the metadata does not say (no leader, the topic
    not described: no DESCRIBE on an internal topic under an authorizer)."""
    described = metadata.topics.get(topic)
    if described is None or described.error is not None or not described.partitions:
        return None
    partition = described.partitions.get(coordinator_partition(key, len(described.partitions)))
    broker = None if partition is None else metadata.brokers.get(partition.leader)
    return None if broker is None else f"{broker.host}:{broker.port}"
