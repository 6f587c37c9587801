"""Which member owns a session, and where it answers queries (issue 13).

A session's events, views and checkpoints live in the partition its key
hashes to with the producers' partitioner (murmur2, ``clients.event_producer``),
and that events partition is owned by exactly one member of the group.

Each member advertises the URL of its HTTP port in its group consumer's
``client.id`` (``processor-<instance>@<url>``): confluent-kafka lets a
client set no group member metadata of its own, but
``AdminClient.describe_consumer_groups`` reports every member's
``client_id`` and assignment, so any member (or the CLI) can map a
partition to a URL with one admin call.  The lookup is cached for a few
seconds (bounded), since every redirect would otherwise cost a round trip
to the group coordinator.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from processor.codec import session_key
from processor.engine.commands import partition_of

#: Between the member name and its advertised URL in ``client.id``.
ADVERTISE_SEP = "@"
#: How long a group description is reused before it is asked again.
OWNERS_TTL_S = 3.0


#: How every member's ``client.id`` starts (group_watch.py tells members apart by it).
MEMBER_PREFIX = "processor-"


def member_client_id(instance_id: str, advertised: str | None) -> str:
    """The group consumer's ``client.id``: the member name, then its query URL."""
    base = f"{MEMBER_PREFIX}{instance_id}"
    return f"{base}{ADVERTISE_SEP}{advertised}" if advertised else base


def advertised_url(client_id: str) -> str | None:
    """The URL a member put in its ``client.id``, or None (an older member)."""
    _, sep, url = client_id.rpartition(ADVERTISE_SEP)
    return url if sep and url.startswith(("http://", "https://")) else None


def member_instance(client_id: str) -> str | None:
    """The instance id a member's ``client.id`` names (:func:`member_client_id`
    read back), or None for a client that is not a member."""
    if not client_id.startswith(MEMBER_PREFIX):
        return None
    name = client_id[len(MEMBER_PREFIX) :]
    url = advertised_url(name)
    return name.rpartition(ADVERTISE_SEP)[0] if url is not None else name


def session_partition(session_id: str, partitions: int) -> int:
    """The events partition of a session: murmur2 of its key, as the producers do."""
    return partition_of(session_key(session_id), partitions)


@dataclass(frozen=True, slots=True)
class GroupView:
    """Who owns which events partition, as the group coordinator described it."""

    partitions: int  # events partitions of the topic
    owners: Mapping[int, str | None]  # partition -> URL (None: owner advertises none)

    def owner_of(self, session_id: str) -> tuple[int, str | None, bool]:
        """(partition, owner URL, assigned at all) of a session."""
        p = session_partition(session_id, self.partitions)
        return p, self.owners.get(p), p in self.owners


def describe_group(admin: Any, group: str, topic: str, timeout: float = 10.0) -> GroupView:
    """One ``describe_consumer_groups`` call plus the topic's partition count."""
    meta = admin.list_topics(topic, timeout=timeout).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        raise RuntimeError(f"topic {topic} does not exist")
    desc = admin.describe_consumer_groups([group], request_timeout=timeout)[group].result(
        timeout=timeout
    )
    owners: dict[int, str | None] = {}
    for client_id, held in partitions_held(desc, topic):
        for partition in held:
            owners[partition] = advertised_url(client_id)
    return GroupView(len(meta.partitions), owners)


def partitions_held(desc: Any, topic: str) -> list[tuple[str, tuple[int, ...]]]:
    """Each member of a group description: its client id and the partitions of
    ``topic`` it holds (here, and group_watch.py through the transport)."""
    members = []
    for member in desc.members:
        held = member.assignment.topic_partitions if member.assignment else None
        parts = tuple(sorted(tp.partition for tp in held or [] if tp.topic == topic))
        members.append((str(member.client_id or ""), parts))
    return members


class OwnerDirectory:
    """:func:`describe_group`, cached for ``ttl_s`` (thread-safe; one call at a time)."""

    def __init__(self, describe: Callable[[], GroupView], ttl_s: float = OWNERS_TTL_S) -> None:
        self._describe = describe
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._view: GroupView | None = None
        self._at = 0.0

    def view(self, *, fresh: bool = False) -> GroupView:
        with self._lock:
            now = time.monotonic()
            if fresh or self._view is None or now - self._at > self._ttl_s:
                self._view = self._describe()
                self._at = now
            return self._view
