"""Figure: failover wait, with and without the fence of dead members' transactions (issue 37).

A 3-node local cluster (``processor.devcluster.LocalCluster``, started by the
figure: the bench's single broker has no replicas to fail over to), three
``processor run`` members, two writers appending continuously; a member is
SIGKILLed and replaced under a new instance id, then another SIGKILLed and
restarted under its own id (``tests/faults/failover.py``, which the fault
suite's ``test_failover.py`` also runs).  Per window: p50/p99/max of
produce acknowledged -> the session's committed ``status`` head showing that
seq on a ``read_committed`` follower, over the events acknowledged in the
30 s after the fault (and before the first fault: steady).  Each run once
with ``fence_zombies`` off (before issue 37) and once on; ``--runs N``: N
pairs, medians per cell.

The broker's ``transaction.abort.timed.out.transaction.cleanup.interval.ms``
is the broker default (10 s) unless ``BENCH_FAILOVER_ABORT_CHECK_MS`` says
otherwise: what a dead member's transaction costs without the fence.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.common import Context, measure, ratio, result
from processor.devcluster import LocalCluster
from tests.faults.conftest import make_stack
from tests.faults.failover import FailoverRun, run_failover, table

ABORT_CHECK_MS = os.environ.get("BENCH_FAILOVER_ABORT_CHECK_MS", "10000")


def _one(cluster: LocalCluster, tmp: Path, fence: bool, i: int) -> FailoverRun:
    workdir = tmp / f"{'fence' if fence else 'wait'}-{i}"
    workdir.mkdir()
    stack = make_stack(cluster, workdir, partitions=3)
    try:
        env = {"PROCESSOR_FENCE_ZOMBIES": "true" if fence else "false"}
        return run_failover(stack, env=env, seed=37 + i, say=print)
    finally:
        stack.stop_all()


def _medians(runs: list[FailoverRun]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for label in runs[0].figures:
        cells = [r.figures[label] for r in runs]
        out[label] = {"events": sum(c["events"] for c in cells)}
        for key in ("p50_s", "p99_s", "max_s"):
            vals = [c[key] for c in cells if key in c]
            if vals:
                out[label][key] = round(statistics.median(vals), 2)
                out[label][key.replace("_s", "_runs")] = vals
    return out


def run(ctx: Context) -> dict[str, Any]:
    overrides = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": ABORT_CHECK_MS}
    cluster = LocalCluster(3, overrides=overrides)
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as d:
        cluster.start(Path(d, "cluster"))
        try:
            before, after = [], []
            for i in range(ctx.runs):
                before.append(_one(cluster, Path(d), False, i))
                after.append(_one(cluster, Path(d), True, i))
        finally:
            cluster.stop()
    figures = {"without fence": _medians(before), "with fence": _medians(after)}
    for name, rows in figures.items():
        print(f"{name}:\n{table(rows)}")
    new_id = before[0].faults[0].label
    on = [r.figures[new_id]["p99_s"] for r in after]
    off = [r.figures[new_id]["p99_s"] for r in before]
    return result(
        ctx,
        "failover",
        "Failover: produce acknowledged -> visible (read_committed), 30 s after each fault",
        value=measure(f"p99, {new_id}, with fence", "s", on, 2),
        baseline=measure(f"p99, {new_id}, without fence", "s", off, 2),
        ratio=ratio("with / without", on, off),
        rows=[
            (
                f"{name}: {label}",
                f"p50 {f.get('p50_s')} s, p99 {f.get('p99_s')} s, max {f.get('max_s')} s",
            )
            for name, rows in figures.items()
            for label, f in rows.items()
        ],
        abort_check_ms=int(ABORT_CHECK_MS),
        figures=figures,
    )
