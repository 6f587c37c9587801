"""How long this process's threads waited for a CPU (Linux ``schedstat``).

For the per-transaction timeline only (commit.py, DEBUG): a slow step whose
thread was runnable but not running most of the time was starved by the
box (other processes), not slowed by its own work or by the broker
(figure 5).  Elsewhere (no ``/proc``) every figure is 0.
"""

from __future__ import annotations

import os


def _read(path: str) -> tuple[float, float]:
    try:
        with open(path, "rb") as f:
            run_ns, wait_ns, _ = f.read().split()
    except (OSError, ValueError):
        return 0.0, 0.0
    return int(run_ns) / 1e6, int(wait_ns) / 1e6


def thread_ms() -> tuple[float, float]:
    """The calling thread's (ms on a CPU, ms runnable but waiting for one) so far."""
    return _read("/proc/thread-self/schedstat")


def process_wait_ms() -> float:
    """Ms every thread of this process has waited runnable for a CPU so far."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0.0
    return sum(_read(f"/proc/self/task/{t}/schedstat")[1] for t in tasks)
