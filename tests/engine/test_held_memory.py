"""Memory per held session (BENCHMARKS figure 6) stays under a stated bound.

Issues 12-13 added ~11 KB per held session (+56%) and nobody noticed: the
figure is only measured by the bench.  This test folds short sessions the
way the Processor holds them (decoded afresh from their records, folded,
one commit's output, every runtime kept alive) and counts the bytes with
tracemalloc, which counts allocations, not time or RSS: the same code
gives the same count on a loaded box.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from bench.engine_icount import hold_sessions
from bench.held_fit import traced
from processor.codec import default_codec
from processor.config import ServiceConfig
from processor.core.builtin import default_registry
from processor.core.defaults import default_message_projections
from processor.engine.runtime import SessionRuntime
from processor.workload import generate_session

SESSIONS = 200
EVENTS = 12
#: Traced bytes per held session of these logs.  Measured 18,969 on the pure
#: build and 19,225 compiled (Python 3.11, the same on every run) after helper
#: mem2's cuts; 22,754 / 23,002 before them (main at be50658), 27,881 (pure)
#: at 623a8c7.  The margin (3% over the compiled figure) allows small honest
#: growth; a new per-session structure of ~0.6 KB (a second index, an empty
#: container in every session) fails it.  Raise it only with the reason
#: written in bench/lab/history/6-memory.md.  Raised from 19,800 for the
#: runtime's goal and tokenUsage units (issue 36): 20,411 pure.
BOUND = 21_100


def _traced_per_session(hold: Callable[[], object]) -> float:
    """Traced bytes that ``hold()`` leaves allocated (after a full collection),
    per session; ``hold``'s result is kept alive until counted."""
    size, _ = traced(hold)
    return size / SESSIONS


def _held_bytes_per_session() -> float:
    codec = default_codec()
    cfg = ServiceConfig()
    logs = [
        [codec.encode_parsed_event(f"m-{i}", e) for e in generate_session(random.Random(i), EVENTS)]
        for i in range(SESSIONS)
    ]
    registry = default_registry()
    message_projections = default_message_projections()

    def hold() -> list[SessionRuntime]:
        held = hold_sessions(logs, "m", cfg, codec, registry, message_projections)
        assert len(held) == SESSIONS
        return held

    return _traced_per_session(hold)


def _check(what: str, per_session: float, bound: int) -> None:
    assert per_session <= bound, (
        f"{what} takes {per_session:,.0f} traced bytes, "
        f"over the bound of {bound:,} (BENCHMARKS.md figure 6)"
    )


def test_a_held_session_stays_under_its_memory_bound() -> None:
    _check(f"a held {EVENTS}-event session", _held_bytes_per_session(), BOUND)


#: The same for a session loaded from its checkpoint (``Engine.runtime`` on a
#: partition restored through ``latest_checkpoints``, as after a rebalance or
#: an eviction).  Measured 20,418 pure / 20,427 compiled after helper mem2's
#: cuts; 30,816 / 30,825 on main at be50658; +3.1 KB when a restored unit slot
#: keeps the decoded copy of its part's value beside the cell's, +1.9 KB when
#: the restored names are not interned.  19,573 pure after helper rst's
#: restore-side sharing (projection rows reuse the surface's frozen blocks);
#: 3% over it, so the 20,418 before fails.  21,409 pure with the runtime's
#: goal and tokenUsage units (issue 36), bound 3% over it.
RESTORED_BOUND = 22_050


def _restored_bytes_per_session() -> float:
    from processor.engine.checkpoints import latest_checkpoints
    from tests.engine.kit import CODEC, CONFIG, Harness

    h = Harness()
    for i in range(SESSIONS):
        h.fold_events(f"m-{i:05d}", generate_session(random.Random(i), EVENTS))
    h.commit()
    records = [(o.key, o.value) for o in h.topic(CONFIG.topics.checkpoints)]
    restored = Harness()
    part = restored.engine.partitions[0]

    def hold() -> None:
        # decoded within the count: what a loaded session keeps of its
        # checkpoint counts, the rest is freed as each session loads
        part.checkpoints.update(latest_checkpoints(CODEC, records).checkpoints)
        for i in range(SESSIONS):
            restored.engine.runtime(part, f"m-{i:05d}")
        assert restored.engine.sessions_held() == SESSIONS and not part.checkpoints

    return _traced_per_session(hold)


def test_a_session_loaded_from_its_checkpoint_stays_under_its_memory_bound() -> None:
    what = f"a {EVENTS}-event session loaded from its checkpoint"
    _check(what, _restored_bytes_per_session(), RESTORED_BOUND)


#: The budget's estimate of a held session (``processor/engine/held.py``)
#: against the bytes the session leaves allocated through the engine
#: (``bench/held_fit.py``), on shapes it was fitted to: fresh short and
#: long sessions, big tool results, scripted agent runs, loaded from a
#: checkpoint, loaded and folded further.  Never under (the budget would let
#: memory grow past it), at most ``ESTIMATE_MARGIN`` over on fresh sessions
#: and ``LOADED_MARGIN`` on loaded ones (sessions evicted before the budget
#: is used; loaded walker and scripted sessions share one per-event
#: constant, so the walker's are further over).  Fitted at 1.03-1.43 x on
#: these shapes.  The constants of stop 26 were 0.80 x on the loaded
#: scripted 30-event run (fitted to walker shapes only); those before them
#: 1.53 x on the 12-event session and 0.56 x on the loaded 60-event one.
#: A session that grows by 3% fails the lower bound: refit held.py
#: (``python -m bench.held_fit``, pure and compiled) with it.
ESTIMATE_MARGIN = 0.25
LOADED_MARGIN = 0.5


def test_the_held_estimate_bounds_what_sessions_hold() -> None:
    from bench.held_fit import SHAPES, measure

    wanted = (
        "walker 12",
        "walker 60",
        "big results 12",
        "scripted 30",
        "loaded 60",
        "loaded + 6 18",
        "loaded scripted 30",
    )
    shapes = [s for s in SHAPES if f"{s.name} {s.events}" in wanted]
    assert len(shapes) == len(wanted)
    off = []
    for shape in shapes:
        m = measure(shape)
        ratio = m["estimate"] / m["traced"]
        margin = LOADED_MARGIN if shape.loaded else ESTIMATE_MARGIN
        if not 1.0 <= ratio <= 1.0 + margin:
            off.append(f"{m['shape']}: estimate {m['estimate']:,.0f}, traced {m['traced']:,.0f}")
    assert not off, "held.py's estimate is off: " + "; ".join(off)
