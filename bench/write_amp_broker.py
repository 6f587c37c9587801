"""Cross-check of :mod:`bench.write_amp` on a real broker: the same count, measured.

A ``Processor`` (exactly-once, the default 200 ms commit interval) folds a
smaller workload of the same shape, produced one event per session per
tick, each tick waiting until the processor committed it (so every
transaction holds at most one event per session, as at 1 event/s).  Then
the checkpoints and views topics are read back (``read_committed``, from
offset zero; their segments are made to roll only after an hour so the
cleaner compacts nothing meanwhile) and their records' key + value bytes
summed, next to the broker-less simulation of the same logs.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from bench.common import unique, wait_topics_ready
from bench.write_amp import TopicBytes, compressor, session_logs, simulate
from processor.client.views_reader import read_committed_records
from processor.codec import default_codec
from processor.config import ServiceConfig
from processor.kafka import clients
from processor.kafka.client_errors import LIBRDKAFKA_LOGGER
from processor.kafka.topic_admin import create_topics
from processor.service.loop.runner import Processor

PARTITIONS = 3
TICK_TIMEOUT_S = 60.0


def _committed(consumer: Consumer, topic: str) -> int:
    tps = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
    return sum(max(tp.offset, 0) for tp in tps)


def cross_check(
    bootstrap: str, sessions: int, events: int, result_bytes: int, context: int
) -> dict[str, Any]:
    prefix = unique("bench-amp")
    config = ServiceConfig(bootstrap_servers=bootstrap).with_overrides(
        topic_prefix=prefix,
        group_id=f"{prefix}-group",
        instance_id=f"{prefix}-0",
        partitions=PARTITIONS,
    )
    t = config.topics
    create_topics(clients.admin(config), config, compaction_overrides={"segment.ms": "3600000"})
    wait_topics_ready(config, [t.events, t.views, t.checkpoints, t.control, t.dlq])
    logs = session_logs(sessions, events, result_bytes, context)
    codec = default_codec()
    proc = Processor(config)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            proc.run()
        except BaseException as exc:  # raised below
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    producer = clients.event_producer(config)
    offsets = Consumer(
        {**config.common(), "logger": LIBRDKAFKA_LOGGER, "group.id": config.group_id}
    )
    event_bytes = produced = 0
    started = time.perf_counter()
    try:
        for i in range(events):
            for sid, log in logs.items():
                value = codec.encode_parsed_event(sid, log[i])
                producer.produce(t.events, key=sid.encode(), value=value)
                event_bytes += len(sid.encode()) + len(value)
                produced += 1
            if producer.flush(30) != 0:
                raise RuntimeError("events not delivered in 30 s")
            deadline = time.monotonic() + TICK_TIMEOUT_S
            while _committed(offsets, t.events) < produced:
                if errors:
                    raise RuntimeError(f"the processor died: {errors[0]!r}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"tick {i}: not committed in {TICK_TIMEOUT_S} s")
                time.sleep(0.02)
    finally:
        offsets.close()
        proc.stop()
        thread.join(60)
    seconds = time.perf_counter() - started
    measured: dict[str, dict[str, int]] = {"events": {"records": produced, "raw": event_bytes}}
    for name, topic in (("checkpoints", t.checkpoints), ("views", t.views)):
        msgs = read_committed_records(config, topic, purpose="bench-amp")
        measured[name] = {
            "records": len(msgs),
            "raw": sum(len(m.key() or b"") + len(m.value() or b"") for m in msgs),
        }
    _, compress = compressor()
    [point] = simulate(logs, [events], compress=compress)
    simulated = {k: {"records": v.records, "raw": v.raw} for k, v in point.topics.items()}

    def amp(doc: dict[str, dict[str, int]]) -> float:
        out = doc.get("checkpoints", {}).get("raw", 0) + doc.get("views", {}).get("raw", 0)
        return round(out / max(doc["events"]["raw"], 1), 3)

    return {
        "sessions": sessions,
        "events": events,
        "seconds": round(seconds, 1),
        "broker": measured,
        "simulated": simulated,
        "amp_broker": amp(measured),
        "amp_simulated": amp(simulated),
    }


def describe(doc: dict[str, Any]) -> list[list[str]]:
    rows = []
    for name in ("events", "checkpoints", "views"):
        b = doc["broker"].get(name, {})
        s = doc["simulated"].get(name, vars(TopicBytes()))
        rows.append(
            [
                f"broker cross-check: {name}",
                f"{b.get('records', 0):,} records, {b.get('raw', 0):,} B on the broker; "
                f"{s['records']:,} records, {s['raw']:,} B simulated",
            ]
        )
    rows.append(
        [
            f"broker cross-check: ratio at {doc['events']} events "
            f"({doc['sessions']} sessions, {doc['seconds']} s)",
            f"{doc['amp_broker']} on the broker, {doc['amp_simulated']} simulated",
        ]
    )
    return rows
