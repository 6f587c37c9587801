"""Instructions per event on the engine path, for a box too loaded for CPU times.

What a held session costs per event: decode, fold, one commit's output (the
hold loop of tests/engine/test_held_memory.py, without tracemalloc).  Runs
one warm-up round of ``--sessions`` x ``--events``, then ``--rounds`` more;
under cachegrind take ``--rounds 4`` minus ``--rounds 0`` and divide by
``4 x sessions x events``.  Totals move ~0.3% run to run::

    PYTHONHASHSEED=0 valgrind --tool=cachegrind --cache-sim=no \\
        --cachegrind-out-file=/dev/null python3.11 -m bench.engine_icount --rounds 4
"""

from __future__ import annotations

import argparse
import gc
import random

from processor.codec import Codec, default_codec
from processor.config import ServiceConfig
from processor.core.builtin import default_registry
from processor.core.defaults import default_message_projections
from processor.core.message_projections import MessageProjectionRegistry
from processor.core.projection_registry import ProjectionRegistry
from processor.core.session import Session, synthetic_header
from processor.engine.output import session_output
from processor.engine.records import Tally
from processor.engine.runtime import SessionRuntime
from processor.workload import generate_session


def hold_sessions(
    logs: list[list[bytes]],
    prefix: str,
    cfg: ServiceConfig,
    codec: Codec,
    registry: ProjectionRegistry,
    message_projections: MessageProjectionRegistry,
) -> list[SessionRuntime]:
    """Each log (Avro event values) as the service holds a session after one
    commit: decoded, folded, its output built, its log trimmed."""
    held: list[SessionRuntime] = []
    for i, values in enumerate(logs):
        sid = f"{prefix}-{i:05d}"
        session = Session(
            synthetic_header(sid), message_projections=message_projections, projections=registry
        )
        rt = SessionRuntime(sid, i % 12, session, window=cfg.duplicate_window)
        for offset, value in enumerate(values):
            event = codec.decode_event(value).to_event()
            session.append(event)
            rt.record_applied(event, offset)
            session.log.trim_before(event.seq + 1)
        for _ in session_output(rt, rt.view_changes(), {}, config=cfg, codec=codec, tally=Tally()):
            pass
        held.append(rt)
    return held


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--sessions", type=int, default=100)
    ap.add_argument("--events", type=int, default=12)
    args = ap.parse_args(argv)
    gc.disable()
    codec = default_codec()
    cfg = ServiceConfig()
    logs = [
        [
            codec.encode_parsed_event(f"m-{i}", e)
            for e in generate_session(random.Random(i), args.events)
        ]
        for i in range(args.sessions)
    ]
    registry = default_registry()
    message_projections = default_message_projections()

    def hold(tag: int) -> list[SessionRuntime]:
        return hold_sessions(logs, f"m-{tag}", cfg, codec, registry, message_projections)

    hold(-1)  # warm-up
    for tag in range(args.rounds):
        hold(tag)


if __name__ == "__main__":
    main()
