"""Where do the slowest waits after a broker fault go? (issue 37's broker-fault max)

``python3 -m bench.lab.broker_failover [ROUNDS] [KEEP_DIR] [KINDS]``: the
failover scenario of ``bench/failover.py`` with only the two broker faults
(the group coordinator's broker, then a transaction coordinator's; or the
comma-separated fault kinds of ``KINDS``, e.g. ``rollout``), ``ROUNDS`` times
(default 3; 0: the figure's own faults, once), on a fresh 3-broker local
cluster.  Members log at DEBUG (one
``processor.timeline`` line per commit); their logs and the cluster's are
kept in ``KEEP_DIR`` (default a new temporary directory, printed).  Per fault:
p50/p99/max, then the slowest events: when each was acknowledged and became
visible, relative to the broker's kill, and the wall-clock time to look for
in the member logs.  ``BENCH_FAILOVER_ARGS`` adds member arguments and
``BENCH_FAILOVER_CONTROLLER`` picks the cluster's layout as in the figure.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.failover import ABORT_CHECK_MS, ARGS, DEDICATED_CONTROLLER
from processor.devcluster import LocalCluster
from tests.faults.conftest import make_stack
from tests.faults.failover import default_faults, run_failover, table
from tests.faults.failover_faults import Fault

BROKER_FAULTS = "kill-group-coordinator,kill-txn-coordinator"


def _faults(rounds: int, kinds: str) -> list[Fault]:
    if rounds == 0:  # the figure's faults, in its order
        return default_faults(True)
    return [Fault(f"{kind} #{i}", kind) for i in range(rounds) for kind in kinds.split(",")]


def main(argv: list[str]) -> int:
    rounds = int(argv[0]) if argv else 3
    kinds = argv[2] if len(argv) > 2 else BROKER_FAULTS
    keep = Path(argv[1]) if len(argv) > 1 else Path(tempfile.mkdtemp(prefix="lab-failover-"))
    keep.mkdir(parents=True, exist_ok=True)
    print(f"logs kept in {keep}")
    overrides = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": ABORT_CHECK_MS}
    cluster = LocalCluster(  # the brokers' logs kept too
        3, overrides=overrides, keep=True, dedicated_controller=DEDICATED_CONTROLLER
    )
    cluster.start(keep / "cluster")
    wall_minus_mono = time.time() - time.monotonic()
    (keep / "run").mkdir()
    stack = make_stack(cluster, keep / "run", partitions=3)
    try:
        run = run_failover(
            stack,
            env={"PROCESSOR_FENCE_ZOMBIES": "true"},
            faults=_faults(rounds, kinds),
            args=("--log-level", "DEBUG", *ARGS),
            say=print,
        )
    finally:
        stack.stop_all()
        cluster.stop()
    print(table(run.figures))
    for fault in run.faults:
        killed = time.strftime("%H:%M:%S", time.gmtime(fault.at + wall_minus_mono))
        print(f"\n{fault.label}: {fault.note}, killed at {killed}")
        kill = fault.at
        for sid, seq, acked, wait in run.slowest.get(fault.label, []):
            wall = time.strftime("%H:%M:%S", time.gmtime(acked + wait + wall_minus_mono))
            print(
                f"  {sid} seq {seq}: acked {acked - kill:+.2f} s, "
                f"visible {acked + wait - kill:+.2f} s after the kill "
                f"(wait {wait:.2f} s, visible at {wall})"
            )
    shutil.copy2(__file__, keep / "experiment.py")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
