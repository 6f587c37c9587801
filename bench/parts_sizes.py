"""Bytes the engine writes per event, by topic, broker-less (issue 12 quick check).

20 sessions of ``length`` events are folded in one batch (warm-up, not
counted); then ``--batches`` batches each fold the next event of every
session, and the key + value bytes those batches produce are summed by
topic and divided by the events' own record bytes.  No broker, so no Kafka
record overhead (~70-100 B per record): the record counts are printed so it
can be added.  Runs against any checkout whose tests/engine/kit.py has the
Harness (so the same command measures the format before and after):

    PYTHONPATH=<checkout> python3 bench/parts_sizes.py --length 100 --length 2000
    PYTHONPATH=<checkout> python3 bench/parts_sizes.py --big-ratio 0.2
"""

from __future__ import annotations

import argparse
import random
from collections import Counter

from processor.workload import generate_session
from tests.engine.kit import CODEC, CONFIG, Harness


def measure(length: int, sessions: int, batches: int, big_ratio: float) -> dict[str, float]:
    logs = {
        f"session-{i:02d}": generate_session(
            random.Random(i), length + batches, big_ratio=big_ratio
        )
        for i in range(sessions)
    }
    h = Harness()
    for sid, log in logs.items():
        h.fold_events(sid, log[:length])
    h.commit()
    event_bytes = 0
    size: Counter[str] = Counter()
    records: Counter[str] = Counter()
    for b in range(batches):
        for sid, log in logs.items():
            event = log[length + b]
            event_bytes += len(sid) + len(CODEC.encode_parsed_event(sid, event))
            h.fold_events(sid, [event])
        for o in h.commit():
            topic = o.topic.rsplit(".", 1)[-1]
            size[topic] += len(o.key or b"") + len(o.value or b"")
            records[topic] += 1
    n = sessions * batches
    return {
        "event B": event_bytes / n,
        "views B/event": size["views"] / n,
        "checkpoints B/event": size["checkpoints"] / n,
        "views records/event": records["views"] / n,
        "checkpoints records/event": records["checkpoints"] / n,
        "ratio (views+checkpoints)/events": (size["views"] + size["checkpoints"]) / event_bytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, action="append", help="events before measuring")
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--big-ratio", type=float, default=0.02, help="share of 10 KB tool results")
    args = parser.parse_args()
    for length in args.length or [100, 2000]:
        result = measure(length, args.sessions, args.batches, args.big_ratio)
        print(f"length {length}: " + ", ".join(f"{k} {v:,.2f}" for k, v in result.items()))
    assert CONFIG.topics.views


if __name__ == "__main__":
    main()
