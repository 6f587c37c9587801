"""Figure ``ship``: ``processor ship`` from a live writer's append to the view.

1. **Latency**: a ``processor run`` member, a ``processor ship ROOT``
   follower and a read_committed view watcher (``bench.latency.ViewWatcher``)
   run while a writer appends to ``SESSIONS`` sessions laid out as the
   runtime does (zstd frames, one per batch, fsync'd), one batch per session
   every ``BATCH_WINDOW_S`` (the runtime's batching window).  Latency of an
   event: from its append's return (the fsync) to the ``status`` view with
   that seq visible.  Target: p99 <= 2 x the commit interval + the window.
2. **Throughput**: the same tree of files (``FILES`` sessions) into fresh
   topics by ``processor ingest FILES`` and by ``processor ship --once ROOT``,
   back to back, wall time of each command; ratio = ship rate / ingest rate
   (target >= 0.8).
"""

from __future__ import annotations

import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import REPO, Context, measure, python_env, ratio, result, unique, wait_for
from bench.latency import ViewWatcher, _percentile
from bench.workload import create, session_logs
from processor.config import ServiceConfig
from tests.ship.runtime_writer import RuntimeWriter

SESSIONS = 20
BATCH_WINDOW_S = 0.2
EVENTS_PER_BATCH = 5
DURATION_S = 8.0
COMMIT_INTERVAL_MS = ServiceConfig().commit_interval_ms
FILES = 200
FILE_EVENTS = 150


def _cli(ctx: Context, prefix: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "processor", *args, "-b", ctx.bootstrap, "--topic-prefix", prefix]


def _latency(ctx: Context, tmp: Path) -> dict[str, float]:
    prefix = unique("bench-ship")
    config = ctx.config(topic_prefix=prefix, group_id=f"{prefix}-group")
    create(config)
    root = tmp / f"lat-{prefix}"
    root.mkdir()
    per = int(DURATION_S / BATCH_WINDOW_S) * EVENTS_PER_BATCH + 1
    logs = list(session_logs(SESSIONS, per, seed=34, tag="ship"))
    writers = [RuntimeWriter(root, sid) for sid, _ in logs]
    sent: dict[tuple[str, int], float] = {}
    watcher = ViewWatcher(config, sent)
    watcher.start()
    run = subprocess.Popen(
        [*_cli(ctx, prefix, "run"), "--group-id", config.group_id, "--log-level", "WARNING"],
        cwd=REPO,
        env=python_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ship = subprocess.Popen(
        [*_cli(ctx, prefix, "ship", str(root)), "--state-dir", str(tmp / f"state-{prefix}")],
        cwd=REPO,
        env=python_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for w, (_, events) in zip(writers, logs, strict=True):  # warm-up: seq 0, not measured
            w.append(events[:1])
        if not wait_for(lambda: len(watcher.seen) >= SESSIONS, 90):
            raise RuntimeError(f"warm-up: {len(watcher.seen)} of {SESSIONS} sessions visible")
        rng = random.Random(5)
        t0 = time.perf_counter()
        rounds = int(DURATION_S / BATCH_WINDOW_S)
        for r in range(rounds):
            for i, (w, (sid, events)) in enumerate(zip(writers, logs, strict=True)):
                due = t0 + r * BATCH_WINDOW_S + i * BATCH_WINDOW_S / SESSIONS
                delay = due - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                lo = len(w.events)
                batch = events[lo : lo + rng.randint(1, EVENTS_PER_BATCH)]
                if not batch:
                    continue
                w.append(batch)
                done = time.perf_counter()
                for e in batch:
                    sent[(sid, e.seq)] = done
        last = {w.sid: w.events[-1].seq for w in writers}
        wait_for(lambda: all(watcher.seen.get(s, -1) >= q for s, q in last.items()), 60)
    finally:
        watcher.stop_flag.set()
        watcher.join(10)
        for p in (ship, run):
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    lat = watcher.latencies
    if not lat:
        raise RuntimeError("no event became visible")
    return {
        "p50_ms": 1000 * _percentile(lat, 0.5),
        "p99_ms": 1000 * _percentile(lat, 0.99),
        "events": float(len(lat)),
    }


def _tree(root: Path) -> list[Path]:
    paths = []
    rng = random.Random(9)
    for sid, events in session_logs(FILES, FILE_EVENTS, seed=35, tag="thr"):
        w = RuntimeWriter(root, sid)
        i = 0
        while i < len(events):
            n = rng.randint(1, 12)
            w.append(events[i : i + n])
            i += n
        paths.append(w.path)
    return paths


def _timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, env=python_env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])}: {done.stderr[-500:]}")
    return time.perf_counter() - t0


def run(ctx: Context) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-ship-") as d:
        tmp = Path(d)
        lats = [_latency(ctx, tmp) for _ in range(ctx.runs)]
        root = tmp / "files"
        root.mkdir()
        paths = _tree(root)
        events = FILES * FILE_EVENTS
        ingest_rates, ship_rates = [], []
        for i in range(ctx.runs):
            a, b = unique("bench-ingest"), unique("bench-shipthr")
            create(ctx.config(topic_prefix=a))
            create(ctx.config(topic_prefix=b))
            ingest_s = _timed([*_cli(ctx, a, "ingest"), "--no-progress", *map(str, paths)])
            ship_s = _timed(
                [
                    *_cli(ctx, b, "ship", str(root)),
                    *("--once", "--no-progress", "--state-dir", str(tmp / f"thr-state-{i}")),
                ]
            )
            ingest_rates.append(events / ingest_s)
            ship_rates.append(events / ship_s)
    p99s = [x["p99_ms"] for x in lats]
    target_ms = 2 * COMMIT_INTERVAL_MS + 1000 * BATCH_WINDOW_S
    thr = ratio("ship / ingest (events/s)", ship_rates, ingest_rates)
    p50s = [x["p50_ms"] for x in lats]
    ship_m = measure("ship --once", "events/s", ship_rates, 0)
    ingest_m = measure("ingest", "events/s", ingest_rates, 0)
    return result(
        ctx,
        "ship",
        "processor ship: append-to-view latency and throughput against ingest",
        value=measure("append-to-view p99", "ms", p99s),
        ratio=thr,
        targets=[
            {"text": "ship / ingest throughput >= 0.8", "met": thr["median"] >= 0.8},
            {
                "text": f"append-to-view p99 <= 2 x commit interval + batch window "
                f"= {target_ms:.0f} ms",
                "met": max(p99s) <= target_ms,
            },
        ],
        rows=[
            ("append-to-view p50 (ms), median of runs", f"{statistics.median(p50s):.1f}"),
            ("events measured per run", ", ".join(str(int(x["events"])) for x in lats)),
            ("ship --once (events/s), median", f"{ship_m['median']:,.0f}"),
            ("ingest (events/s), median", f"{ingest_m['median']:,.0f}"),
            (
                "setup",
                f"{SESSIONS} live sessions, one batch each per {BATCH_WINDOW_S} s, commit "
                f"interval {COMMIT_INTERVAL_MS} ms; {FILES} files x {FILE_EVENTS} events",
            ),
        ],
        p50=measure("append-to-view p50", "ms", p50s),
        ship_rate=ship_m,
        ingest_rate=ingest_m,
    )
