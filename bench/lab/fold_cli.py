"""``processor fold`` of a big generated log against a bare orjson parse of its lines.

The user-facing offline figure of issue 15: the wall time of the real command
(``python -m processor fold PATH --compact``, a fresh interpreter, output
discarded) against parsing the same file's lines with ``orjson.loads`` in this
process.  Both are timed back to back in every run, so the ratio is immune to
the machine's drift; the figure is the median of the per-run ratios.  The
same ratio of CPU times (the child's user+sys, this process's parse) is
reported too: on a shared, loaded machine it moves much less than wall time.

    python -m bench.lab.fold_cli --events 150000 --runs 3
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from bench.common import REPO, python_env
from processor.files import iter_lines, read_bytes, write_session_file
from processor.workload import generate_session


def _parse_lines(path: Path) -> tuple[int, float, float]:
    """(lines, wall seconds, CPU seconds) of parsing every line."""
    t0, c0 = time.perf_counter(), time.process_time()
    n = 0
    for _, line, _ in iter_lines(read_bytes(path)):
        orjson.loads(line)
        n += 1
    return n, time.perf_counter() - t0, time.process_time() - c0


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _fold_cli(path: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of the command."""
    t0, c0 = time.perf_counter(), _children_cpu()
    subprocess.run(
        [sys.executable, "-m", "processor", "fold", str(path), "--compact"],
        cwd=REPO,
        env=python_env(),
        stdout=subprocess.DEVNULL,
        check=True,
    )
    return time.perf_counter() - t0, _children_cpu() - c0


def main(argv: list[str] | None = None) -> dict[str, object]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=150_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, default=Path("bench/results/tmp/fold_cli.json"))
    args = ap.parse_args(argv)
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    fold_rates: list[float] = []
    parse_rates: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "session.jsonl"
        write_session_file(path, None, generate_session(random.Random(args.seed), args.events))
        size = path.stat().st_size
        for _ in range(args.runs):
            n, parse_s, parse_cpu = _parse_lines(path)
            fold_s, fold_cpu = _fold_cli(path)
            ratios.append(parse_s / fold_s)
            cpu_ratios.append(parse_cpu / fold_cpu)
            fold_rates.append(n / fold_s)
            parse_rates.append(n / parse_s)
    result: dict[str, object] = {
        "benchmark": "fold_cli",
        "events": args.events,
        "file_bytes": size,
        "runs": args.runs,
        "fold_cli_events_per_s": [round(r) for r in fold_rates],
        "orjson_lines_events_per_s": [round(r) for r in parse_rates],
        "ratios": [round(r, 4) for r in ratios],
        "ratio_fold_cli_to_parse": round(statistics.median(ratios), 4),
        "cpu_ratios": [round(r, 4) for r in cpu_ratios],
        "ratio_fold_cli_to_parse_cpu": round(statistics.median(cpu_ratios), 4),
        "command": f"python -m bench.lab.fold_cli --events {args.events} --runs {args.runs}",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
