"""Topic layout: create and verify the five topics with the right configs.

- events: ``partitions`` partitions, kept forever (the log is the truth);
- views: compacted, co-partitioned with events (a session's views live in
  the same partition number as its events);
- checkpoints: compacted, co-partitioned with events (restore of events
  partition ``p`` reads checkpoints partition ``p`` only);
- dlq: kept forever by default, same partition count;
- control: operator commands (see ``control.py``), co-partitioned with
  events so the owner of events partition ``p`` reads control partition
  ``p``; kept forever (a few records per incident).

Compaction settings keep the compacted topics small in practice: segments
roll every minute (checkpoints) or ten (views) and a 10% dirty ratio
triggers the cleaner.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
)

from processor.config import ServiceConfig
from processor.engine.record_bounds import TOPIC_MAX_MESSAGE_BYTES


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    configs: dict[str, str]


def topic_specs(
    config: ServiceConfig,
    *,
    compaction_overrides: dict[str, str] | None = None,
) -> list[TopicSpec]:
    """The topic layout.

    Checkpoints roll a segment every minute: the active segment is never
    compacted, so a restore reads at most about a minute of superseded
    checkpoints on top of one record per session — bounded by the write
    rate, not by the length of the log.  Views roll every ten minutes.
    """
    t = config.topics
    compacted = {
        "cleanup.policy": "compact",
        "min.cleanable.dirty.ratio": "0.1",
        "segment.ms": str(600_000),
        "max.message.bytes": str(TOPIC_MAX_MESSAGE_BYTES),  # VF-7's bound
        **(compaction_overrides or {}),
    }
    checkpoints = {**compacted, "segment.ms": str(60_000), **(compaction_overrides or {})}
    forever = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}
    n = config.partitions
    return [
        TopicSpec(t.events, n, dict(forever)),
        TopicSpec(t.views, n, dict(compacted)),
        TopicSpec(t.checkpoints, n, checkpoints),
        TopicSpec(t.dlq, n, dict(forever)),
        TopicSpec(t.control, n, dict(forever)),
    ]


def create_topics(
    admin: AdminClient,
    config: ServiceConfig,
    *,
    compaction_overrides: dict[str, str] | None = None,
    timeout: float = 30,
) -> list[str]:
    """Create missing topics; returns the names created (existing ones are left)."""
    specs = topic_specs(config, compaction_overrides=compaction_overrides)
    existing = set(admin.list_topics(timeout=timeout).topics)
    new = [
        NewTopic(
            s.name,
            num_partitions=s.partitions,
            replication_factor=config.replication_factor,
            config=s.configs,
        )
        for s in specs
        if s.name not in existing
    ]
    if not new:
        return []
    created = []
    for name, future in admin.create_topics(new, operation_timeout=timeout).items():
        try:
            future.result()
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != 36:  # TOPIC_ALREADY_EXISTS: a racing creator
                raise
    _await_metadata(admin, created, timeout)
    return created


def _await_metadata(admin: AdminClient, names: list[str], timeout: float) -> None:
    """Wait (bounded) until the broker's metadata lists the new topics.

    A create returns when the controller accepted it; a metadata request
    right after may not list the topic yet (seen under load), so a verify
    straight after a create would report it missing.
    """
    deadline = time.monotonic() + timeout
    pending = set(names)
    while pending and time.monotonic() < deadline:
        meta = admin.list_topics(timeout=max(1.0, deadline - time.monotonic())).topics
        pending = {
            n
            for n in pending
            if n not in meta or meta[n].error is not None or not meta[n].partitions
        }
        if pending:
            time.sleep(0.2)


def verify_topics(admin: AdminClient, config: ServiceConfig, timeout: float = 30) -> list[str]:
    """Problems with the topic layout (empty list: all good)."""
    problems: list[str] = []
    specs = topic_specs(config)
    meta = admin.list_topics(timeout=timeout).topics
    events_parts = len(meta[specs[0].name].partitions) if specs[0].name in meta else None
    present = []
    for spec in specs:
        if spec.name not in meta:
            problems.append(f"{spec.name}: missing (run `processor topics create`)")
            continue
        present.append(spec)
        parts = len(meta[spec.name].partitions)
        if events_parts is not None and parts != events_parts:
            problems.append(
                f"{spec.name}: {parts} partitions, events has {events_parts} "
                "(must be co-partitioned)"
            )
    resources = [ConfigResource(ConfigResource.Type.TOPIC, s.name) for s in present]
    if resources:
        for resource, future in admin.describe_configs(resources).items():
            actual = {k: v.value for k, v in future.result().items()}
            spec = next(s for s in present if s.name == resource.name)
            want_policy = spec.configs["cleanup.policy"]
            if actual.get("cleanup.policy") != want_policy:
                problems.append(
                    f"{spec.name}: cleanup.policy={actual.get('cleanup.policy')}, "
                    f"expected {want_policy}"
                )
            if (
                want_policy == "delete"
                and spec.name == config.topics.events
                and actual.get("retention.ms") != "-1"
            ):
                problems.append(
                    f"{spec.name}: retention.ms={actual.get('retention.ms')}; the "
                    "events log must be kept forever (-1)"
                )
    return problems


def internal_topic(name: str) -> bool:
    """The broker's own topics (``__consumer_offsets``, ``__transaction_state``...)."""
    return name.startswith("__")


def delete_topics(admin: AdminClient, names: list[str], timeout: float = 30) -> None:
    """Delete ``names``; refuses the broker's internal topics.

    Deleting ``__consumer_offsets`` or ``__transaction_state`` loses every
    group's offsets and every open transaction on the cluster; the broker
    re-creates them empty on next use, and the coordinators' reloads stall
    commits for seconds (a bench helper once deleted them as "topics created
    during the figure": the next latency runs' first transactions took 400 ms).
    """
    internal = [n for n in names if internal_topic(n)]
    if internal:
        raise ValueError(f"refusing to delete the broker's internal topics {internal}")
    for future in admin.delete_topics(names, operation_timeout=timeout).values():
        future.result()
