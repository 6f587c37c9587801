"""Replay from offset zero: rebuild every view and checkpoint from the log.

In place (default): refuse while the group has live members, remember each
session's checkpointed ``lastSeq`` (its published views' ``asOfSeq``),
tombstone the checkpoints, delete the group's committed offsets and refold
everything.  Views of a session are held back until it reaches its old seq,
so a subscriber never sees ``asOfSeq`` go backwards.  A bumped
``stateVersion`` makes the old rows unusable; this is the refold it forces.

Into fresh topics (``into_prefix``): the same events topic is folded by a new
group into ``<into_prefix>.views/.checkpoints/.dlq`` for a blue/green switch;
the old topics are untouched.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import KafkaException

from processor.codec import part_key, session_key
from processor.config import ServiceConfig
from processor.core.builtin import default_registry
from processor.core.errors import Unavailable
from processor.core.projections import ProjectionRegistry
from processor.engine.replay_floor import PublishFloor, replay_floor
from processor.kafka import clients
from processor.kafka.reads import watermarks
from processor.kafka.schema_registry import codec_for
from processor.kafka.topic_admin import create_topics
from processor.service.loop.runner import Processor
from processor.service.partitions.restore import load_checkpoints

log = logging.getLogger(__name__)


class ReplayError(Unavailable, RuntimeError):
    pass


@dataclass(frozen=True)
class ReplayResult:
    config: ServiceConfig
    events: int
    seconds: float
    sessions_held_back: int


def _group_is_idle(config: ServiceConfig) -> bool:
    admin = clients.admin(config)
    future = admin.describe_consumer_groups([config.group_id])[config.group_id]
    try:
        desc = future.result()
    except KafkaException:
        return True  # no such group
    return not desc.members


def replay(
    config: ServiceConfig,
    *,
    into_prefix: str | None = None,
    progress: Callable[[int, int, int | None], None] | None = None,
    registry_factory: Callable[[], ProjectionRegistry] = default_registry,
) -> ReplayResult:
    """Rebuild views and checkpoints from offset zero (see the module docstring).

    ``progress(events consumed, events to replay, sessions)`` is called about
    twice a second and once at the end; sessions is the most held in memory so
    far, None before the first commit reported any.
    """
    admin = clients.admin(config)
    events_topic = config.topics.events
    meta = admin.list_topics(events_topic, timeout=30).topics.get(events_topic)
    if meta is None or meta.error is not None:
        raise ReplayError(f"events topic {events_topic} does not exist")
    partitions = sorted(meta.partitions)
    floors: dict[str, PublishFloor] = {}
    if into_prefix:
        target = config.with_overrides(
            topic_prefix=into_prefix,
            events_topic=events_topic,
            group_id=f"{config.group_id}-{into_prefix}",
            partitions=len(partitions),
        )
        create_topics(admin, target)
    else:
        target = config
        if not _group_is_idle(config):
            raise ReplayError(
                f"consumer group {config.group_id} has live members; stop the "
                "processors before an in-place replay"
            )
        floors = _tombstone_checkpoints(config, partitions)
        try:
            admin.delete_consumer_groups([config.group_id])[config.group_id].result()
        except KafkaException as exc:
            if "GROUP_ID_NOT_FOUND" not in str(exc):
                raise
    consumer = clients.plain_consumer(config, "replay-watermarks")
    try:
        marks = {p: watermarks(consumer, events_topic, p) for p in partitions}
    finally:
        consumer.close()
    total = sum(high - low for low, high in marks.values())
    proc = Processor(target, registry_factory=registry_factory, publish_floor=floors)
    done = threading.Event()

    most_sessions = 0

    def counts() -> tuple[int, int | None]:
        # sessions: the most held at once (a replay holds every session it has
        # folded; the gauge drops to 0 when the member leaves the group at the end,
        # and a replay shorter than a report period may never show it)
        nonlocal most_sessions
        sample = proc.metrics.registry.get_sample_value
        most_sessions = max(most_sessions, int(sample("processor_sessions_in_memory") or 0))
        return int(sample("processor_records_consumed_total") or 0), most_sessions or None

    def report() -> None:
        while not done.wait(0.5):
            if progress is not None:
                consumed, sessions = counts()
                progress(consumed, total, sessions)

    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    t0 = time.monotonic()
    try:
        proc.run(until_offsets={p: high for p, (_, high) in marks.items()})
    finally:
        done.set()
        reporter.join(2)
    consumed, sessions = counts()
    if progress is not None:
        progress(consumed, total, sessions)
    return ReplayResult(target, consumed, time.monotonic() - t0, len(floors))


def _tombstone_checkpoints(config: ServiceConfig, partitions: list[int]) -> dict[str, PublishFloor]:
    """Tombstone every checkpoint; return each session's publish floor (replay_floor.py)."""
    consumer = clients.plain_consumer(config, "replay-checkpoints")
    producer = clients.event_producer(config, "processor-replay")
    codec = codec_for(config)
    floors: dict[str, PublishFloor] = {}
    try:
        for p, restore in load_checkpoints(
            consumer, codec, config.topics.checkpoints, partitions
        ).items():
            for sid, cp in restore.checkpoints.items():
                floors[sid] = replay_floor(p, sid, cp, config)  # and the old records
                parted = cp.surface.get("service", {}).get("parted") or {}
                keys = [session_key(sid), *(part_key(sid, n) for n in parted.get("partNames", ()))]
                for key in keys:  # the head and its parts (format 2)
                    producer.produce(config.topics.checkpoints, key=key, value=None, partition=p)
                    producer.poll(0)
        if producer.flush(60):
            raise ReplayError("could not deliver checkpoint tombstones")
    finally:
        consumer.close()
    log.info("tombstoned %d checkpoints", len(floors))
    return floors
