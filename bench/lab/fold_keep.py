"""What keeping the parsed events costs the fold (the envelope drops them).

``bench.fold_speed`` divides the fold's rate by the envelope's, and the fold's
read keeps every event (a session is its log) while the envelope drops each
one after its parse.  This bench splits that difference on one generated log,
best CPU of ``--runs`` per part:

- ``envelope``: orjson + ``parse_event`` per line, the event dropped;
- ``keep``: the same, the events appended to a list; ``keep_free`` is the
  CPU of dropping that list afterwards (every event freed at once, cold);
- ``fold_only``: ``fold_events`` + ``session_output`` of already parsed events;
- ``fold``: what ``bench.fold_speed`` times (read + fold + output + the free).

Per part also the minor page faults per event (``getrusage``) and the cyclic
collector's runs and CPU (``gc.callbacks``), with the thresholds ``processor``
sets.  Cache misses need cachegrind (history/core-fold.md).

    python -m bench.lab.fold_keep --events 30000 --runs 5
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import resource
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from processor.core.events import Event, parse_event
from processor.files import iter_lines, read_bytes, read_session_file, write_session_file
from processor.offline import fold_events, session_output
from processor.workload import generate_session


class _Meter:
    """CPU, minor faults and collector work of one timed call."""

    def __init__(self) -> None:
        self.gc_runs = 0
        self.gc_cpu = 0.0
        self._gc_start = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self.gc_runs += 1
            self._gc_start = time.process_time()
        else:
            self.gc_cpu += time.process_time() - self._gc_start

    def measure(self, fn: Callable[[], object]) -> tuple[float, int, int, float]:
        """(CPU seconds, minor faults, collections, collector CPU seconds)."""
        self.gc_runs, self.gc_cpu = 0, 0.0
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        c0 = time.process_time()
        fn()
        cpu = time.process_time() - c0
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        return cpu, faults, self.gc_runs, self.gc_cpu


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=30_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    gc.set_threshold(50_000, 20, 100)  # as the `processor` command does
    n = args.events
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "session.jsonl"
        write_session_file(path, None, generate_session(random.Random(args.seed), n))
        parsed = read_session_file(path)
        kept: list[Event] = []

        def envelope() -> None:
            for _, line, _ in iter_lines(read_bytes(path)):
                parse_event(orjson.loads(line), trusted_json=True)

        def keep() -> None:
            for _, line, _ in iter_lines(read_bytes(path)):
                kept.append(parse_event(orjson.loads(line), trusted_json=True))

        def keep_free() -> None:
            kept.clear()

        def fold_only() -> None:
            session_output(fold_events(parsed.events, parsed.header))

        def fold() -> None:
            file = read_session_file(path)
            session_output(fold_events(file.events, file.header))

        meter = _Meter()
        parts: dict[str, Callable[[], None]] = {
            "envelope": envelope,
            "keep": keep,
            "keep_free": keep_free,
            "fold_only": fold_only,
            "fold": fold,
        }
        best: dict[str, tuple[float, int, int, float]] = {}
        for _ in range(args.runs):  # interleaved: drift hits every part alike
            for name, fn in parts.items():
                got = meter.measure(fn)
                if name not in best or got[0] < best[name][0]:
                    best[name] = got
    result: dict[str, Any] = {
        "benchmark": "fold_keep",
        "events": n,
        "runs": args.runs,
        "best_cpu_us_per_event": {k: round(v[0] * 1e6 / n, 3) for k, v in best.items()},
        "minor_faults_per_event": {k: round(v[1] / n, 3) for k, v in best.items()},
        "gc_runs": {k: v[2] for k, v in best.items()},
        "gc_cpu_us_per_event": {k: round(v[3] * 1e6 / n, 3) for k, v in best.items()},
        "ratio_fold_to_envelope_cpu_best": round(best["envelope"][0] / best["fold"][0], 3),
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
