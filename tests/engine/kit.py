"""A broker-less harness around the engine: records in, produced records out."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from processor.client.views_reader import _Materializer, session_fold_equivalent
from processor.codec import Checkpoint, DeadLetter, default_codec
from processor.config import ServiceConfig
from processor.core.builtin import default_registry
from processor.core.defaults import default_message_projections
from processor.core.events import Event
from processor.engine import Batch, Engine, Out, PartitionState, Record
from processor.engine.checkpoints import latest_checkpoints
from processor.engine.commands import Command, redrive
from processor.engine.replay_floor import PublishFloor
from processor.workload import generate_session

CODEC = default_codec()
CONFIG = ServiceConfig()
EVENTS = CONFIG.topics.events
CONTROL = CONFIG.topics.control


def session_log(n: int, seed: int = 7) -> list[Event]:
    return generate_session(random.Random(seed), n)


def changed(event: Event) -> Event:
    """The same seq with different content (a rewrite, not a retry)."""
    return replace(event, time=event.time + 1)


@dataclass
class Feeds:
    """Scripted transport: a control backlog and a session history per partition.

    (Not a NoFeeds subclass: the compiled build's engine classes cannot have
    interpreted subclasses.)"""

    backlog: dict[int, list[Record]] = field(default_factory=dict)
    history: dict[int, list[Record]] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)

    def control_backlog(self, partition: int) -> list[Record]:
        self.asked.append(f"backlog {partition}")
        return self.backlog.pop(partition, [])

    def session_history(
        self, partition: int, start: int, end: int, key: bytes
    ) -> list[Record] | None:
        self.asked.append(f"history {partition} {start}..{end}")
        return [
            r for r in self.history.get(partition, []) if start <= r.offset < end and r.key == key
        ]

    def check_route(self, command: Command, partition: int) -> None:
        return None


def keys(outs: list[Out], topic: str | None = None) -> list[bytes]:
    """The keys of ``outs`` (of one topic), which are never null for our records."""
    found = [o.key for o in outs if topic is None or o.topic == topic]
    assert all(k is not None for k in found)
    return [k for k in found if k is not None]


class Harness:
    """One engine owning ``partitions``, a log per partition, and a views topic."""

    def __init__(
        self,
        partitions: tuple[int, ...] = (0,),
        *,
        config: ServiceConfig = CONFIG,
        checkpoints: dict[int, dict[str, Checkpoint]] | None = None,
        publish_floor: Mapping[str, int | PublishFloor] | None = None,
    ) -> None:
        self.feeds = Feeds()
        self.engine = Engine(
            config,
            CODEC,
            default_registry(),
            default_message_projections(),
            instance_id="unit",
            publish_floor=publish_floor,
            feeds=self.feeds,
        )
        for p in partitions:
            cps = (checkpoints or {}).get(p, {})
            self.engine.partitions[p] = PartitionState(p, dict(cps))
        self.offsets: dict[int, int] = {}
        self.produced: list[Out] = []

    def record(
        self, key: bytes | None, value: bytes | None, partition: int = 0, topic: str = EVENTS
    ) -> Record:
        offset = self.offsets.get(partition, 0)
        self.offsets[partition] = offset + 1
        return Record(topic, partition, offset, key, value, 1_000 + offset)

    def event(self, sid: str, event: Event, partition: int = 0) -> Record:
        return self.record(sid.encode(), CODEC.encode_parsed_event(sid, event), partition)

    def fold(self, rec: Record) -> Any:
        return self.engine.fold(self.engine.partitions[rec.partition], rec)

    def fold_events(self, sid: str, events: list[Event], partition: int = 0) -> list[Any]:
        return [self.fold(self.event(sid, e, partition)) for e in events]

    def command(self, command: Command, partition: int = 0) -> Record:
        return self.record(command.session_id.encode(), command.encode(), partition, CONTROL)

    def redrive(self, sid: str, seq: int, partition: int = 0) -> list[str]:
        return self.engine.apply_commands([self.command(redrive(sid, seq), partition)])

    def commit(self) -> list[Out]:
        """Produce the batch's records (as one transaction would) and start a new batch."""
        out = list(self.engine.output())
        self.produced.extend(out)
        self.engine.batch = Batch()
        return out

    # ------------------------------------------------------------ reading back

    def topic(self, name: str) -> list[Out]:
        return [o for o in self.produced if o.topic == name]

    def dead_letters(self) -> list[DeadLetter]:
        return [
            CODEC.decode_dead_letter(o.value)
            for o in self.topic(CONFIG.topics.dlq)
            if o.value is not None
        ]

    def views(self) -> dict[str, Any]:
        """Every session's views as a reader of the (compacted) views topic sees them."""
        reader = _Materializer(CODEC, None, None)
        for o in self.topic(CONFIG.topics.views):
            reader.apply(o.key, o.value)
        return reader.views

    def fold_equivalent(self, sid: str) -> dict[str, Any]:
        return session_fold_equivalent(self.views()[sid])

    def checkpoints(self) -> dict[str, Checkpoint]:
        """The newest checkpoint per session, assembled as a restore would (compaction
        is invisible to it: the last record per key wins either way)."""
        records = [(o.key, o.value) for o in self.topic(CONFIG.topics.checkpoints)]
        restored = latest_checkpoints(CODEC, records)
        assert restored.bad_records == 0
        return restored.checkpoints


# ------------------------------------------------------- compaction, folds (issue 12)


def compacted(outs: list[Out]) -> list[Out]:
    """``outs`` of one compacted topic partition as a reader from offset 0 finds them.

    The last record per key survives, in log order; a key whose last record
    is a tombstone is gone (its tombstone expired too).
    """
    last: dict[bytes | None, int] = {o.key: i for i, o in enumerate(outs)}
    return [o for i, o in enumerate(outs) if last[o.key] == i and o.value is not None]


def offline_fold(events: list[Event]) -> dict[str, Any]:
    """What a healthy session's assembled views must equal (``processor fold``)."""
    from processor.client.views_reader import offline_equivalent
    from processor.offline import fold_events, session_output

    doc: dict[str, Any] = plain(offline_equivalent(session_output(fold_events(events))))
    return doc


def plain(value: Any) -> Any:
    """``value`` as JSON data (tuples become lists), for comparisons."""
    import orjson

    return orjson.loads(orjson.dumps(value))


def materialize(outs: list[Out]) -> dict[str, Any]:
    """Every session's views assembled from views records (``views_reader``)."""
    reader = _Materializer(CODEC, None, None)
    for o in outs:
        reader.apply(o.key, o.value)
    return reader.views


def restored_from(h: Harness, *, config: ServiceConfig = CONFIG) -> Harness:
    """A new owner of ``h``'s partition 0 after compaction of its output topics.

    Checkpoints come from the compacted checkpoints topic through
    ``latest_checkpoints`` (the Kafka restore's path); the new harness's
    produced records start as both compacted topics, and the events offsets
    go on where ``h`` stopped.
    """
    from processor.engine.checkpoints import latest_checkpoints

    cps = compacted(h.topic(CONFIG.topics.checkpoints))
    restored = latest_checkpoints(CODEC, [(o.key, o.value) for o in cps])
    assert restored.bad_records == 0
    r = Harness(config=config, checkpoints={0: restored.checkpoints})
    r.offsets = dict(h.offsets)
    r.produced = [*cps, *compacted(h.topic(CONFIG.topics.views))]
    return r
