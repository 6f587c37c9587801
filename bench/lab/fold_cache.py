"""Instructions and simulated cache misses per event: the whole fold against the envelope.

``bench.lab.fold_icount`` counts the fold of already parsed events; this one runs
what ``bench.fold_speed`` times: ``fold`` is ``read_session_file`` +
``fold_events`` + ``session_output`` (the kept events freed at the end),
``env`` the envelope baseline (orjson + ``parse_event`` per line, each event
dropped).  One warm run, then ``--runs`` more; the process leaves with
``os._exit`` so the interpreter's own teardown is not counted.  Run it under
cachegrind with ``--runs 0`` and ``--runs 2`` and divide the difference by
``2 x --events`` (history/core-fold.md)::

    PYTHONHASHSEED=0 valgrind --tool=cachegrind --cache-sim=yes \\
        --LL=8388608,16,64 python3.11 -m bench.lab.fold_cache fold --runs 2

(an explicit 8 MiB last-level cache: this VM reports a 256 MiB one, and the
simulation of that shows no misses).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Callable
from pathlib import Path

import orjson

from bench.common import generated_session_file
from processor.core.events import parse_event
from processor.files import iter_lines, read_bytes, read_session_file
from processor.offline import fold_events, session_output


def _fold(path: Path) -> None:
    file = read_session_file(path)
    session_output(fold_events(file.events, file.header))


def _envelope(path: Path) -> None:
    for _, line, _ in iter_lines(read_bytes(path)):
        parse_event(orjson.loads(line), trusted_json=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("fold", "env"))
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    gc.set_threshold(50_000, 20, 100)  # as the `processor` command does
    run: Callable[[Path], None] = _fold if args.mode == "fold" else _envelope
    with generated_session_file(args.events, args.seed) as (path, _file):
        for _ in range(args.runs + 1):
            run(path)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
