"""Three of librdkafka's waits that a takeover met (issue 37, history 11).

``python3 -m bench.lab.librdkafka_waits [ROUNDS]`` (default 6), on a fresh
3-node local cluster with a 3-partition topic (replication 3) that a
transactional writer keeps filling; each line is ROUNDS measurements in ms:

- ``resume``: a consumer fetching two partitions gets the third assigned
  paused, resumes it 1.5 s later: time to its first record after
  ``resume()`` alone, and after ``resume()`` then ``seek()`` to the position.
- ``admin``: a ListOffsets (read_committed) by a new admin client per call,
  by one kept client, and by a new client that asks ``list_topics(topic)``
  first.
- ``fill``: a new consumer reading 1000 records of one partition to its end:
  time to the first record, assigned at ``OFFSET_BEGINNING`` and at offset 0.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    IsolationLevel,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec  # type: ignore[attr-defined]

from processor.config import ServiceConfig
from processor.devcluster import LocalCluster
from processor.kafka import clients


def _first(consumer: Consumer, partition: int, t0: float) -> float:
    while time.monotonic() - t0 < 10:
        m = consumer.poll(0.005)
        if m is not None and m.error() is None and m.partition() == partition:
            return time.monotonic() - t0
    return float("nan")


def resume(bs: str, topic: str, target: int, seek: bool) -> float:
    c = Consumer(
        {
            "bootstrap.servers": bs,
            "group.id": f"lab-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "latest",
        }
    )
    try:
        c.assign([TopicPartition(topic, p) for p in range(3) if p != target])
        tp = TopicPartition(topic, target, 0)
        c.incremental_assign([tp])
        c.pause([tp])
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            c.poll(0.01)
        _, high = c.get_watermark_offsets(tp, cached=False)
        t0 = time.monotonic()
        c.resume([tp])
        if seek:
            c.seek(TopicPartition(topic, target, max(high - 50, 0)))
        return _first(c, target, t0)
    finally:
        c.close()


def admin_offsets(bs: str, topic: str, i: int, kept: list[Any], meta: bool = False) -> float:
    partition = i % 3
    t0 = time.monotonic()
    if not kept:
        admin = AdminClient({**clients.FAST_FIRST_REQUEST, "bootstrap.servers": bs})
        if meta:
            admin.list_topics(topic, timeout=5)
    else:
        admin = kept[0]
    spec = {TopicPartition(topic, partition): OffsetSpec.latest()}  # type: ignore[no-untyped-call]
    futures = admin.list_offsets(spec, isolation_level=IsolationLevel.READ_COMMITTED)
    for f in futures.values():
        f.result()
    return time.monotonic() - t0


def fill(bs: str, topic: str, absolute: bool) -> float:
    conf = clients.plain_settings(ServiceConfig(bootstrap_servers=bs), "fill", group="lab")
    t0 = time.monotonic()
    c = Consumer(conf)
    try:
        c.incremental_assign([TopicPartition(topic, 1, 0 if absolute else OFFSET_BEGINNING)])
        return _first(c, 1, t0)
    finally:
        c.close()


def _line(label: str, rounds: int, measure: Callable[[int], float]) -> None:
    got = [measure(i) for i in range(rounds)]
    print(f"{label:<32} " + " ".join(f"{x * 1000:.0f}" for x in got), flush=True)


def main(argv: list[str]) -> int:
    rounds = int(argv[0]) if argv else 6
    cluster = LocalCluster(3)
    cluster.start(Path(tempfile.mkdtemp(prefix="lab-waits-")))
    stop = threading.Event()
    try:
        bs = cluster.bootstrap
        topic = f"lab-waits-{uuid.uuid4().hex[:6]}"
        admin = AdminClient({"bootstrap.servers": bs})
        admin.create_topics([NewTopic(topic, 3, 3)])[topic].result()
        time.sleep(2)

        def write() -> None:
            p = Producer({"bootstrap.servers": bs, "transactional.id": f"lab-{topic}"})
            p.init_transactions()
            while not stop.is_set():
                p.begin_transaction()
                for i in range(30):
                    p.produce(topic, b"x" * 200, key=f"k{i % 8}".encode(), partition=i % 3)
                time.sleep(0.03)
                p.commit_transaction()

        threading.Thread(target=write, daemon=True).start()
        time.sleep(3)  # more than 1000 records on each partition
        kept: list[Any] = [AdminClient({**clients.FAST_FIRST_REQUEST, "bootstrap.servers": bs})]
        _line("resume", rounds, lambda i: resume(bs, topic, i % 3, False))
        _line("resume + seek", rounds, lambda i: resume(bs, topic, i % 3, True))
        _line("admin ListOffsets, new client", rounds, lambda i: admin_offsets(bs, topic, i, []))
        _line("admin ListOffsets, kept client", rounds, lambda i: admin_offsets(bs, topic, i, kept))
        _line(
            "admin ListOffsets, new, metadata 1st",
            rounds,
            lambda i: admin_offsets(bs, topic, i, [], meta=True),
        )
        _line("fill at OFFSET_BEGINNING", rounds, lambda i: fill(bs, topic, False))
        _line("fill at offset 0", rounds, lambda i: fill(bs, topic, True))
    finally:
        stop.set()
        time.sleep(0.5)
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
