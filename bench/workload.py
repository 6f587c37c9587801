"""The benchmark workload: generate session logs once, produce them once.

Half the sessions are scripted agent runs (``scripted_sessions``: the
reference step loop with the mock model adapter: turns, steps, tool calls and
results, prompt, tool and runtime-context changes, retries, inbox splices),
cut to the wanted length; the other half come from
:func:`processor.workload.generate_session`, which adds what the scripts do
not write: compaction replaces, tool-result and system-prompt rewrites, image
offloads, ignorable events and ~2% large (~10 KB) tool results.  All are
valid logs.  Session ids are ours (``<tag>-<n>``),
so several workloads can share a broker.

Events of all sessions are interleaved the way concurrent agents write them
(a random active session appends its next 1-4 events), keyed by session id
and partitioned with the Java-compatible murmur2 partitioner over 12
partitions.
"""

from __future__ import annotations

import gc
import importlib
import inspect
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import TopicPartition

from bench.common import wait_topics_ready
from processor.codec import default_codec
from processor.config import ServiceConfig
from processor.core.events import Event
from processor.kafka import clients
from processor.kafka.topic_admin import create_topics
from processor.workload import generate_session

PARTITIONS = 12

#: sessions x events per session for each ``--scale``
SCALES: dict[str, tuple[int, int]] = {
    "1k": (1_000, 60),
    "10k": (10_000, 60),
    "100k": (100_000, 12),
}

Log = tuple[str, list[Event]]


@dataclass(frozen=True)
class Workload:
    """A produced workload: where it is and how big."""

    prefix: str  # topic prefix; the events topic is ``<prefix>.events``
    events_topic: str
    sessions: int
    events_per_session: int
    events: int
    value_bytes: int
    highs: dict[int, int]  # partition -> high watermark after producing
    generator: str
    generate_s: float
    produce_s: float

    def describe(self) -> str:
        return (
            f"{self.sessions} sessions x {self.events_per_session} events = {self.events} "
            f"events, {self.value_bytes / self.events:.0f} B/event avg Avro, "
            f"{PARTITIONS} partitions ({self.generator})"
        )


def _scripted() -> Any:
    """The scripted-agent session generator, wherever this checkout keeps it."""
    for module in ("processor.examples.make_example", "processor.demo_sessions"):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        fn = getattr(mod, "scripted_sessions", None)
        if fn is not None:
            return fn
    return None


def generator_name() -> str:
    fn = _scripted()
    walker = "processor.workload.generate_session (big_ratio 0.02 of ~10 KB tool results)"
    if fn is None:
        return walker
    return f"half {fn.__module__}.scripted_sessions (step loop + mock model), half {walker}"


def _scripted_log(fn: Any, seed: int, length: int) -> list[Event]:
    """A scripted agent session cut to exactly ``length`` events (a prefix is valid)."""
    params = inspect.signature(fn).parameters
    turns = max(2, length // 12 + 1)
    for _ in range(8):
        kwargs = {"turns": turns} if "turns" in params else {"length": length}
        events = next(iter(fn(1, seed=seed, **kwargs)))[1]
        if len(events) >= length:
            return list(events[:length])
        turns *= 2
    raise RuntimeError(f"scripted sessions stay shorter than {length} events")


def scripted_log(seed: int, length: int) -> list[Event]:
    """One scripted agent session of exactly ``length`` events (the generator must exist)."""
    fn = _scripted()
    if fn is None:
        raise RuntimeError("this checkout has no scripted-session generator")
    return _scripted_log(fn, seed, length)


def session_logs(
    n: int, length: int, *, seed: int = 7, tag: str = "s", scripted_share: float = 0.5
) -> Iterator[Log]:
    """``n`` valid session logs of exactly ``length`` events, ids ``<tag>-<i>``.

    A ``scripted_share`` of them are scripted agent runs (when the checkout has
    them), the rest come from the random walker with ~10 KB tool results.
    """
    fn = _scripted()
    rng = random.Random(seed)
    for i in range(n):
        sub = rng.randrange(2**31)
        sid = f"{tag}-{i:06d}"
        if fn is not None and rng.random() < scripted_share:
            yield sid, _scripted_log(fn, sub, length)
        else:
            yield sid, generate_session(random.Random(sub), length)


def interleave(
    logs: Sequence[tuple[str, Sequence[Event]]],
    seed: int = 11,
) -> Iterator[tuple[str, Event]]:
    """All events, sessions interleaved, each session's events in seq order."""
    rng = random.Random(seed)
    active = [(sid, list(events)) for sid, events in logs if events]
    pos = [0] * len(active)
    live = list(range(len(active)))
    while live:
        k = rng.randrange(len(live))
        i = live[k]
        sid, events = active[i]
        for _ in range(rng.randint(1, 4)):
            yield sid, events[pos[i]]
            pos[i] += 1
            if pos[i] == len(events):
                live[k] = live[-1]
                live.pop()
                break


def produce(config: ServiceConfig, stream: Iterator[tuple[str, Event]]) -> tuple[int, int]:
    """Produce ``(session id, event)`` pairs to the events topic; returns (events, bytes)."""
    codec = default_codec()
    producer = clients.event_producer(config, "bench-workload")
    topic = config.topics.events
    n = size = 0
    for sid, event in stream:
        value = codec.encode_parsed_event(sid, event)
        size += len(value)
        while True:
            try:
                producer.produce(topic, value=value, key=sid.encode())
                break
            except BufferError:
                producer.poll(0.05)
        n += 1
        if n % 1000 == 0:
            producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("workload: not every event was delivered")
    return n, size


def high_watermarks(config: ServiceConfig, topic: str | None = None) -> dict[int, int]:
    topic = topic or config.topics.events
    consumer = clients.plain_consumer(config, "bench-marks")
    try:
        meta = consumer.list_topics(topic, timeout=30).topics[topic]
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in sorted(meta.partitions)
        }
    finally:
        consumer.close()


def create(config: ServiceConfig) -> None:
    create_topics(clients.admin(config), config.with_overrides(partitions=PARTITIONS))
    t = config.topics
    wait_topics_ready(config, [t.events, t.views, t.checkpoints, t.dlq])


def build(config: ServiceConfig, sessions: int, length: int, *, seed: int = 7) -> Workload:
    """Generate the workload and produce it into ``<config.topic_prefix>.events``."""
    create(config)
    t0 = time.perf_counter()
    logs = list(session_logs(sessions, length, seed=seed))
    t1 = time.perf_counter()
    n, size = produce(config, interleave(logs))
    t2 = time.perf_counter()
    del logs
    gc.collect()  # the figures run in this process: leave no workload objects behind
    return Workload(
        config.topic_prefix,
        config.topics.events,
        sessions,
        length,
        n,
        size,
        high_watermarks(config),
        generator_name(),
        t1 - t0,
        t2 - t1,
    )
