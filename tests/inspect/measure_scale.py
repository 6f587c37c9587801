"""Measure the inspector at N sessions (not collected by pytest).

    KAFKA_BOOTSTRAP_SERVERS=host:port PYTHONPATH=. python3 tests/inspect/measure_scale.py 100000

One scripted agent session is folded by a real processor; its views are then
copied under N session ids into a fresh views topic (exactly the records a
processor writes), and the inspector's state loads them: load time, peak
memory, list-page latency, one session's decode.
"""

from __future__ import annotations

import os
import resource
import sys
import time

from processor.client.session_writer import SessionWriter
from processor.client.views_reader import materialize_views
from processor.codec import default_codec
from processor.config import ServiceConfig
from processor.examples.make_example import scripted_sessions
from processor.inspect.state import InspectorState
from processor.kafka import clients
from processor.kafka.topic_admin import create_topics
from processor.service.loop.runner import Processor


def main(n: int) -> None:
    boot = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    stamp = int(time.time())
    src = ServiceConfig(
        bootstrap_servers=boot,
        topic_prefix=f"measure{stamp}a",
        group_id=f"measure{stamp}a",
        partitions=1,
        commit_interval_ms=100,
    )
    create_topics(clients.admin(src), src)
    sid, events = next(iter(scripted_sessions(1)))
    with SessionWriter(src) as writer:
        for ev in events:
            writer.append_event(sid, ev)
    Processor(src).run(max_idle_s=3)
    views = materialize_views(src)[sid]
    cfg = ServiceConfig(
        bootstrap_servers=boot,
        topic_prefix=f"measure{stamp}b",
        group_id=f"measure{stamp}b",
        partitions=6,
    )
    create_topics(clients.admin(cfg), cfg)
    codec = default_codec()
    producer = clients.event_producer(cfg)
    t0, records, size = time.time(), 0, 0
    for i in range(n):
        for name, rec in views.items():
            for key, value in codec.encode_view_records(
                f"sess-{i:06d}", name, rec.as_of_seq, rec.state_version, rec.value
            ):
                while True:
                    try:
                        producer.produce(cfg.topics.views, key=key, value=value, partition=i % 6)
                        break
                    except BufferError:
                        producer.poll(0.1)
                records += 1
                size += len(value)
    producer.flush(300)
    print(f"produced {records} view records, {size / 1e6:.1f} MB, in {time.time() - t0:.1f} s")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    state = InspectorState(cfg).start()
    t0 = time.time()
    assert state.wait_loaded(1200), state.error
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        f"loaded {state.counts()} in {time.time() - t0:.1f} s; peak RSS "
        f"{before / 1024:.0f} -> {after / 1024:.0f} MiB"
    )
    for kw in ({}, {"sort": "id"}, {"query": "sess-0999"}, {"sort": "bytes", "offset": n // 2}):
        t0 = time.perf_counter()
        for _ in range(5):
            page = state.page(**kw)
        print(f"page {kw}: {(time.perf_counter() - t0) / 5 * 1000:.0f} ms ({page.total} match)")
    t0 = time.perf_counter()
    found = state.session("sess-000001")
    assert found is not None
    print(f"one session's views decoded in {(time.perf_counter() - t0) * 1000:.1f} ms")
    state.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
