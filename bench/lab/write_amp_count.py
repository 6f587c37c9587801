"""Records and bytes the throughput workload writes, broker-less (issue 12).

The figure-1 workload (1,000 sessions x 60 events, sessions interleaved,
half scripted agent runs, half generated with ~10 KB tool results) folded
by the engine harness in transactions of ``--batch`` events (figure 1's
runs hold ~20,000 events per transaction, ~20 events of each session),
counting the records and key + value bytes per output topic.  No broker:
the per-record produce and broker cost it stands for is what figure 1 pays.
Runs against any checkout whose tests/engine/kit.py has the Harness, so the
same command counts the format before and after:

    PYTHONPATH=<checkout> python3 <this checkout>/bench/lab/write_amp_count.py
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter

from bench.workload import interleave, session_logs
from tests.engine.kit import CODEC, CONFIG, Harness


def count(sessions: int, length: int, batch: int) -> dict[str, object]:
    logs = list(session_logs(sessions, length))
    h = Harness()
    records: Counter[str] = Counter()
    size: Counter[str] = Counter()
    events = event_bytes = transactions = 0
    started, cpu = time.perf_counter(), time.process_time()
    for sid, event in interleave(logs):
        rec = h.event(sid, event)
        event_bytes += len(rec.value or b"")
        h.fold(rec)
        events += 1
        if events % batch == 0:
            transactions += 1
            for o in h.commit():
                records[o.topic] += 1
                size[o.topic] += len(o.key or b"") + len(o.value or b"")
            h.produced.clear()
    transactions += 1
    for o in h.commit():
        records[o.topic] += 1
        size[o.topic] += len(o.key or b"") + len(o.value or b"")
    topics = {"views": CONFIG.topics.views, "checkpoints": CONFIG.topics.checkpoints}
    return {
        "events": events,
        "event_bytes": event_bytes,
        "transactions": transactions,
        "records": {k: records[t] for k, t in topics.items()},
        "bytes": {k: size[t] for k, t in topics.items()},
        "total_records": sum(records[t] for t in topics.values()),
        "total_bytes": sum(size[t] for t in topics.values()),
        "fold_and_output_s": round(time.perf_counter() - started, 2),
        "fold_and_output_cpu_s": round(time.process_time() - cpu, 2),
        "codec": type(CODEC).__name__,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--length", type=int, default=60)
    ap.add_argument("--batch", type=int, default=20_000)
    args = ap.parse_args()
    print(json.dumps(count(args.sessions, args.length, args.batch)))


if __name__ == "__main__":
    main()
