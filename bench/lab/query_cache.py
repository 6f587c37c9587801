"""Cost of queries by session (issue 13), broker-less: ``python -m bench.lab.query_cache``.

The engine (``processor.engine``, the code the Kafka loop drives) folds
``--sessions`` sessions of ``--events`` events, ``--batch`` sessions' events
per transaction; every transaction's views records go to a
:class:`~processor.service.queries.query_cache.QueryCache` as the runner hands them
over.  Reported: the engine's fold + output time and the cache's
``committed`` time on the loop thread (their quotient is what queries add to
a batch), the fill rate (records a fill writes per second), the latency of
``session_views`` (the query's work) and the cache file's live bytes; and
the process CPU of the same folds without a cache (the writer thread's
SQLite work shows there, not on the loop).  Memory is not a figure: SQLite
holds a fixed page cache (``CACHE_KIB`` per connection), the rows are on disk.

Measured (Dec 3, 2 cores shared with other jobs, load ~5; 5,000 sessions x 12
events, 200 sessions per batch, 79,540 view records): loop thread +0.7 %
of fold + output (the records are only queued), process CPU +16-17 % (the
writer thread's SQLite work), fill 80k-174k records/s, ``session_views``
median 0.3 ms, p99 5-13 ms, 20.8 MB of cache file.  On the real broker
(tests' fixture, 2,000 sessions x 12 events, 3 partitions): a fresh member's
fill from assignment to every partition served 3.2 s (6.0 MB), HTTP
``GET /sessions/<id>/views`` median 1.7 ms, p99 6.7 ms.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

from prometheus_client import CollectorRegistry

from processor.codec import Codec, default_codec
from processor.config import ServiceConfig
from processor.core.builtin import default_registry
from processor.core.defaults import default_message_projections
from processor.core.events import Event
from processor.engine import Batch, Engine, PartitionState, Record
from processor.service.queries.query_cache import QueryCache
from processor.workload import generate_session


def _setup(
    sessions: int, events: int
) -> tuple[ServiceConfig, Codec, Engine, PartitionState, dict[str, list[Event]]]:
    """One engine owning partition 0 and the same generated logs for both sides."""
    config = ServiceConfig()
    codec = default_codec()
    engine = Engine(config, codec, default_registry(), default_message_projections())
    part = engine.partitions[0] = PartitionState(0, {})
    rng = random.Random(5)
    logs = {
        f"sess-{i:06d}": generate_session(random.Random(rng.random()), events)
        for i in range(sessions)
    }
    return config, codec, engine, part, logs


def baseline(sessions: int, events: int, batch: int) -> tuple[float, float]:
    """(wall, CPU) seconds of the same folds with no cache at all."""
    _, codec, engine, part, logs = _setup(sessions, events)
    sids, offset = list(logs), 0
    wall, cpu = time.perf_counter(), time.process_time()
    for start in range(0, sessions, batch):
        for sid in sids[start : start + batch]:
            for ev in logs[sid]:
                value = codec.encode_parsed_event(sid, ev)
                engine.fold(part, Record("events", 0, offset, sid.encode(), value, 0))
                offset += 1
        list(engine.output())
        engine.batch = Batch()
    return time.perf_counter() - wall, time.process_time() - cpu


def _cache(codec: Any, topic: str, records: list[tuple[bytes | None, bytes | None]]) -> QueryCache:
    """A cache whose fill reads ``records`` from an in-memory views partition 0."""
    from processor.testing.memory import MemoryBroker, MemoryConsumer

    broker = MemoryBroker()
    broker.create_topic(topic, 1)
    for key, value in records:
        broker.append(topic, 0, key, value, "committed")
    return QueryCache(
        codec,
        topic=topic,
        reader=lambda: MemoryConsumer(broker, "bench", eof=True),
        partition_count=lambda consumer: 1,
        registry=CollectorRegistry(),
    )


def run(sessions: int, events: int, batch: int, queries: int) -> dict[str, Any]:
    config, codec, engine, part, logs = _setup(sessions, events)
    views_topic = config.topics.views
    cache = _cache(codec, views_topic, [])
    cache.assigned([0])
    while cache.owns("x") is None:
        time.sleep(0.01)
    while True:
        try:
            cache.session_views("x")
            break
        except Exception:
            time.sleep(0.01)
    wall, cpu = time.perf_counter(), time.process_time()
    engine_s = cache_s = 0.0
    records = 0
    produced: list[tuple[bytes | None, bytes | None]] = []
    offset = 0
    sids = list(logs)
    for start in range(0, sessions, batch):
        group = sids[start : start + batch]
        t0 = time.perf_counter()
        for sid in group:
            for ev in logs[sid]:
                rec = Record(
                    "events", 0, offset, sid.encode(), codec.encode_parsed_event(sid, ev), 0
                )
                offset += 1
                engine.fold(part, rec)
        outs = list(engine.output())
        engine.batch = Batch()
        t1 = time.perf_counter()
        writes = [(0, o.key, o.value) for o in outs if o.topic == views_topic and o.key]
        cache.committed(writes)
        t2 = time.perf_counter()
        engine_s += t1 - t0
        cache_s += t2 - t1
        records += len(writes)
        produced.extend((k, v) for _, k, v in writes)
    t0 = time.perf_counter()
    cache.sync()  # the writer thread's backlog
    drain_s = time.perf_counter() - t0
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    held = cache.held_bytes._value.get()
    lat = []
    for sid in random.Random(1).sample(sids, min(queries, sessions)):
        t0 = time.perf_counter()
        views = cache.session_views(sid)
        lat.append(time.perf_counter() - t0)
        assert views is not None and "status" in views
    # a fill of the same records into a fresh cache (what an assignment costs)
    fill = _cache(codec, views_topic, produced)
    t0 = time.perf_counter()
    fill.assigned([0])
    while True:
        try:
            fill.session_views(sids[0])
            break
        except Exception:
            time.sleep(0.005)
    fill_s = time.perf_counter() - t0
    fill.close()
    cache.close()
    lat.sort()
    base_wall, base_cpu = baseline(sessions, events, batch)
    return {
        "baseline_wall_s": round(base_wall, 3),
        "baseline_cpu_s": round(base_cpu, 3),
        "with_cache_wall_s": round(wall, 3),
        "with_cache_cpu_s": round(cpu, 3),
        "cpu_overhead_pct": round(100 * (cpu - base_cpu) / base_cpu, 1),
        "sessions": sessions,
        "events_per_session": events,
        "sessions_per_batch": batch,
        "view_records": records,
        "engine_fold_output_s": round(engine_s, 3),
        "cache_committed_s": round(cache_s, 3),
        "loop_overhead_pct": round(100 * cache_s / engine_s, 2),
        "committed_us_per_record": round(1e6 * cache_s / records, 2),
        "writer_backlog_after_last_commit_s": round(drain_s, 3),
        "fill_records_per_s": round(len(produced) / fill_s),
        "query_ms_median": round(1e3 * statistics.median(lat), 3),
        "query_ms_p99": round(1e3 * lat[int(0.99 * (len(lat) - 1))], 3),
        "cache_live_bytes": int(held),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=5_000)
    ap.add_argument("--events", type=int, default=12)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--queries", type=int, default=500)
    args = ap.parse_args()
    print(json.dumps(run(args.sessions, args.events, args.batch, args.queries), indent=2))


if __name__ == "__main__":
    main()
