"""Figure: failover wait after each single fault, and through a rolling restart (issue 37).

A 3-broker local cluster (``processor.devcluster.LocalCluster``, started by the
figure: the bench's single broker has no replicas to fail over to), three
``processor run`` members with their own defaults, two writers appending
continuously; then one fault at a time, 30 s apart (``tests/faults/failover.py``,
``failover_faults.py``, which the fault suite's ``test_failover.py`` also
runs): a member SIGKILLed and replaced under a new instance id, one SIGKILLed
and restarted under its own, one paused past its session timeout, the group
coordinator's broker and a transaction coordinator's broker killed (down
10 s), a rolling restart, and one with a member a commit older.  Per fault:
p50/p99/max of produce acknowledged -> the session's committed ``status``
head showing that seq on a ``read_committed`` follower, over the events
acknowledged from 1 s before the fault to 30 s after it (a rollout: to 5 s
after its last member is ready).  ``--runs N``: N runs, medians per cell.

``BENCH_FAILOVER_ARGS`` adds ``processor run`` arguments to every member
(e.g. ``--group-protocol classic``); ``BENCH_FAILOVER_FENCE=0`` runs them
without the fence of dead members' transactions.  The broker's
``transaction.abort.timed.out.transaction.cleanup.interval.ms`` is the broker
default (10 s) unless ``BENCH_FAILOVER_ABORT_CHECK_MS`` says otherwise.
``BENCH_FAILOVER_CONTROLLER=combined`` runs the cluster's three nodes as
broker and controller each (combined mode, the fault suite's cluster): a
killed broker is then also a controller voter lost, sometimes the active
controller, and its restart may start a new controller election (a lab run:
views stale 26 s).  By default the brokers run beside one controller-only node
(isolated mode, as production clusters run), so each broker fault is one fault.
``BENCH_FAILOVER_KEEP=DIR`` keeps the members' logs (``DIR/run-N``) and the
cluster's directory (``DIR/cluster``, the brokers' logs and data) for a window
to be read against them; by default both are removed.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.common import Context, measure, result
from processor.devcluster import LocalCluster
from tests.faults.conftest import make_stack
from tests.faults.failover import FailoverRun, default_faults, run_failover, table

ABORT_CHECK_MS = os.environ.get("BENCH_FAILOVER_ABORT_CHECK_MS", "10000")
ARGS = tuple(shlex.split(os.environ.get("BENCH_FAILOVER_ARGS", "")))
FENCE = os.environ.get("BENCH_FAILOVER_FENCE", "1") != "0"
KEEP = os.environ.get("BENCH_FAILOVER_KEEP", "")
DEDICATED_CONTROLLER = os.environ.get("BENCH_FAILOVER_CONTROLLER", "dedicated") != "combined"


def _workdir() -> contextlib.AbstractContextManager[str]:
    """The runs' directory: ``KEEP`` (left in place), else a temporary one."""
    if KEEP:
        if Path(KEEP).exists() and any(Path(KEEP).iterdir()):
            raise SystemExit(f"BENCH_FAILOVER_KEEP={KEEP}: not empty (the runs need a new one)")
        Path(KEEP).mkdir(parents=True, exist_ok=True)
        print(f"[bench] failover: logs kept in {KEEP}")
        return contextlib.nullcontext(KEEP)
    return tempfile.TemporaryDirectory(prefix="bench-failover-")


def _one(cluster: LocalCluster, tmp: Path, i: int) -> FailoverRun:
    workdir = tmp / f"run-{i}"
    workdir.mkdir()
    stack = make_stack(cluster, workdir, partitions=3)
    try:
        env = {"PROCESSOR_FENCE_ZOMBIES": "true" if FENCE else "false"}
        return run_failover(
            stack, env=env, seed=37 + i, faults=default_faults(True), args=ARGS, say=print
        )
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
    cluster = LocalCluster(
        3, overrides=overrides, keep=bool(KEEP), dedicated_controller=DEDICATED_CONTROLLER
    )
    with _workdir() as d:
        cluster.start(Path(d, "cluster"))
        try:
            runs = [_one(cluster, Path(d), i) for i in range(ctx.runs)]
        finally:
            cluster.stop()
    figures = _medians(runs)
    print(table(figures))
    faults = [label for label in figures if label != "steady"]
    worst = [max(r.figures[label]["p99_s"] for label in faults) for r in runs]
    return result(
        ctx,
        "failover",
        "Failover: produce acknowledged -> visible (read_committed), 30 s after each fault",
        value=measure("p99 of the worst fault", "s", worst, 2),
        baseline=measure(
            "p99 away from faults", "s", [r.figures["steady"]["p99_s"] for r in runs], 2
        ),
        rows=[
            (label, f"p50 {f.get('p50_s')} s, p99 {f.get('p99_s')} s, max {f.get('max_s')} s")
            for label, f in figures.items()
        ],
        args=list(ARGS),
        fence=FENCE,
        controller="dedicated" if DEDICATED_CONTROLLER else "combined",
        abort_check_ms=int(ABORT_CHECK_MS),
        figures=figures,
    )
