"""Fencing a dead member's transactional id (issue 37, item 2).

A member that dies with a transaction open under an instance id that is never
used again leaves that transaction open until the broker expires it (the
transaction timeout, plus up to the broker's abort check interval, 10 s by
default); until then no ``read_committed`` reader (subscribers, the next
owner's restore) reads past it.  confluent-kafka offers no admin call to
abort another producer's transaction (KIP-664), but ``init_transactions`` by a
new producer with the same ``transactional.id`` aborts the old producer's
open transaction at once and fences it.

So every transaction names its writer in the metadata of the offsets it
commits (:func:`writer_metadata`), and a member whose newly assigned
partitions hold an open transaction (``restore.wait_stable``) calls
:meth:`ZombieFence.fence`: it reads the group's committed offsets *without*
``require_stable`` (the dead member's own pending offsets would otherwise
hide them), takes every writer they name that is not a member of the group
now, and fences each with a short-lived producer.  A member of the group is
never fenced; a member restarting under its old id already fenced its
predecessor itself (its ``init_transactions`` comes before it joins), and the
partitions are checked open once more right before the fence.  Two new
owners fencing the same dead id are harmless: the second finds nothing open.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, Producer

from processor.config import ServiceConfig
from processor.kafka import clients
from processor.kafka.owners import member_instance

log = logging.getLogger(__name__)

#: What the committed offsets' metadata starts with; the writer's instance id follows.
WRITER_PREFIX = "writer:"
#: Bound of each admin request and of each fence's ``init_transactions``.
REQUEST_TIMEOUT_S = 10.0
#: Writers fenced at most per call (each is one round trip to its coordinator).
MAX_FENCES = 16
#: Seconds one call may spend fencing; the writers left wait for the broker.
FENCE_BUDGET_S = 30.0


def writer_metadata(instance_id: str) -> str:
    """The offset metadata every transaction of this member commits."""
    return f"{WRITER_PREFIX}{instance_id}"


def writer_of(metadata: str | None) -> str | None:
    """The instance id a committed offset's metadata names, or None."""
    if not metadata or not metadata.startswith(WRITER_PREFIX):
        return None
    return metadata[len(WRITER_PREFIX) :] or None


def member_instances(desc: Any) -> set[str]:
    """The instance ids of a group description's members, from their
    ``client.id`` (``processor-<instance>[@url]``) and static instance id."""
    live: set[str] = set()
    for member in desc.members:
        static = getattr(member, "group_instance_id", None)
        if static:
            live.add(str(static))
        instance = member_instance(str(member.client_id or ""))
        if instance is not None:
            live.add(instance)
    return live


class ZombieFence:
    """Fences the transactional ids of writers that left the group (see module doc)."""

    def __init__(
        self,
        config: ServiceConfig,
        instance_id: str,
        *,
        admin: Callable[[], Any] | None = None,
        fencer: Callable[[str], None] | None = None,
        counted: Callable[[str], object] = lambda outcome: None,
    ) -> None:
        self.config = config
        self.instance_id = instance_id
        self._admin = admin or (lambda: clients.admin(config))
        self._fencer = fencer or self._init_transactions
        self._counted = counted

    def writers(self, admin: Any) -> set[str]:
        """Every writer named by the group's committed offsets of the events topic
        (last committed, not waiting for pending transactional offsets)."""
        group, topic = self.config.group_id, self.config.topics.events
        request = [ConsumerGroupTopicPartitions(group)]
        futures = admin.list_consumer_group_offsets(
            request, require_stable=False, request_timeout=REQUEST_TIMEOUT_S
        )
        got = futures[group].result(timeout=REQUEST_TIMEOUT_S + 5)
        named = {writer_of(tp.metadata) for tp in got.topic_partitions or [] if tp.topic == topic}
        return {w for w in named if w is not None}

    def members(self, admin: Any) -> set[str]:
        group = self.config.group_id
        futures = admin.describe_consumer_groups([group], request_timeout=REQUEST_TIMEOUT_S)
        return member_instances(futures[group].result(timeout=REQUEST_TIMEOUT_S + 5))

    def fence(self, partitions: Iterable[int], still_open: Callable[[], bool]) -> list[str]:
        """Fence every dead writer while ``partitions`` hold an open transaction;
        the instance ids fenced.  Never raises: a failure is logged and counted,
        and the caller waits for the broker's own abort as before."""
        parts = sorted(set(partitions))
        try:
            admin = self._admin()
            writers = self.writers(admin)
            dead = writers - self.members(admin) - {self.instance_id}
        except (KafkaException, TimeoutError, ValueError, KeyError) as exc:
            log.warning("could not tell the dead writers of %s apart (%s); not fencing", parts, exc)
            self._counted("failed")
            return []
        if not dead:
            return []
        if len(dead) > MAX_FENCES:
            log.warning("%d dead writers named; fencing %d of them", len(dead), MAX_FENCES)
            self._counted("bounded")
        fenced: list[str] = []
        deadline = time.monotonic() + FENCE_BUDGET_S
        for instance in sorted(dead)[:MAX_FENCES]:
            if time.monotonic() > deadline:
                log.warning("fencing ran out of its %.0fs; the rest wait", FENCE_BUDGET_S)
                self._counted("bounded")
                break
            # a member restarting under this id fenced its predecessor itself
            try:
                if not still_open():
                    break
            except KafkaException as exc:
                log.warning(
                    "could not tell whether %s are still open (%s); not fencing", parts, exc
                )
                self._counted("failed")
                break
            t0 = time.monotonic()
            try:
                self._fencer(clients.transactional_id(self.config, instance))
            except (KafkaException, RuntimeError) as exc:
                log.warning("fencing dead member %r failed (%s)", instance, exc)
                self._counted("failed")
                continue
            log.warning(
                "fenced dead member %r (transactional id %r) in %.2fs: its open transaction "
                "on %s partitions %s is aborted",
                instance,
                clients.transactional_id(self.config, instance),
                time.monotonic() - t0,
                self.config.topics.checkpoints,
                parts,
            )
            self._counted("fenced")
            fenced.append(instance)
        return fenced

    def _init_transactions(self, txn_id: str) -> None:
        """A short-lived producer under ``txn_id``: its ``init_transactions``
        aborts the old producer's open transaction and fences it."""
        producer = Producer(clients.fence_settings(self.config, txn_id))
        try:
            producer.init_transactions(REQUEST_TIMEOUT_S)
        finally:
            producer.flush(0)
