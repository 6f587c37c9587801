"""The held-session estimate (``processor/engine/held.py``) against what sessions hold.

Per shape (a session log generator and a length; folded fresh, or loaded
from its checkpoint and then folded some more), ``SESSIONS`` sessions go
through an :class:`~processor.engine.Engine` as the service drives it: each
record folded, one commit's output built and dropped, the batch reset.  The
bytes they leave allocated are counted with tracemalloc (deterministic: the
same code gives the same count on a loaded box) and compared with the
engine's own estimate (``engine.held.bytes``).  A loaded session comes from
a checkpoint source that serves the records of a first engine's output, with
their encoded size, as the local store does.

``python -m bench.held_fit`` prints one JSON line per shape: traced bytes,
the estimate, and the encoded bytes the estimate is computed from (event
values, checkpoint records), the data the constants in ``held.py`` are
fitted to.  Run it in the pure checkout and in the compiled venv.
"""

from __future__ import annotations

import gc
import json
import random
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from processor.codec import Checkpoint, default_codec
from processor.config import ServiceConfig
from processor.core.builtin import default_registry
from processor.core.defaults import default_message_projections
from processor.core.events import Event
from processor.engine import Batch, Engine, PartitionState, Record
from processor.engine.checkpoints import latest_checkpoints
from processor.workload import generate_session

SESSIONS = 100
CODEC = default_codec()
CONFIG = ServiceConfig()


@dataclass(frozen=True)
class Shape:
    """``events`` folded fresh; with ``loaded``, ``loaded`` of them folded by a
    first engine, and the new owner loads the checkpoint and folds the rest."""

    name: str
    events: int
    loaded: int = 0
    big_ratio: float = 0.02
    words: bool = False
    #: the scripted agent runs (half of the bench's workload) instead of the walker
    scripted: bool = False


SHAPES = (
    Shape("short", 4),
    Shape("walker", 12),
    Shape("walker", 30),
    Shape("walker", 60),
    Shape("walker", 120),
    Shape("big results", 12, big_ratio=0.3, words=True),
    Shape("loaded", 4, loaded=4),
    Shape("loaded", 12, loaded=12),
    Shape("loaded", 30, loaded=30),
    Shape("loaded", 60, loaded=60),
    Shape("loaded", 120, loaded=120),
    Shape("loaded big results", 12, loaded=12, big_ratio=0.3, words=True),
    Shape("loaded + 6", 18, loaded=12),
    Shape("loaded + 12", 72, loaded=60),
    Shape("scripted", 12, scripted=True),
    Shape("scripted", 30, scripted=True),
    Shape("loaded scripted", 12, loaded=12, scripted=True),
    Shape("loaded scripted", 30, loaded=30, scripted=True),
    Shape("loaded scripted", 60, loaded=60, scripted=True),
    Shape("loaded scripted + 6", 18, loaded=12, scripted=True),
)


def _logs(shape: Shape) -> list[list[Event]]:
    if shape.scripted:
        from bench.workload import scripted_log

        return [scripted_log(1_000 + i, shape.events) for i in range(SESSIONS)]
    return [
        generate_session(
            random.Random(1_000 + i), shape.events, big_ratio=shape.big_ratio, words=shape.words
        )
        for i in range(SESSIONS)
    ]


def _engine(source: Any = None) -> tuple[Engine, PartitionState]:
    engine = Engine(CONFIG, CODEC, default_registry(), default_message_projections())
    part = engine.partitions[0] = PartitionState(0, source=source)
    return engine, part


class _Source:
    """A checkpoint source over output records (the local store's ``load``)."""

    def __init__(self, records: dict[str, list[tuple[bytes | None, bytes | None]]]) -> None:
        self.records = records

    def load(self, partition: int, session_id: str) -> tuple[Checkpoint | None, int]:
        found = self.records.pop(session_id, [])
        cp = latest_checkpoints(CODEC, found).checkpoints.get(session_id)
        return cp, sum(len(v or b"") for _, v in found)


def _values(logs: list[list[Event]], lo: int, hi: int) -> Iterator[tuple[str, list[bytes]]]:
    for i, log in enumerate(logs):
        sid = f"h-{i:05d}"
        yield sid, [CODEC.encode_parsed_event(sid, e) for e in log[lo:hi]]


def _fold_commit(
    engine: Engine, part: PartitionState, values: list[tuple[str, list[bytes]]]
) -> Any:
    """Fold every record, build one commit's output; the checkpoint records."""
    offset = 0
    for sid, vals in values:
        for value in vals:
            engine.fold(part, Record(CONFIG.topics.events, 0, offset, sid.encode(), value, 0))
            offset += 1
    cps: dict[str, list[tuple[bytes | None, bytes | None]]] = {}
    for out in engine.output():
        if out.topic == CONFIG.topics.checkpoints and out.key is not None:
            sid = out.key.lstrip(b"\xff").split(b"\x00")[0].decode()
            cps.setdefault(sid, []).append((out.key, out.value))
    engine.batch = Batch()
    return cps


def traced(run: Callable[[], Any], rss: bool = False) -> tuple[int, Any]:
    """Bytes ``run()`` leaves allocated (after a full collection), and its result;
    ``rss``: the growth of the resident set instead (allocator overhead included)."""
    gc.collect()
    if rss:
        from bench.common import rss_bytes

        start = rss_bytes()
        kept = run()
        gc.collect()
        return rss_bytes() - start, kept
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = run()
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return after - before, kept


def measure(shape: Shape, rss: bool = False) -> dict[str, Any]:
    """Per session: traced bytes, the engine's estimate, the encoded bytes."""
    logs = _logs(shape)
    cp_bytes = 0
    source = None
    if shape.loaded:
        first, part1 = _engine()
        records = _fold_commit(first, part1, list(_values(logs, 0, shape.loaded)))
        cp_bytes = sum(len(v or b"") for recs in records.values() for _, v in recs)
        source = _Source(records)
    engine, part = _engine(source)
    values = list(_values(logs, shape.loaded, shape.events))
    if not values[0][1]:  # loaded only: a reader's lookup
        values = []

        def run() -> Engine:
            for i in range(SESSIONS):
                engine.lookup(part, f"h-{i:05d}")
            return engine
    else:

        def run() -> Engine:
            _fold_commit(engine, part, values)
            return engine

    size, _ = traced(run, rss)
    assert engine.sessions_held() == SESSIONS
    event_bytes = sum(len(v) for _, vals in values for v in vals)
    return {
        "shape": f"{shape.name} {shape.events}",
        "rss" if rss else "traced": size / SESSIONS,
        "estimate": engine.held.bytes / SESSIONS,
        "event_bytes": event_bytes / SESSIONS,
        "checkpoint_bytes": cp_bytes / SESSIONS,
        "events": sum(rt.last_seq + 1 for rt in part.sessions.values()) / SESSIONS,
    }


def main() -> None:
    """``--rss N I``: the RSS growth of N sessions of ``SHAPES[I]`` instead (one
    shape per process: freed arenas of an earlier shape would hide growth)."""
    import sys

    from bench.build import running_build

    global SESSIONS
    rss = len(sys.argv) > 2 and sys.argv[1] == "--rss"
    if rss:
        SESSIONS = int(sys.argv[2])
    for shape in (SHAPES[int(sys.argv[3])],) if rss else SHAPES:
        print(json.dumps({"build": running_build(), **measure(shape, rss)}), flush=True)


if __name__ == "__main__":
    main()
