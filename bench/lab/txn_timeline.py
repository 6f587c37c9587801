"""Sum up the per-transaction timelines a latency run kept (``BENCH_LATENCY_TIMELINE``).

``python3 -m bench.lab.txn_timeline DIR...``: per step of the commit (the
``processor.timeline`` lines, commit.py), its p50 / p90 / p99 / max in ms; the
slowest 1% of transactions (first record -> commit returned) split by step;
the CPU waits after ``| sched`` (ms runnable but not running: the loop
thread in the batch's window and from close to the offsets sent, every
thread during ``commit_transaction``; ``processor/service/txn/schedstat.py``);
and, when librdkafka's ``eos`` debug lines are there, how many
AddPartitionsToTxn requests a transaction sent and how often the coordinator
answered CONCURRENT_TRANSACTIONS.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

STEP = re.compile(r"(\w+)=([0-9.]+)")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def summary(paths: list[Path]) -> str:
    txns: list[dict[str, float]] = []
    waits: list[dict[str, float]] = []
    registers = concurrent_parts = concurrent_offsets = 0
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            if "processor.timeline: txn " in line:
                spans, _, sched = line.split(": txn ", 1)[1].partition(" | sched ")
                txns.append({k: float(v) for k, v in STEP.findall(spans)})
                waits.append({k: float(v) for k, v in STEP.findall(sched)})
            elif "Registering partitions with transaction" in line:
                registers += 1
            elif "CONCURRENT_TRANSACTIONS" in line or "another concurrent operation" in line:
                if "ADDOFFSETS" in line:
                    concurrent_offsets += "AddOffsetsToTxn response" in line
                elif "ADDPARTS" in line:
                    concurrent_parts += 1
    if not txns:
        return "no timeline lines"
    steps = [k for k in txns[0] if k != "events"]
    out = [f"{len(txns)} transactions; ms per step: p50 / p90 / p99 / max"]
    for step in [*steps, "total"]:
        vals = [t.get(step, 0.0) for t in txns] if step != "total" else [_total(t) for t in txns]
        out.append(
            f"  {step:10} {_pct(vals, 0.5):7.1f} {_pct(vals, 0.9):7.1f} "
            f"{_pct(vals, 0.99):7.1f} {max(vals):7.1f}"
        )
    for name in waits[0]:
        vals = [w.get(name, 0.0) for w in waits]
        out.append(
            f"  {name:12} {_pct(vals, 0.5):7.1f} {_pct(vals, 0.9):7.1f} "
            f"{_pct(vals, 0.99):7.1f} {max(vals):7.1f}  "
            + ("(ms on a CPU)" if name.endswith("_run") else "(ms runnable, not running)")
        )
    order = sorted(range(len(txns)), key=lambda i: _total(txns[i]))
    out.append("slowest 1% (first record -> commit returned) | CPU figures:")
    for i in order[-max(1, len(txns) // 100) :]:
        spent = " ".join(f"{k}={v:.0f}" for k, v in txns[i].items())
        out.append(f"  {spent} | " + " ".join(f"{k}={v:.0f}" for k, v in waits[i].items()))
    out.append(
        f"AddPartitionsToTxn requests per transaction: {registers / len(txns):.2f}; "
        f"CONCURRENT_TRANSACTIONS answers: AddPartitionsToTxn {concurrent_parts}, "
        f"AddOffsetsToTxn {concurrent_offsets}"
    )
    return "\n".join(out)


def _total(t: dict[str, float]) -> float:
    return sum(v for k, v in t.items() if k not in ("events", "flushed"))


if __name__ == "__main__":
    files = [f for a in sys.argv[1:] for f in sorted(Path(a).glob("*.log")) or [Path(a)]]
    print(summary(files))
