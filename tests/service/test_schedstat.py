"""schedstat: the CPU waits the per-transaction timeline reports (no broker needed)."""

from __future__ import annotations

import sys

import pytest

from processor.service.txn import schedstat


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc schedstat is Linux's")
def test_the_thread_figures_grow_with_the_threads_own_work() -> None:
    run0, wait0 = schedstat.thread_ms()
    sum(i * i for i in range(300_000))  # a few ms on a CPU
    run1, wait1 = schedstat.thread_ms()
    assert run1 > run0 > 0
    assert wait1 >= wait0 >= 0
    assert schedstat.process_wait_ms() >= wait1  # every thread's, this one's included


def test_no_schedstat_reads_as_zero() -> None:
    assert schedstat._read("/proc/no-such-file/schedstat") == (0.0, 0.0)
