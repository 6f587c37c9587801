"""A group coordinator that refuses this member's join is named on ``/readyz``.

Another application's consumers sharing the processor's group id with an
assignor the processor does not speak (``range`` against our
``cooperative-sticky``) make every JoinGroup fail with
INCONSISTENT_GROUP_PROTOCOL; a full group, with GROUP_MAX_SIZE_REACHED.
librdkafka retries the join for ever and hands each failure to ``consume``
as an error: the member got no partition, logged a warning a second and
``/readyz`` said ``not ready: restoring`` -- the wrong cause, for as long as
the other application ran.  Not fatal: the join succeeds once the other
consumers leave, so the member waits, with the cause named (one line logged
when it first appears) until it is assigned.
"""

from __future__ import annotations

from confluent_kafka import KafkaError

#: JoinGroup errors that persist until something outside this member changes
REFUSED = frozenset({KafkaError.INCONSISTENT_GROUP_PROTOCOL, KafkaError.GROUP_MAX_SIZE_REACHED})


def join_refused(err: KafkaError, group: str) -> str | None:
    """The ``/readyz`` cause of a consume error that is a refused join, else None."""
    if err.code() not in REFUSED:
        return None
    hint = (
        "another application's consumers share the group id with another assignor"
        if err.code() == KafkaError.INCONSISTENT_GROUP_PROTOCOL
        else "the group is full (group.max.size)"
    )
    return f"group {group!r} refuses this member: {err.name()} ({hint}); retrying the join"
