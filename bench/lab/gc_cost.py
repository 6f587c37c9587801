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

    python -m bench.lab.gc_cost --sessions 10000,100000
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.common import run_child_json

HELD_EVENTS = 12
POOL = 300


def _logs(count: int, length: int, seed: int) -> list[list[bytes]]:
    from processor.workload import generate_session

    return [
        [e.to_bytes() for e in generate_session(random.Random(seed + i), length)]
        for i in range(count)
    ]


def _folder() -> Callable[[str, list[bytes]], Any]:
    """A fresh session folded from event lines (parsed afresh: no shared objects)."""
    from processor.core.builtin import default_registry
    from processor.core.defaults import default_message_projections
    from processor.core.events import parse_event_bytes
    from processor.core.session import Session, synthetic_header

    registry, mp = default_registry(), default_message_projections()

    def fold(sid: str, lines: list[bytes]) -> Session:
        session = Session(synthetic_header(sid), message_projections=mp, projections=registry)
        for line in lines:
            session.append(parse_event_bytes(line))
        return session

    return fold


class _Pauses:
    """The collector's pauses per generation, timed by ``gc.callbacks`` while on."""

    def __init__(self) -> None:
        self.by_gen: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self._started = 0.0

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.by_gen[info["generation"]].append(time.perf_counter() - self._started)

    def on(self) -> None:
        gc.callbacks.append(self._on_gc)

    def off(self) -> None:
        gc.callbacks.remove(self._on_gc)

    def clear(self) -> None:
        for v in self.by_gen.values():
            v.clear()

    @property
    def total_s(self) -> float:
        return sum(sum(v) for v in self.by_gen.values())

    @property
    def counts(self) -> dict[int, int]:
        return {g: len(v) for g, v in self.by_gen.items()}

    @property
    def max_s(self) -> float:
        return max((max(v) for v in self.by_gen.values() if v), default=0.0)


def child(n: int, freeze: bool) -> dict[str, Any]:
    gc.set_threshold(50_000, 20, 100)  # as the `processor` command does
    fold = _folder()
    pool = _logs(POOL, HELD_EVENTS, 41)
    hot = _logs(1000, 60, 97)
    t0 = time.perf_counter()
    held = [fold(f"held-{i}", pool[i % POOL]) for i in range(n)]
    build_s = time.perf_counter() - t0
    gc.collect()
    if freeze:
        gc.freeze()
    pauses = _Pauses()
    pauses.on()
    t0 = time.perf_counter()
    gc.collect()
    full_collect_s = time.perf_counter() - t0
    pauses.clear()
    t0 = time.perf_counter()
    hot_sessions = [fold(f"hot-{i}", lines) for i, lines in enumerate(hot)]
    hot_s = time.perf_counter() - t0
    pauses.off()
    in_gc = pauses.total_s
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
        "hot_collections": pauses.counts,
        "hot_max_pause_s": round(pauses.max_s, 4),
        "held": len(held),
        "hot_sessions": len(hot_sessions),
    }


class _Cycle:
    """Cyclic garbage stand-in (a client object, an exception with its frames)."""

    __slots__ = ("__weakref__", "me")

    def __init__(self) -> None:
        self.me = self


def settle_young() -> None:
    """The compared policy: collect the young generations, then freeze what survived.

    Cheap (one young collection, nothing walks the frozen heap), but a cycle
    still reachable at the commit and dead later is never reclaimed; the
    service uses ``processor/service/loop/heap.py`` instead, which has no such leak.
    """
    gc.collect(1)
    gc.freeze()


