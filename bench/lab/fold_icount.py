"""Instructions per folded event, for a box too loaded for CPU times.

Reads a generated session once, folds it once to warm up, then ``--folds``
more times; run it under cachegrind with ``--folds 0`` and ``--folds 2`` and
divide the difference of the two instruction totals by ``2 x --events``.
Each fold ends with ``projections.materialize()``: units with ``apply_all``
fold their queued events when a reader looks, and that work is the fold's too.
Instruction counts do not move with the machine's load (repeat runs of the
same code agree within ~1%); CPU times on the shared box moved up to 40%::

    PYTHONHASHSEED=0 valgrind --tool=cachegrind --cache-sim=no \\
        --cachegrind-out-file=/dev/null python3.11 -m bench.lab.fold_icount --folds 2
"""

from __future__ import annotations

import argparse
import gc

from bench.common import generated_session_file
from processor.offline import fold_events


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folds", type=int, default=2)
    ap.add_argument("--events", type=int, default=5_000)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    gc.disable()
    with generated_session_file(args.events, args.seed) as (_, file):
        fold_events(file.events, file.header).projections.materialize()  # warm-up
        for _ in range(args.folds):
            fold_events(file.events, file.header).projections.materialize()


if __name__ == "__main__":
    main()
