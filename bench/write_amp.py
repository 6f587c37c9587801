"""Write amplification (issue 12): bytes written to checkpoints + views per byte of events.

Long sessions paced like live agents: ``--sessions`` sessions of ``--events``
generated events each (every tool result ``--result-bytes`` of pseudo-random
words, the agent compacting at ``--context`` surface nodes), one event per
session per second.  With the service's 200 ms commit interval every
transaction then holds at most one event of each session, so the bench runs
the broker-less engine (``processor.engine.Engine``, the code the Kafka loop
drives) with exactly that batching: the sessions interleaved, one event of
each per batch, every batch turned into its transaction's records.

Counted per topic: records, key + value bytes (a tombstone counts its key),
and the same records compressed per batch and topic as the producer does
(``compression.type=lz4``: the batch's keys and values concatenated, one
lz4 frame; zstd when the ``lz4`` module is missing, named in the result).
Events count as their encoded records (key + value), compressed per batch
alike.  The figure is cumulative at 100 and at N events per session, their
quotient (flat in session length), and the marginal cost of the last 100
events (the steady state of a long session).

``python -m bench.write_amp`` runs it alone (no broker needed) and writes
``bench/results/write_amp.json``; ``python -m bench --only write_amp`` runs
it in the suite (which starts a broker for the others).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.common import RESULTS, Context, git_revision, result, write_result
from processor.codec import default_codec
from processor.config import ServiceConfig
from processor.core.builtin import default_registry
from processor.core.defaults import default_message_projections
from processor.core.events import Event
from processor.engine import Engine, Fate, Out, PartitionState, Record
from processor.workload import generate_session

SESSIONS = 4
EVENTS = 5_000
RESULT_BYTES = 10_000
CONTEXT = 200
FIRST = 100  # the short-session point of the "flat in session length" quotient
TAIL = 100  # the steady state: what the last this-many events cost alone
TARGET_RATIO = 2.0
TARGET_FLAT = 1.5
#: The figure as measured before the parted format (the report's "before" column).
BEFORE = RESULTS / "write_amp_before.json"


def compressor() -> tuple[str, Callable[[bytes], bytes]]:
    """The producer's codec (lz4 frame), or zstd when lz4 is not installed."""
    try:
        import lz4.frame

        return "lz4", lz4.frame.compress
    except ImportError:
        import zstandard

        z = zstandard.ZstdCompressor(level=3)
        return "zstd (lz4 module missing)", z.compress


@dataclass
class TopicBytes:
    records: int = 0
    raw: int = 0
    compressed: int = 0


@dataclass
class Point:
    """Cumulative counts once every session has ``events`` events folded."""

    events: int
    topics: dict[str, TopicBytes] = field(default_factory=dict)
    max_nodes: int = 0  # the largest surface any session had so far

    def amp(self, compressed: bool = False) -> float:
        return _amp(self.topics, compressed)


def _amp(topics: dict[str, TopicBytes], compressed: bool) -> float:
    def size(t: str) -> int:
        tb = topics.get(t, TopicBytes())
        return tb.compressed if compressed else tb.raw

    return (size("checkpoints") + size("views")) / max(size("events"), 1)


def _delta(a: Point, b: Point) -> dict[str, TopicBytes]:
    """What was written between ``a`` and ``b`` (b later)."""
    out = {}
    for name, tb in b.topics.items():
        old = a.topics.get(name, TopicBytes())
        out[name] = TopicBytes(
            tb.records - old.records, tb.raw - old.raw, tb.compressed - old.compressed
        )
    return out


def session_logs(
    sessions: int, events: int, result_bytes: int, context: int, seed: int = 12
) -> dict[str, list[Event]]:
    """Long agent sessions: every tool result big, made of words; compaction at ``context``."""
    return {
        f"long-{i:02d}": generate_session(
            random.Random(seed + i),
            events,
            big_result_bytes=result_bytes,
            big_ratio=1.0,
            words=True,
            context_budget=context,
        )
        for i in range(sessions)
    }


