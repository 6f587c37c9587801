"""Issue 13: time to the first folded event of a partition whose neighbour is filling.

A fresh host (empty state directory) is assigned two partitions: partition 1
of the checkpoints topic holds ``--backlog`` records (tombstones of sessions
that never were: read, applied, changing nothing), partition 0 a few; the
events are all on partition 0.  Timed from the Processor's construction:
the first folded event (``processor_events_total`` > 0, polled every 5 ms)
and caught up (``run(until_offsets=...)`` returning).  Before the background
fill, partition 0 folded nothing until partition 1's fill ended; after, it
waits only for its own.

    PYTHONPATH=$PWD python3 -m bench.lab.neighbour_fill --backlog 300000
(a local broker is started unless KAFKA_BOOTSTRAP_SERVERS is set)
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time

from bench.common import broker_bootstrap, unique, wait_topics_ready
from bench.workload import produce, session_logs
from processor.config import ServiceConfig
from processor.engine.commands import partition_of
from processor.kafka import clients
from processor.kafka.topic_admin import create_topics
from processor.service.loop.runner import Processor
from processor.telemetry.metrics import Metrics

SESSIONS = 20
EVENTS = 12


def run(bootstrap: str, backlog: int) -> tuple[float, float]:
    config = ServiceConfig(
        bootstrap_servers=bootstrap, topic_prefix=unique("nf"), partitions=2
    ).with_overrides(group_id=unique("nf-group"), commit_interval_ms=100)
    create_topics(clients.admin(config), config)
    t = config.topics
    wait_topics_ready(config, [t.events, t.views, t.checkpoints, t.dlq])
    producer = clients.event_producer(config, "bench-backlog")
    for i in range(backlog):
        while True:
            try:
                producer.produce(t.checkpoints, key=f"gone-{i}".encode(), value=None, partition=1)
                break
            except BufferError:  # the client's queue is full: let it drain
                producer.poll(0.1)
    assert producer.flush(60) == 0
    logs = [
        (sid, evs)
        for sid, evs in session_logs(SESSIONS * 4, EVENTS, seed=3)
        if partition_of(sid.encode(), 2) == 0
    ][:SESSIONS]
    produce(config, ((sid, e) for sid, evs in logs for e in evs))
    highs = {0: len(logs) * EVENTS, 1: 0}
    metrics = Metrics()
    with tempfile.TemporaryDirectory() as state:
        t0 = time.perf_counter()
        proc = Processor(config.with_overrides(state_dir=state), metrics=metrics)
        first: list[float] = []
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                folded = sum(
                    s.value
                    for m in metrics.registry.collect()
                    if m.name == "processor_events"
                    for s in m.samples
                    if s.name == "processor_events_total"
                )
                if folded > 0:
                    first.append(time.perf_counter() - t0)
                    return
                time.sleep(0.005)

        w = threading.Thread(target=watch, daemon=True)
        w.start()
        proc.run(until_offsets=highs, max_idle_s=60, max_wait_s=60)
        total = time.perf_counter() - t0
        done.set()
        w.join()
    return (first[0] if first else float("nan")), total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backlog", type=int, default=300_000, help="checkpoint records on p1")
    args = ap.parse_args()
    with broker_bootstrap() as (bootstrap, _):
        first, total = run(bootstrap, args.backlog)
    print(
        f"backlog {args.backlog} records on checkpoints[1]: first folded event of "
        f"partition 0 after {first:.2f} s, caught up after {total:.2f} s"
    )


if __name__ == "__main__":
    main()
