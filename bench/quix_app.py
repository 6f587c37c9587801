"""The Quix Streams peer app (figure 2); runs with ``bench/.venv-quix/bin/python``.

What it does, per record of the events topic (key = session id):

1. decode the Avro value with the processor's codec (``decode_event``) and
   validate it into a core event (``to_event``) — as the Processor does;
2. get the session's core :class:`~processor.core.session.Session`: from an
   in-process cache, else from the Quix state store (``state.get("checkpoint")``
   → ``Session.from_checkpoint``), else a new one — the same registries
   (``default_registry``, ``default_message_projections``) as the Processor;
3. the seq gate's happy path (only ``seq == last + 1`` is folded),
   ``Session.append(event)`` and ``log.trim_before`` — the same core calls the
   Processor makes per event;
4. ``state.set("checkpoint", session.checkpoint())``: the session checkpoint
   JSON (surface, transcript, projection rows) into Quix's RocksDB state store,
   which Quix backs with its changelog topic (orjson serialisation).

``processing_guarantee="exactly-once"``: Quix commits the changelog records
and the consumer offsets in one Kafka transaction per checkpoint
(``commit_interval``).  It publishes no views: the Processor also produces
the changed views of every session per batch, so Quix does strictly less
output work here.  The app stops after ``count`` outputs (one per record)
and prints one JSON line with its timings.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from typing import Any


def main(argv: list[str] | None = None) -> None:
    t_start = time.perf_counter()
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--commit-interval", type=float, default=0.2)
    ap.add_argument("--timeout", type=float, default=120.0)
    args = ap.parse_args(argv)

    from quixstreams import Application, State

    from processor.codec import default_codec
    from processor.core.builtin import default_registry
    from processor.core.defaults import default_message_projections
    from processor.core.session import Session, synthetic_header

    logging.basicConfig(level=logging.WARNING)
    codec = default_codec()
    registry = default_registry()
    message_projections = default_message_projections()
    sessions: dict[str, Session] = {}
    stats: dict[str, Any] = {"first": None, "folded": 0, "skipped": 0}

    def fold(value: bytes, key: str, timestamp: int, headers: Any, state: State) -> int:
        if stats["first"] is None:
            stats["first"] = time.perf_counter()
        event = codec.decode_event(value).to_event()
        session = sessions.get(key)
        if session is None:
            cp = state.get("checkpoint")
            session = (
                Session.from_checkpoint(
                    cp, None, message_projections=message_projections, projections=registry
                )
                if cp is not None
                else Session(
                    synthetic_header(key),
                    message_projections=message_projections,
                    projections=registry,
                )
            )
            sessions[key] = session
        if event.seq != session.last_seq + 1:
            stats["skipped"] += 1
            return session.last_seq
        session.append(event)
        session.log.trim_before(event.seq + 1)
        state.set("checkpoint", session.checkpoint())
        stats["folded"] += 1
        return event.seq

    with tempfile.TemporaryDirectory(prefix="bench-quix-state-") as state_dir:
        app = Application(
            broker_address=args.bootstrap,
            consumer_group=args.group,
            auto_offset_reset="earliest",
            processing_guarantee="exactly-once",
            commit_interval=args.commit_interval,
            state_dir=state_dir,
            loglevel="WARNING",
        )
        topic = app.topic(args.topic, key_deserializer="str", value_deserializer="bytes")
        sdf = app.dataframe(topic)
        sdf = sdf.apply(fold, stateful=True, metadata=True)
        t_ready = time.perf_counter()
        app.run(count=args.count, timeout=args.timeout, collect=False)
        t_end = time.perf_counter()
    first = stats["first"] or t_ready
    out = {
        "events": stats["folded"] + stats["skipped"],
        "folded": stats["folded"],
        "skipped": stats["skipped"],
        "first_to_end": t_end - first,
        "start_to_end": t_end - t_start,
        "import_s": t_ready - t_start,
    }
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
