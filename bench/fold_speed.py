"""Core fold speed: events/second folding a generated log offline (one process).

Baselines measured in the same run, on the same file:
- ``json``: orjson.loads of every line (merely parsing the JSONL);
- ``envelope``: parsing + envelope validation + freezing (``parse_event``).
The fold is everything ``processor fold`` does: read, validate, plan, commit,
drive the built-in domain projections, then derive messages, transcript and
a projection snapshot once at the end.

    python -m bench.fold_speed --events 100000 --runs 5
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from processor.core.events import parse_event
from processor.files import iter_lines, read_bytes, read_session_file, write_session_file
from processor.offline import fold_events, session_output
from processor.workload import generate_session


def _json_only(path: Path) -> int:
    n = 0
    for _, line, _ in iter_lines(read_bytes(path)):
        orjson.loads(line)
        n += 1
    return n


def _envelope(path: Path) -> int:
    n = 0
    for _, line, _ in iter_lines(read_bytes(path)):
        parse_event(orjson.loads(line), trusted_json=True)
        n += 1
    return n


def _fold(path: Path) -> int:
    file = read_session_file(path)
    session = fold_events(file.events, file.header)
    session_output(session)
    return len(file.events)


def _time(fn: Callable[[Path], int], path: Path) -> tuple[float, float]:
    """(events per wall second, events per CPU second)."""
    t0, c0 = time.perf_counter(), time.process_time()
    n = fn(path)
    return n / (time.perf_counter() - t0), n / (time.process_time() - c0)


def main(argv: list[str] | None = None) -> dict[str, object]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, default=Path("bench/results/tmp/fold_speed.json"))
    ap.add_argument(
        "--gc",
        choices=("service", "off"),
        default="service",
        help="service: the thresholds processor sets (50_000, 20, 100); off: as "
        "`processor fold` runs (gc.disable(): a one-shot process with an acyclic heap)",
    )
    args = ap.parse_args(argv)
    gc.set_threshold(50_000, 20, 100)  # as the `processor` command does
    if args.gc == "off":
        gc.disable()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "session.jsonl"
        events = generate_session(random.Random(args.seed), args.events)
        write_session_file(path, None, events)
        size = path.stat().st_size
        rates: dict[str, list[float]] = {"json": [], "envelope": [], "fold": []}
        cpu: dict[str, list[float]] = {"json": [], "envelope": [], "fold": []}
        for _ in range(args.runs):  # interleaved, so drift hits all three alike
            for name, fn in (("json", _json_only), ("envelope", _envelope), ("fold", _fold)):
                wall_rate, cpu_rate = _time(fn, path)
                rates[name].append(wall_rate)
                cpu[name].append(cpu_rate)
    med = {k: statistics.median(v) for k, v in rates.items()}
    cpu_med = {k: statistics.median(v) for k, v in cpu.items()}
    rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    result: dict[str, object] = {
        "benchmark": "fold_speed",
        "revision": rev,
        "events": args.events,
        "file_bytes": size,
        "runs": args.runs,
        "events_per_s": {
            k: {"median": round(med[k]), "min": round(min(v)), "max": round(max(v))}
            for k, v in rates.items()
        },
        "ratio_fold_to_json": round(med["fold"] / med["json"], 3),
        "ratio_fold_to_envelope": round(med["fold"] / med["envelope"], 3),
        # the same ratios of CPU time: steadier on a shared, loaded machine
        "ratio_fold_to_envelope_cpu": round(cpu_med["fold"] / cpu_med["envelope"], 3),
        "ratio_fold_to_json_cpu": round(cpu_med["fold"] / cpu_med["json"], 3),
        # best (fastest) CPU run of each side: what the code costs when the
        # shared box's other load is least in the way; steadiest of the three
        "ratio_fold_to_envelope_cpu_best": round(max(cpu["fold"]) / max(cpu["envelope"]), 3),
        "cpu_us_per_event_best": {k: round(1e6 / max(v), 2) for k, v in cpu.items()},
        "cpu_us_per_event_median": {k: round(1e6 / cpu_med[k], 2) for k in cpu_med},
        "python": sys.version.split()[0],
        "gc": args.gc,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
