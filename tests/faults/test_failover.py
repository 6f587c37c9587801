"""Failover under steady load (issue 37): a member SIGKILLed and replaced
under a new instance id, another SIGKILLed and restarted under its own id.

Asserts correctness only (every view equals the offline fold, no violation
on the read_committed follower, no dead letter, every member alive); prints
the produce-acknowledged -> visible latency of the 30 s after each fault.
``PROCESSOR_FAILOVER_FENCE=0`` runs the members without the fence of dead
members' transactions (``PROCESSOR_FENCE_ZOMBIES=false``), for the figure before it;
``python -m bench --only failover`` measures both.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from processor.devcluster import LocalCluster
from tests.faults.conftest import make_stack
from tests.faults.failover import run_failover, table

pytestmark = pytest.mark.faults

FENCE = os.environ.get("PROCESSOR_FAILOVER_FENCE", "1") != "0"


def test_failover_keeps_views_exact_and_prints_the_wait(
    cluster: LocalCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stack = make_stack(cluster, tmp_path, partitions=3)
    env = {"PROCESSOR_FENCE_ZOMBIES": "true" if FENCE else "false"}
    try:
        run = run_failover(stack, env=env)
    finally:
        stack.stop_all()
    with capsys.disabled():
        print(f"\nfailover, fence of dead members {'on' if FENCE else 'off'}:")
        print(table(run.figures))
    for label, figure in run.figures.items():
        assert figure["events"] > 0 and figure["missing"] == 0, (label, figure)
