"""Cyclic GC cost with many sessions held in memory (issue 15), core only.

Each configuration runs in its own child process.  The child folds ``N``
sessions of 12 events (events parsed afresh per session, so no objects are
shared, as a member holding its partitions after a restore), keeps them,
then measures with ``gc.callbacks``:

- ``full_collect_s``: one ``gc.collect()`` (a full collection) over that heap;
- the *hot path*: folding 60,000 more events (1,000 new sessions of 60
  events) with the thresholds ``processor`` sets (50_000, 20, 100), as the
  time spent inside the collector per generation and its share of the fold.

``--freeze`` calls ``gc.freeze()`` once after the held sessions are built
(what a member can do after its restore): frozen objects are never traversed
again, so a full collection costs what the new objects cost.

    python -m bench.gc_cost --sessions 10000,100000
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import subprocess
import sys
import time
from typing import Any

from bench.common import REPO, python_env

HELD_EVENTS = 12
POOL = 300


def _logs(count: int, length: int, seed: int) -> list[list[bytes]]:
    from processor.workload import generate_session

    return [
        [e.to_bytes() for e in generate_session(random.Random(seed + i), length)]
        for i in range(count)
    ]


def child(n: int, freeze: bool) -> dict[str, Any]:
    from processor.core.builtin import default_registry
    from processor.core.defaults import default_message_projections
    from processor.core.events import parse_event_bytes
    from processor.core.session import Session, synthetic_header

    gc.set_threshold(50_000, 20, 100)  # as the `processor` command does
    registry, mp = default_registry(), default_message_projections()
    pool = _logs(POOL, HELD_EVENTS, 41)
    hot = _logs(1000, 60, 97)

    def fold(sid: str, lines: list[bytes]) -> Session:
        session = Session(synthetic_header(sid), message_projections=mp, projections=registry)
        for line in lines:
            session.append(parse_event_bytes(line))
        return session

    t0 = time.perf_counter()
    held = [fold(f"held-{i}", pool[i % POOL]) for i in range(n)]
    build_s = time.perf_counter() - t0
    gc.collect()
    if freeze:
        gc.freeze()
    pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
    started = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses[info["generation"]].append(time.perf_counter() - started[0])

    gc.callbacks.append(on_gc)
    t0 = time.perf_counter()
    gc.collect()
    full_collect_s = time.perf_counter() - t0
    for v in pauses.values():
        v.clear()
    t0 = time.perf_counter()
    hot_sessions = [fold(f"hot-{i}", lines) for i, lines in enumerate(hot)]
    hot_s = time.perf_counter() - t0
    gc.callbacks.remove(on_gc)
    in_gc = sum(sum(v) for v in pauses.values())
    return {
        "sessions": n,
        "freeze": freeze,
        "build_s": round(build_s, 2),
        "objects_tracked": len(gc.get_objects()),
        "frozen": gc.get_freeze_count(),
        "full_collect_s": round(full_collect_s, 4),
        "hot_events": sum(len(x) for x in hot),
        "hot_s": round(hot_s, 3),
        "hot_gc_s": round(in_gc, 4),
        "hot_gc_share": round(in_gc / hot_s, 4),
        "hot_collections": {g: len(v) for g, v in pauses.items()},
        "hot_max_pause_s": round(max((max(v) for v in pauses.values() if v), default=0.0), 4),
        "held": len(held),
        "hot_sessions": len(hot_sessions),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", default="10000,100000")
    ap.add_argument("--child", type=int, default=None)
    ap.add_argument("--freeze", action="store_true")
    args = ap.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child, args.freeze)))
        return
    for n in (int(x) for x in args.sessions.split(",")):
        for freeze in (False, True):
            argv_c = [sys.executable, "-m", "bench.gc_cost", "--child", str(n)]
            done = subprocess.run(
                argv_c + (["--freeze"] if freeze else []),
                cwd=REPO,
                env=python_env(),
                capture_output=True,
                text=True,
                check=True,
            )
            print(done.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
