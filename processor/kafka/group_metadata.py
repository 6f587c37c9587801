"""What a consumer's group metadata says of its membership, read before a commit.

A transaction's offsets carry the consumer's group metadata (generation or
member epoch, member id, static instance id), and the group coordinator
refuses them from a member that is no longer in the group (KIP-447): that is
the only fence between two members, whose transactional ids differ.  One
case passes it: a group (classic, and in Kafka 4.x a KIP-848 one too) takes
a transactional offset commit that carries generation -1, no member id and no
instance id from anyone, even while the group has members (older producers
sent none of them).  librdkafka hands out exactly that
metadata once its membership is gone twice over (an ``ILLEGAL_GENERATION``
reset the generation, then a session timeout or ``UNKNOWN_MEMBER_ID`` the
member id) and before the application has served the lost partitions: a
member that commits then writes partitions another member owns, and a
subscriber sees a committed view go back.

So the commit reads the metadata it is about to send (:func:`outside_group`)
and does not send it when it names no member (``commit.py``): the batch
aborts, and the next poll serves the lost partitions.

The form read is librdkafka's serialisation (``CGMDv2:``, the generation in
the host's byte order, then NUL-terminated group id, member id and optional
instance id), which confluent-kafka returns as ``bytes``; anything else (the
in-memory transport's metadata) is not read and not checked.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException

MAGIC = b"CGMDv2:"
_GENERATION = struct.Struct("=i")


@dataclass(frozen=True, slots=True)
class Membership:
    """The membership a group metadata names."""

    group_id: str
    generation: int
    member_id: str
    instance_id: str | None

    @property
    def in_group(self) -> bool:
        """Whether the coordinator will check this metadata against the group:
        a generation or a member id (or a static instance id) to check."""
        return self.generation >= 0 or bool(self.member_id) or self.instance_id is not None

    def __str__(self) -> str:
        member = self.member_id or "none"
        instance = f", instance {self.instance_id}" if self.instance_id else ""
        return f"generation {self.generation}, member {member}{instance}"


def membership(metadata: object) -> Membership | None:
    """The membership in librdkafka's serialised group metadata, or None when
    ``metadata`` is not in that form (or is cut short)."""
    if not isinstance(metadata, bytes) or not metadata.startswith(MAGIC):
        return None
    at = len(MAGIC)
    if len(metadata) < at + _GENERATION.size:
        return None
    (generation,) = _GENERATION.unpack_from(metadata, at)
    at += _GENERATION.size
    fields: list[str] = []
    for _ in range(2):  # group id, member id
        end = metadata.find(b"\0", at)
        if end < 0:
            return None
        fields.append(metadata[at:end].decode("utf-8", "replace"))
        at = end + 1
    if at >= len(metadata):
        return None
    instance: str | None = None
    if metadata[at] == 0:  # the instance id is not null: it follows
        end = metadata.find(b"\0", at + 1)
        if end < 0:
            return None
        instance = metadata[at + 1 : end].decode("utf-8", "replace")
    return Membership(fields[0], generation, fields[1], instance)


def outside_group(metadata: object) -> KafkaException | None:
    """The error a commit with this metadata fails with before it is sent, or
    None (a member, or metadata not in librdkafka's form)."""
    named = membership(metadata)
    if named is None or named.in_group:
        return None
    return KafkaException(
        KafkaError(
            KafkaError.UNKNOWN_MEMBER_ID,
            f"the consumer is not a member of the group now ({named}); "
            "its partitions are lost, the batch is not committed",
        )
    )


def serialised(generation: int, group_id: str, member_id: str, instance_id: str | None) -> bytes:
    """librdkafka's serialisation of a group metadata (for tests and the
    in-memory transport): the inverse of :func:`membership`."""
    tail = b"\x01" if instance_id is None else b"\x00" + instance_id.encode() + b"\0"
    return (
        MAGIC
        + _GENERATION.pack(generation)
        + group_id.encode()
        + b"\0"
        + member_id.encode()
        + b"\0"
        + tail
    )