def steady(n: int, policy: str, batches: int, batch_events: int) -> dict[str, Any]:
    """The service's steady state: held sessions keep growing, one commit per batch.

    ``n`` sessions are folded and settled (``settle_heap``, as after an
    assignment); then ``batches`` batches of ``batch_events`` new events go
    to random held sessions, each batch also making cyclic garbage (half
    dies within the batch, half outlives one commit), and the policy runs
    after each commit:

    - ``load``: nothing more (the runner today: ``settle_heap`` at assignment);
    - ``commit``: :func:`settle_young` after every commit;
    - ``gen2off``: third threshold 2**30, i.e. no automatic full collection.

    Reported: the automatic collections and the time in them, the longest
    pause, what a full collection would cost at the end (the pause the
    ``load`` policy eventually pays, growing with the unfrozen heap), and
    the cyclic garbage never reclaimed (frozen while still reachable).
    """
    import weakref

    from processor.core.events import parse_event_bytes
    from processor.gcpolicy import settle_heap

    gc.set_threshold(50_000, 20, 2**30 if policy == "gen2off" else 100)
    fold = _folder()
    pool = _logs(POOL, HELD_EVENTS + 400, 41)
    held = [fold(f"held-{i}", pool[i % POOL][:HELD_EVENTS]) for i in range(n)]
    settle_heap()
    pauses = _Pauses()
    rng = random.Random(5)
    markers: weakref.WeakSet[_Cycle] = weakref.WeakSet()
    carried: list[_Cycle] = []
    policy_s = 0.0
    pauses.on()
    t0 = time.perf_counter()
    events = 0
    for _ in range(batches):
        young = [_Cycle() for _ in range(20)]
        markers.update(young)
        older = carried
        carried = [_Cycle() for _ in range(20)]  # outlives this commit
        markers.update(carried)
        for _ in range(batch_events):
            session = held[rng.randrange(n)]
            nxt = session.next_seq
            line = pool[int(session.header["id"].split("-")[1]) % POOL][nxt % len(pool[0])]
            if nxt >= len(pool[0]):
                continue  # this session's log is used up
            session.append(parse_event_bytes(line))
            events += 1
        del young, older
        p0 = time.perf_counter()
        if policy == "commit":
            pauses.off()  # its own collection is counted as policy time
            settle_young()
            pauses.on()
        policy_s += time.perf_counter() - p0
    hot_s = time.perf_counter() - t0
    pauses.off()
    del carried
    t1 = time.perf_counter()
    gc.collect()
    final_full_s = time.perf_counter() - t1
    in_gc = pauses.total_s
    return {
        "sessions": n,
        "policy": policy,
        "batches": batches,
        "hot_events": events,
        "hot_s": round(hot_s, 3),
        "auto_collections": pauses.counts,
        "auto_gc_s": round(in_gc, 4),
        "auto_max_pause_s": round(pauses.max_s, 4),
        "policy_s": round(policy_s, 4),
        "policy_per_commit_ms": round(1000 * policy_s / batches, 3),
        "gc_share": round((in_gc + policy_s) / hot_s, 4),
        "full_collection_at_end_s": round(final_full_s, 4),
        "frozen": gc.get_freeze_count(),
        "cycles_made": 40 * batches,
        "cycles_never_reclaimed": len(markers),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", default="10000,100000")
    ap.add_argument("--child", type=int, default=None)
    ap.add_argument("--freeze", action="store_true")
    ap.add_argument(
        "--steady",
        action="store_true",
        help="steady state with a commit per batch; compare --policies",
    )
    ap.add_argument("--policies", default="load,commit,gen2off")
    ap.add_argument("--policy", default=None)
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--batch-events", type=int, default=1000)
    args = ap.parse_args(argv)
    if args.child is not None and args.policy is not None:
        print(json.dumps(steady(args.child, args.policy, args.batches, args.batch_events)))
        return
    if args.child is not None:
        print(json.dumps(child(args.child, args.freeze)))
        return
    if args.steady:
        for n in (int(x) for x in args.sessions.split(",")):
            for policy in args.policies.split(","):
                argv_c = [
                    sys.executable,
                    "-m",
                    "bench.lab.gc_cost",
                    "--child",
                    str(n),
                    "--policy",
                    policy,
                    "--batches",
                    str(args.batches),
                    "--batch-events",
                    str(args.batch_events),
                ]
                print(json.dumps(run_child_json(argv_c, f"gc_cost {n} {policy}")), flush=True)
        return
    for n in (int(x) for x in args.sessions.split(",")):
        for freeze in (False, True):
            argv_c = [sys.executable, "-m", "bench.lab.gc_cost", "--child", str(n)]
            argv_c += ["--freeze"] if freeze else []
            print(json.dumps(run_child_json(argv_c, f"gc_cost {n}")), flush=True)


if __name__ == "__main__":
    main()
