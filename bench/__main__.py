"""The benchmark suite: ``python -m bench [--only a,b] [--runs N] [--scale 1k|10k|100k]``.

It measures the build that ships, the compiled wheel, unless ``--build pure``
(the checkout's source): see :mod:`bench.build`; every result records which
build ran (``"build"``).

Starts a local Kafka broker (``processor.devbroker``) unless
``KAFKA_BOOTSTRAP_SERVERS`` is set, generates the workload once and produces
it once into a fresh events topic (12 partitions), then runs each selected
figure (each in its own module, see ``FIGURES``), writes
``bench/results/<figure>.json`` and ``bench/results/summary.json`` and
renders them into ``bench/results/REPORT.md`` (``BENCHMARKS.md`` is curated
by hand from it).  A figure that fails is recorded with its
error; the others still run.  Not part of the test suite.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import sys
import time
import traceback
from typing import Any

from bench import build as builds
from bench import report
from bench.common import (
    RESULTS,
    Context,
    broker_bootstrap,
    git_revision,
    result,
    topics_dropped_after,
    unique,
    write_result,
)
from bench.workload import SCALES, build

#: figure -> (module, needs the shared workload)
FIGURES: dict[str, tuple[str, bool]] = {
    "fold_speed": ("bench.core_fold", False),
    "throughput": ("bench.throughput", True),
    "quix_peer": ("bench.quix_peer", True),
    "restore": ("bench.restore", False),
    "replay": ("bench.replay", True),
    "latency": ("bench.latency", False),
    "memory": ("bench.memory", False),
    "scaleout": ("bench.scaleout", True),
    "profile": ("bench.profile", True),
    "write_amp": ("bench.write_amp", False),
    "state_budget": ("bench.state_budget", False),
    "ship": ("bench.ship", False),
    "failover": ("bench.failover", False),
}


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(FIGURES)}")
    ap.add_argument("--runs", type=int, default=3, help="runs per figure (median, min, max)")
    ap.add_argument(
        "--scale",
        choices=sorted(SCALES),
        default="1k",
        help="workload size: "
        + ", ".join(f"{k} = {s:,} sessions x {e} events" for k, (s, e) in SCALES.items()),
    )
    ap.add_argument(
        "--no-report", action="store_true", help="do not render bench/results/REPORT.md"
    )
    ap.add_argument(
        "--build",
        choices=builds.BUILDS,
        default="compiled",
        help="the processor build to measure: the shipped compiled wheel (built once into "
        "bench/results/tmp/venv-compiled, the bench re-run there) or the checkout's pure source",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    selected = [f.strip() for f in args.only.split(",") if f.strip()] or list(FIGURES)
    unknown = [f for f in selected if f not in FIGURES]
    if unknown:
        sys.exit(f"unknown figure(s): {', '.join(unknown)}; choose from {', '.join(FIGURES)}")
    raw_argv = argv if argv is not None else sys.argv[1:]
    if args.build == "compiled" and os.environ.get(builds.ENV_FLAG) != "compiled":
        builds.rerun_compiled(raw_argv, _say)  # does not return
    if builds.running_build() != args.build:
        sys.exit(f"--build {args.build}, but this process imports {builds.describe()}")
    _say(f"build: {builds.describe()}")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    command = "python -m bench " + " ".join(raw_argv)
    started = time.perf_counter()
    broker = contextlib.ExitStack()  # a local broker unless KAFKA_BOOTSTRAP_SERVERS is set
    bootstrap, local = broker.enter_context(broker_bootstrap(_say))
    ctx = Context(
        bootstrap=bootstrap,
        runs=args.runs,
        scale=args.scale,
        command=command.strip(),
        revision=git_revision(),
    )
    durations: dict[str, float] = {}
    # every topic the suite creates goes when it ends: the workload after all
    # figures, each figure's own after that figure (common.topics_dropped_after)
    broker.enter_context(topics_dropped_after(ctx.config()))
    try:
        if any(FIGURES[f][1] for f in selected):
            sessions, length = SCALES[args.scale]
            t0 = time.perf_counter()
            ctx.workload = build(ctx.config(topic_prefix=unique("bench-wl")), sessions, length)
            durations["workload"] = time.perf_counter() - t0
            _say(f"workload: {ctx.workload.describe()} in {durations['workload']:.1f} s")
        for figure in selected:
            t0 = time.perf_counter()
            _say(f"{figure} ...")
            try:
                with topics_dropped_after(ctx.config()):
                    doc = importlib.import_module(FIGURES[figure][0]).run(ctx)
            except Exception as exc:  # record it, keep going
                traceback.print_exc()
                doc = result(ctx, figure, figure, error=f"{type(exc).__name__}: {exc}")
            durations[figure] = time.perf_counter() - t0
            doc["duration_s"] = round(durations[figure], 1)
            write_result(ctx, doc)
            _say(f"{figure}: {report.one_line(doc)} ({durations[figure]:.0f} s)")
    finally:
        broker.close()
    total = time.perf_counter() - started
    summary: dict[str, Any] = {
        "figure": "summary",
        "command": ctx.command,
        "revision": ctx.revision,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "runs": args.runs,
        "scale": args.scale,
        "selected": selected,
        "durations_s": {k: round(v, 1) for k, v in durations.items()},
        "total_s": round(total, 1),
        "broker": "local (processor.devbroker)" if local else "KAFKA_BOOTSTRAP_SERVERS",
        "build": builds.describe(),
        "cpus": os.cpu_count(),
        "workload": ctx.workload.describe() if ctx.workload is not None else None,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    summary_path = RESULTS / "summary.json"
    previous = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    if set(selected) != set(FIGURES) and previous.get("full_suite"):
        summary["full_suite"] = previous["full_suite"]  # keep the last whole-suite timing
    elif set(selected) == set(FIGURES):
        summary["full_suite"] = {
            "command": ctx.command,
            "total_s": summary["total_s"],
            "date": summary["date"],
            "revision": ctx.revision,
        }
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    if not args.no_report:
        path = report.write(RESULTS)
        _say(f"wrote {path}")
    _say(f"suite done in {total:.0f} s")
    return 0


def _say(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
