"""Figure 1: fold throughput of one Processor vs the ceiling of the stack.

Per run, back to back on the same events topic:

- **ceiling**: a bare consumer with the processor's own consumer settings
  (``clients.group_consumer`` conf, read_committed, but ``assign`` instead of
  a group subscription) reads every partition from offset 0 to its high
  watermark and, per record, Avro-decodes it (``codec.decode_event``) and
  validates it into a core event (``to_event``) — nothing else;
- **service**: ``Processor(config).run(until_offsets=high watermarks)`` with
  exactly-once on, a fresh group id and fresh output topics (views,
  checkpoints, dlq), so it folds the whole topic and returns once every
  partition is committed (views, checkpoints and offsets in transactions).

Rates are events/s from the first record received to the end (all
committed for the service); the wall time including client start-up,
group join and restore is recorded as well.
"""

from __future__ import annotations

import os
import resource
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from bench.build import running_build
from bench.common import Context, measure, ratio, result, rss_bytes, unique, wait_topics_ready
from processor.codec import default_codec
from processor.config import ServiceConfig
from processor.kafka import clients
from processor.kafka.topic_admin import create_topics
from processor.service.loop.runner import Processor
from processor.telemetry.metrics import Metrics

#: CPU microseconds per event of the whole Processor (every thread of the
#: process, librdkafka's included), the fixed target for the compiled build.
TARGET_US = 12.0


@dataclass(frozen=True)
class Run:
    events: int
    seconds: float  # first record -> done
    wall: float  # start -> done
    #: CPU seconds of this process (all its threads, librdkafka's too) start -> done:
    #: on a shared box the steadier measure (wall time includes other processes' turns)
    cpu: float = 0.0

    @property
    def rate(self) -> float:
        return self.events / self.seconds

    @property
    def wall_rate(self) -> float:
        return self.events / self.wall

    @property
    def cpu_rate(self) -> float:
        return self.events / self.cpu if self.cpu > 0 else 0.0


def cpu_seconds() -> float:
    """User + system CPU of this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def ceiling(config: ServiceConfig, highs: dict[int, int]) -> Run:
    """Read + Avro-decode + ``to_event`` every record of the events topic."""
    codec = default_codec()
    topic = config.topics.events
    t0, c0 = time.perf_counter(), cpu_seconds()
    consumer = clients.group_consumer(
        config.with_overrides(group_id=unique("bench-ceiling")), "ceiling"
    )
    todo = {p for p, high in highs.items() if high > 0}
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in todo])
    n = 0
    first: float | None = None
    try:
        while todo:
            msgs = consumer.consume(num_messages=5_000, timeout=0.5)
            if msgs and first is None:
                first = time.perf_counter()
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(f"ceiling consumer: {err}")
                codec.decode_event(msg.value() or b"").to_event()
                n += 1
                p = msg.partition() or 0
                if (msg.offset() or 0) >= highs[p] - 1:
                    todo.discard(p)
    finally:
        consumer.close()
    end = time.perf_counter()
    return Run(n, end - (first or t0), end - t0, cpu_seconds() - c0)


def fresh_output(ctx: Context, tag: str, **overrides: Any) -> ServiceConfig:
    """Config reading the workload's events topic, writing to new topics, new group."""
    wl = ctx.workload
    prefix = unique(f"bench-{tag}")
    config = ctx.config(
        topic_prefix=prefix,
        events_topic=wl.events_topic,
        group_id=f"{prefix}-group",
        instance_id=f"{prefix}-0",
        partitions=len(wl.highs),
        **overrides,
    )
    create_topics(clients.admin(config), config)
    t = config.topics
    wait_topics_ready(config, [t.views, t.checkpoints, t.dlq])
    return config


