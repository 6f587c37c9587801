"""The offline fold's two parts alone: reading a log and folding parsed events.

CPU microseconds per event, best of N runs each (``process_time``), with the
cyclic GC off as ``processor fold`` runs.  ``bench.fold_speed``'s fold side
is both parts plus young collections; this splits them, so a change to the
read path (envelope, ``freeze``) and one to the fold can be told apart.
Prints one line and whether the core is the compiled build::

    python -m bench.lab.fold_parts --events 30000 --runs 7 --label after
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable

import processor.core.session as session_module
from bench.common import generated_session_file
from processor.files import read_session_file
from processor.offline import fold_events


def _best_us(fn: Callable[[], object], runs: int, events: int) -> float:
    best = float("inf")
    for _ in range(runs):
        c0 = time.process_time()
        fn()
        best = min(best, time.process_time() - c0)
    return best / events * 1e6


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=30_000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--label", default="")
    args = ap.parse_args(argv)
    gc.disable()
    with generated_session_file(args.events, args.seed) as (path, file):
        read = _best_us(lambda: read_session_file(path), args.runs, args.events)
        fold = _best_us(lambda: fold_events(file.events, file.header), args.runs, args.events)
    build = "pure" if session_module.__file__.endswith(".py") else "compiled"
    print(f"{args.label} read {read:.2f} fold {fold:.2f} us/event ({build})".strip())


if __name__ == "__main__":
    main()
