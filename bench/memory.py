"""Figure 6: resident bytes per live session at 10k and 100k sessions.

Each configuration runs in its own child process (``python -m bench.memory
--child N L``) so the figures do not share an allocator.  The child
generates a pool of distinct session logs of ``L`` events and encodes them
to Avro once, reads VmRSS, then for each of ``N`` sessions decodes that
session's records afresh (``decode_event`` + ``to_event``: new objects per
session, as the Processor gets from the consumer) and folds them through a
:class:`~processor.engine.runtime.SessionRuntime` exactly as the runner does
(``Session.append``, ``record_applied``, ``log.trim_before``, then one
commit's ``session_output``, which hands the transcript off to the views and
fills the ledgers of what the topics hold), keeps every runtime alive, and
reads VmRSS again after a full GC.
Bytes per session = RSS growth / N.  Pool logs are reused round-robin across
session ids (``N / pool`` sessions share a log's content, never its objects).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
import tracemalloc
from typing import Any

from bench.common import REPO, Context, measure, python_env, result, rss_bytes

POOL = 300
TRACE_TOP = 15
#: (sessions, events per session); 100k uses the same short sessions as one 10k row,
#: so the two are comparable, and 10k x 60 is figure 1's session length.
CONFIGS = ((10_000, 12), (100_000, 12), (10_000, 60))


def child(n: int, length: int, trace: bool = False) -> dict[str, Any]:
    from bench.workload import session_logs
    from processor.codec import default_codec
    from processor.config import ServiceConfig
    from processor.core.builtin import default_registry
    from processor.core.defaults import default_message_projections
    from processor.core.session import Session, synthetic_header
    from processor.engine.output import session_output
    from processor.engine.records import Tally
    from processor.engine.runtime import SessionRuntime

    codec = default_codec()
    cfg = ServiceConfig()
    pool = [
        [codec.encode_parsed_event(sid, e) for e in events]
        for sid, events in session_logs(min(n, POOL), length, seed=41, tag="mem")
    ]
    registry = default_registry()
    message_projections = default_message_projections()
    gc.collect()
    if trace:
        tracemalloc.start(1)
    before = rss_bytes()
    t0 = time.perf_counter()
    runtimes: dict[str, SessionRuntime] = {}
    for i in range(n):
        sid = f"mem-{i:07d}"
        session = Session(
            synthetic_header(sid), message_projections=message_projections, projections=registry
        )
        rt = SessionRuntime(sid, i % 12, session, window=cfg.duplicate_window)
        for offset, value in enumerate(pool[i % len(pool)]):
            event = codec.decode_event(value).to_event()
            session.append(event)
            rt.record_applied(event, offset)
            session.log.trim_before(event.seq + 1)
        for _ in session_output(  # one commit: hands the transcript off, fills the ledgers
            rt, rt.view_changes(), {}, config=cfg, codec=codec, tally=Tally()
        ):
            pass
        runtimes[sid] = rt
    gc.collect()
    after = rss_bytes()
    out: dict[str, Any] = {
        "sessions": n,
        "events_per_session": length,
        "rss_before": before,
        "rss_after": after,
        "bytes_per_session": (after - before) / n,
        "fold_s": time.perf_counter() - t0,
        "held": len(runtimes),
    }
    if trace:
        stats = tracemalloc.take_snapshot().statistics("lineno")
        traced = sum(st.size for st in stats)
        out["traced_bytes_per_session"] = traced / n
        out["top_allocations"] = [
            [str(st.traceback[0]).replace(str(REPO) + "/", ""), round(st.size / n)]
            for st in stats[:TRACE_TOP]
        ]
    return out


def _run_child(n: int, length: int, trace: bool = False) -> dict[str, Any]:
    argv = [sys.executable, "-m", "bench.memory", "--child", str(n), str(length)]
    if trace:
        argv.append("--trace")
    done = subprocess.run(
        argv, cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=1800
    )
    if done.returncode != 0:
        raise RuntimeError(f"memory child {n}x{length} failed: {done.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def run(ctx: Context) -> dict[str, Any]:
    # RSS is not timing noise: the 10k rows repeat (up to 3 runs) to show the
    # spread, the 100k row is one child (a full fold of 1.2M events)
    rows: list[list[Any]] = []
    per: dict[tuple[int, int], list[float]] = {}
    raw: list[dict[str, Any]] = []
    for n, length in CONFIGS:
        for _ in range(1 if n >= 100_000 else max(1, min(ctx.runs, 3))):
            out = _run_child(n, length)
            raw.append(out)
            per.setdefault((n, length), []).append(out["bytes_per_session"])
    trace = _run_child(2_000, CONFIGS[0][1], trace=True)
    for (n, length), samples in per.items():
        m = measure("", "", samples, 0)
        rows.append(
            [
                f"{n:,} sessions x {length} events: bytes per session "
                f"({len(samples)} run{'s' if len(samples) > 1 else ''})",
                f"{m['median']:,.0f} (min {m['min']:,.0f}, max {m['max']:,.0f})",
            ]
        )
    rows.append(
        [
            f"tracemalloc, 2,000 x {CONFIGS[0][1]}: traced bytes per session",
            f"{trace['traced_bytes_per_session']:,.0f}",
        ]
    )
    for site, size in trace["top_allocations"][:8]:
        rows.append([f"  allocated at {site}", f"{size:,} B/session"])
    small = per[CONFIGS[0]]
    big = per[CONFIGS[1]]
    base = statistics.median(small)
    rs = [b / base for b in big]
    return result(
        ctx,
        "memory",
        "Memory: resident bytes per live session",
        workload=", ".join(f"{n:,} x {length} events" for n, length in CONFIGS),
        value=measure(
            f"{CONFIGS[1][0]:,} sessions x {CONFIGS[1][1]} events", "bytes/session", big, 0
        ),
        baseline=measure(
            f"{CONFIGS[0][0]:,} sessions x {CONFIGS[0][1]} events", "bytes/session", small, 0
        ),
        ratio={
            "label": "per-session bytes, 100k / median 10k (1.0 = linear)",
            "median": round(statistics.median(rs), 3),
            "min": round(min(rs), 3),
            "max": round(max(rs), 3),
            "samples": [round(r, 3) for r in rs],
        },
        targets=[
            {"text": "no target; per-session memory should not grow with the count", "met": None}
        ],
        rows=rows,
        raw={"children": raw, "trace": trace},
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs=2, type=int, metavar=("SESSIONS", "EVENTS"), required=True)
    ap.add_argument("--trace", action="store_true", help="tracemalloc: top allocation sites")
    args = ap.parse_args()
    n, length = args.child
    print(json.dumps(child(n, length, trace=args.trace)))


if __name__ == "__main__":
    main()