class _FirstRecord:
    """Notes when a processor's consumed-records counter first moves."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.at: float | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(0.005):
            if self.metrics.records_consumed._value.get() > 0:
                self.at = time.perf_counter()
                return

    def stop(self) -> None:
        self._done.set()
        self._thread.join(1)


def service(
    config: ServiceConfig, highs: dict[int, int], profiler: Any = None, watch_first: bool = True
) -> tuple[Run, Metrics]:
    """One Processor over the whole topic until every partition is committed."""
    metrics = Metrics()
    t0, c0 = time.perf_counter(), cpu_seconds()
    proc = Processor(config, metrics=metrics)
    watch = _FirstRecord(metrics) if watch_first else None
    if profiler is not None:
        profiler.start()
    try:
        proc.run(until_offsets=dict(highs), max_idle_s=60, max_wait_s=60)
    finally:
        if profiler is not None:
            profiler.stop()
        if watch is not None:
            watch.stop()
    end = time.perf_counter()
    n = int(metrics.records_consumed._value.get())
    first = watch.at if watch is not None else None
    return Run(n, end - (first or t0), end - t0, cpu_seconds() - c0), metrics


def run(ctx: Context) -> dict[str, Any]:
    wl = ctx.workload
    ceilings: list[Run] = []
    services: list[Run] = []
    commits: list[float] = []
    rss: list[float] = []
    loads: list[float] = []
    for _ in range(ctx.runs):
        loads.append(os.getloadavg()[0])
        ceilings.append(ceiling(ctx.config(topic_prefix=wl.prefix), wl.highs))
        before = rss_bytes()
        svc, metrics = service(fresh_output(ctx, "fold"), wl.highs)
        rss.append((rss_bytes() - before) / 2**20)
        if svc.events != wl.events:
            raise RuntimeError(f"processor consumed {svc.events} of {wl.events} events")
        services.append(svc)
        commits.append(metrics.commits._value.get())
    r = ratio("service / ceiling", [s.rate for s in services], [c.rate for c in ceilings])
    wall = ratio(
        "service / ceiling, wall incl. start-up",
        [s.wall_rate for s in services],
        [c.wall_rate for c in ceilings],
    )
    by_cpu = ratio(
        "service / ceiling, events per CPU second of this process",
        [s.cpu_rate for s in services],
        [c.cpu_rate for c in ceilings],
    )
    us_per_event = 1e6 / statistics.median(s.cpu_rate for s in services)
    cfg = ctx.config()
    doc = result(
        ctx,
        "throughput",
        "Fold throughput: one Processor (exactly-once) vs bare consumer",
        workload=wl.describe(),
        value=measure(
            "Processor, first record -> all committed", "events/s", [s.rate for s in services]
        ),
        baseline=measure(
            "ceiling: consume + Avro decode + to_event", "events/s", [c.rate for c in ceilings]
        ),
        ratio=r,
        targets=[
            {
                "text": f"Processor <= {TARGET_US:g} us CPU per event "
                f"(median {us_per_event:.1f} us, build {running_build()})",
                "met": us_per_event <= TARGET_US,
            }
        ],
        rows=[
            [
                "Processor wall incl. start-up/join (events/s)",
                _fmt(measure("", "", [s.wall_rate for s in services])),
            ],
            [
                "ceiling wall incl. start-up (events/s)",
                _fmt(measure("", "", [c.wall_rate for c in ceilings])),
            ],
            ["ratio, wall", _fmt(wall)],
            [
                "Processor events per CPU second (process CPU, librdkafka threads included)",
                _fmt(measure("", "", [s.cpu_rate for s in services])),
            ],
            [
                "ceiling events per CPU second",
                _fmt(measure("", "", [c.cpu_rate for c in ceilings])),
            ],
            ["ratio by CPU seconds (steadier on a shared box)", _fmt(by_cpu)],
            [
                "1-minute load average at the start of each run",
                ", ".join(f"{x:.1f}" for x in loads),
            ],
            ["transactions per run", _fmt(measure("", "", commits, 0))],
            [
                "commit interval / max batch",
                f"{cfg.commit_interval_ms} ms / {cfg.max_batch_events} events",
            ],
            ["RSS growth of the bench process per run (MiB)", _fmt(measure("", "", rss))],
        ],
        raw={"service": [vars(s) for s in services], "ceiling": [vars(c) for c in ceilings]},
    )
    return doc


def _fmt(m: dict[str, Any]) -> str:
    return f"{m['median']:g} (min {m['min']:g}, max {m['max']:g})"
