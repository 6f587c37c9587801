"""Restore CPU per session and traced bytes held per restored session (core level).

Scripted sessions (``scripted_sessions``, seed 42) are folded and each
checkpoint encoded to JSON; then every session is restored from its JSON
(``orjson.loads`` + ``Session.from_checkpoint``, which indexes the surface for
the rows' sharing, ``restore_share.py``).  CPU: best of ``--passes`` passes
over all sessions.  Bytes: tracemalloc of all restored sessions kept alive
(allocations, not time: the same count on a loaded box).  ``--no-trace``
skips the traced pass, for instruction counts under cachegrind (run with
``--passes`` 1 and 3 and divide the difference by 2 x sessions).

    python -m bench.lab.restore_cpu --sessions 1000 --passes 5
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import tracemalloc

import orjson

import processor.core.restore_share as restore_share
from processor.core.session import Session
from processor.examples.make_example import scripted_sessions
from processor.offline import fold_events


def _restore_all(checkpoints: list[bytes]) -> list[Session]:
    return [Session.from_checkpoint(orjson.loads(b)) for b in checkpoints]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--no-trace", action="store_true")
    args = parser.parse_args()
    checkpoints = [
        orjson.dumps(fold_events(events).checkpoint())
        for _, events in scripted_sessions(args.sessions, turns=args.turns)
    ]
    best = float("inf")
    for _ in range(args.passes):
        gc.collect()
        c0 = time.process_time()
        held = _restore_all(checkpoints)
        best = min(best, time.process_time() - c0)
        del held
    result: dict[str, object] = {
        "benchmark": "restore_cpu",
        "restore_share": "pure" if restore_share.__file__.endswith(".py") else "compiled",
        "sessions": args.sessions,
        "checkpoint_json_bytes_per_session": round(sum(map(len, checkpoints)) / args.sessions),
        "restore_cpu_us_per_session_best": round(best / args.sessions * 1e6, 1),
    }
    if not args.no_trace:
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        held = _restore_all(checkpoints)
        gc.collect()
        size = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        result["held_traced_bytes_per_session"] = round(size / len(held))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