class _Counter:
    """Per topic: records, key + value bytes, and bytes compressed per batch."""

    def __init__(self, compress: Callable[[bytes], bytes], names: dict[str, str]) -> None:
        self.compress = compress
        self.names = names  # topic -> short name
        self.topics: dict[str, TopicBytes] = {}

    def batch(self, records: Sequence[tuple[str, bytes | None, bytes | None]]) -> None:
        chunks: dict[str, list[bytes]] = {}
        for topic, key, value in records:
            name = self.names.get(topic, topic)
            tb = self.topics.setdefault(name, TopicBytes())
            tb.records += 1
            body = (key or b"") + (value or b"")
            tb.raw += len(body)
            chunks.setdefault(name, []).append(body)
        for name, parts in chunks.items():
            self.topics[name].compressed += len(self.compress(b"".join(parts)))

    def point(self, events: int) -> Point:
        return Point(
            events, {k: TopicBytes(v.records, v.raw, v.compressed) for k, v in self.topics.items()}
        )


def simulate(
    logs: dict[str, list[Event]],
    marks: Sequence[int],
    *,
    compress: Callable[[bytes], bytes],
    config: ServiceConfig | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[Point]:
    """Fold ``logs`` one event per session per batch; the counts at each mark.

    Every produced record is counted and dropped at once (a 5,000-event
    session writes gigabytes in today's format: nothing is kept).
    """
    config = config or ServiceConfig()
    codec = default_codec()
    engine = Engine(
        config, codec, default_registry(), default_message_projections(), instance_id="bench"
    )
    part = PartitionState(0, {})
    engine.partitions[0] = part
    topics = config.topics
    counter = _Counter(
        compress,
        {topics.events: "events", topics.checkpoints: "checkpoints", topics.views: "views"},
    )
    length = max(len(log) for log in logs.values())
    wanted = sorted(set(marks))
    points: list[Point] = []
    offset = 0
    max_nodes = 0
    for i in range(length):
        events: list[tuple[str, bytes | None, bytes | None]] = []
        for sid, log in logs.items():
            if i >= len(log):
                continue
            key, value = sid.encode(), codec.encode_parsed_event(sid, log[i])
            events.append((topics.events, key, value))
            rec = Record(topics.events, 0, offset, key, value, 1_000 + offset)
            offset += 1
            outcome = engine.fold(part, rec)
            if outcome.fate is not Fate.APPLIED:
                raise RuntimeError(f"{sid} seq {log[i].seq}: {outcome.rule} {outcome.reason}")
        counter.batch(events)
        out: list[Out] = list(engine.output())
        engine.close_batch()
        counter.batch([(o.topic, o.key, o.value) for o in out])
        for rt in part.sessions.values():
            max_nodes = max(max_nodes, len(rt.session.surface_view()["nodes"]))
        if wanted and i + 1 == wanted[0]:
            point = counter.point(wanted.pop(0))
            point.max_nodes = max_nodes
            points.append(point)
        if progress is not None:
            progress(i + 1)
    if wanted:
        raise ValueError(f"marks {wanted} beyond the logs' length {length}")
    return points


def measure(
    sessions: int = SESSIONS,
    events: int = EVENTS,
    result_bytes: int = RESULT_BYTES,
    context: int = CONTEXT,
    *,
    verbose: bool = False,
) -> dict[str, Any]:
    """The figure's numbers (a plain dict, see :func:`figure`)."""
    codec_name, compress = compressor()
    t0 = time.perf_counter()
    logs = session_logs(sessions, events, result_bytes, context)
    generated = time.perf_counter() - t0
    first_mark, tail_mark = min(FIRST, events), max(events - TAIL, 0)
    marks = sorted({first_mark, tail_mark, events} - {0})

    def progress(i: int) -> None:
        if verbose and i % 250 == 0:
            print(f"[write_amp] {i}/{events} events per session", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    points = {p.events: p for p in simulate(logs, marks, compress=compress, progress=progress)}
    simulated = time.perf_counter() - t0
    first, last = points[first_mark], points[events]
    before_last = points.get(tail_mark, Point(0))
    tail = _delta(before_last, last)
    return {
        "sessions": sessions,
        "events": events,
        "result_bytes": result_bytes,
        "context": context,
        "compression": codec_name,
        "seconds": {"generate": round(generated, 1), "simulate": round(simulated, 1)},
        "points": {
            str(n): {k: vars(v) for k, v in sorted(p.topics.items())} for n, p in points.items()
        },
        "amp": {
            "first": round(first.amp(), 3),
            "last": round(last.amp(), 3),
            "tail": round(_amp(tail, False), 3),
            "first_compressed": round(first.amp(True), 3),
            "last_compressed": round(last.amp(True), 3),
            "tail_compressed": round(_amp(tail, True), 3),
        },
        "first_events": first.events,
        "tail_events": last.events - before_last.events,
        "surface_nodes": last.max_nodes,
    }


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def figure(ctx: Context, m: dict[str, Any]) -> dict[str, Any]:
    """The suite's result document of :func:`measure`'s numbers."""
    a = m["amp"]
    n, f = m["events"], m["first_events"]
    flat = a["last"] / a["first"] if a["first"] else float("inf")
    flat_c = a["last_compressed"] / a["first_compressed"] if a["first_compressed"] else 0.0
    last = m["points"][str(n)]
    rows: list[list[str]] = []
    for name in ("events", "checkpoints", "views"):
        tb = last.get(name, {"records": 0, "raw": 0, "compressed": 0})
        rows.append(
            [
                f"{name} after {n:,} events per session",
                f"{tb['records']:,} records, {_mb(tb['raw'])} "
                f"({_mb(tb['compressed'])} {m['compression']})",
            ]
        )
    rows += [
        [f"ratio at {f} events (key+value)", f"{a['first']:,.3f}"],
        [f"ratio at {n:,} events (key+value)", f"{a['last']:,.3f}"],
        [f"ratio at {n:,} / ratio at {f}", f"{flat:,.3f}"],
        [f"ratio of the last {m['tail_events']} events alone", f"{a['tail']:,.3f}"],
        [f"{m['compression']}: ratio at {f} events", f"{a['first_compressed']:,.3f}"],
        [f"{m['compression']}: ratio at {n:,} events", f"{a['last_compressed']:,.3f}"],
        [f"{m['compression']}: at {n:,} / at {f}", f"{flat_c:,.3f}"],
        [
            f"{m['compression']}: the last {m['tail_events']} events alone",
            f"{a['tail_compressed']:,.3f}",
        ],
        ["largest surface (nodes)", str(m["surface_nodes"])],
        [
            "exact command",
            f"python -m bench.write_amp --sessions {m['sessions']} --events {n} "
            f"--result-bytes {m['result_bytes']} --context {m['context']}",
        ],
    ]
    return result(
        ctx,
        "write_amp",
        "Write amplification: checkpoints + views bytes per event byte (issue 12)",
        workload=f"{m['sessions']} sessions x {n:,} generated events, every tool result "
        f"{m['result_bytes']:,} B of words, compaction at {m['context']} surface nodes; one "
        "event per session per transaction (1 event/s at a 200 ms commit interval), "
        "broker-less engine",
        value={
            "label": f"(checkpoints + views) / events at {n:,} events",
            "unit": "bytes/byte",
            "median": a["last"],
            "min": a["last"],
            "max": a["last"],
            "samples": [a["last"]],
        },
        baseline={
            "label": f"the same at {f} events",
            "unit": "bytes/byte",
            "median": a["first"],
            "min": a["first"],
            "max": a["first"],
            "samples": [a["first"]],
        },
        ratio={
            "label": f"at {n:,} / at {f} (flat in session length)",
            "median": round(flat, 3),
            "min": round(flat, 3),
            "max": round(flat, 3),
            "samples": [round(flat, 3)],
        },
        targets=[
            {
                "text": f"write amplification at {n:,} events <= {TARGET_RATIO}",
                "met": a["last"] <= TARGET_RATIO,
            },
            {
                "text": f"ratio at {n:,} / ratio at {f} <= {TARGET_FLAT}",
                "met": flat <= TARGET_FLAT,
            },
        ],
        rows=rows,
        measured=m,
        notes=[
            "deterministic (generated logs, fixed seeds): one run is the figure",
            f"took {m['seconds']['generate']} s to generate, {m['seconds']['simulate']} s "
            "to fold and count",
        ],
    )


def run(ctx: Context) -> dict[str, Any]:
    return figure(ctx, measure(verbose=True))


def _broker(args: argparse.Namespace) -> dict[str, Any]:
    import os

    from bench.write_amp_broker import cross_check
    from processor.devbroker import LocalBroker

    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "")
    broker = None
    if not bootstrap:
        broker = LocalBroker()
        bootstrap = broker.start()
    try:
        return cross_check(
            bootstrap, args.broker_sessions, args.broker_events, args.result_bytes, args.context
        )
    finally:
        if broker is not None:
            broker.stop()


#: The small-event workload (bench/parts_sizes.py): mostly short messages and
#: tool calls, where the per-batch heads weigh most.
SMALL_BIG_RATIO = 0.02
SMALL_LENGTHS = (100, 2_000)


def small_events() -> dict[int, float]:
    """(views + checkpoints) / events of parts_sizes.py's sessions at each length."""
    from bench.parts_sizes import measure as parts_measure

    return {
        n: round(parts_measure(n, 20, 50, SMALL_BIG_RATIO)["ratio (views+checkpoints)/events"], 3)
        for n in SMALL_LENGTHS
    }


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench.write_amp", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--sessions", type=int, default=SESSIONS)
    ap.add_argument("--events", type=int, default=EVENTS, help="events per session")
    ap.add_argument("--result-bytes", type=int, default=RESULT_BYTES)
    ap.add_argument("--context", type=int, default=CONTEXT, help="surface nodes at compaction")
    ap.add_argument("--no-write", action="store_true", help="print, do not write results")
    ap.add_argument(
        "--no-report", action="store_true", help="do not render bench/results/REPORT.md"
    )
    ap.add_argument(
        "--broker-events",
        type=int,
        default=0,
        help="also cross-check on a real broker with this many events per session "
        "(bench/write_amp_broker.py; a local broker unless KAFKA_BOOTSTRAP_SERVERS is set)",
    )
    ap.add_argument("--broker-sessions", type=int, default=SESSIONS)
    ap.add_argument(
        "--no-small-events",
        dest="small_events",
        action="store_false",
        help="skip the small-event rows (bench/parts_sizes.py's workload)",
    )
    ap.add_argument(
        "--baseline",
        action="store_true",
        help=f"write the result as the 'before' column ({BEFORE.name}) instead",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    ctx = Context(
        bootstrap="",
        runs=1,
        scale="-",
        command="python -m bench.write_amp " + " ".join(argv if argv is not None else sys.argv[1:]),
        revision=git_revision(),
    )
    t0 = time.perf_counter()
    m = measure(args.sessions, args.events, args.result_bytes, args.context, verbose=True)
    doc = figure(ctx, m)
    if args.small_events:
        doc["small_events"] = small_events()
        doc["rows"] += [
            [f"small events ({SMALL_BIG_RATIO:.0%} big results): ratio at {n:,}", f"{r:,.2f}"]
            for n, r in doc["small_events"].items()
        ]
    if args.broker_events:
        doc["broker"] = _broker(args)
        from bench.write_amp_broker import describe

        doc["rows"] += describe(doc["broker"])
    doc["duration_s"] = round(time.perf_counter() - t0, 1)
    if args.baseline:
        RESULTS.mkdir(parents=True, exist_ok=True)
        doc["figure"] = "write_amp_before"
        BEFORE.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    elif not args.no_write:
        write_result(ctx, doc)
    if not args.no_write and not args.no_report:
        from bench import report

        report.write()
    for name, value in doc["rows"]:
        print(f"{name}: {value}")
    print(json.dumps(doc["targets"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
