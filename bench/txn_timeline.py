"""Sum up the per-transaction timelines a latency run kept (``BENCH_LATENCY_TIMELINE``).

``python3 -m bench.txn_timeline DIR...``: per step of the commit (the
``processor.timeline`` lines, commit.py), its p50 / p90 / p99 / max in ms; the
slowest 1% of transactions (first record -> commit returned) split by step;
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
    registers = concurrent_parts = concurrent_offsets = 0
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            if "processor.timeline: txn " in line:
                txns.append({k: float(v) for k, v in STEP.findall(line.split(": txn ", 1)[1])})
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
    slow = sorted(txns, key=_total)[-max(1, len(txns) // 100) :]
    out.append("slowest 1% (first record -> commit returned):")
    for t in slow:
        out.append("  " + " ".join(f"{k}={v:.0f}" for k, v in t.items()))
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
