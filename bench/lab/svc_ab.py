"""Side-by-side runs of figure 1 for the service owner (issue 15), without
regenerating the workload each time.

- ``wl``: generate + produce the figure-1 workload once, save where it is;
- ``broker``: per run, the ceiling then one Processor over that topic (as
  figure 1), printing events/s, the ratio and the Processor's CPU seconds;
- ``mem``: the same events through one Processor on the in-memory transport
  (``processor/testing/memory.py``): engine + service CPU without librdkafka
  or the broker; ``--profile`` prints a cProfile summary of the run;
- ``engine``: the same events through an :class:`~processor.engine.Engine`
  alone (no runner, no transport; in partition order as the in-memory
  consumer hands them out, batches of ``--batch`` events): the CPU
  of decode + fold vs output, and a SHA-256 of every produced record in
  order, so two trees can be checked for byte-identical output.

Run it with ``PYTHONPATH`` at the tree to measure (a git archive of another
revision works too when it has this file's dependencies), e.g.::

    python -m bench.lab.svc_ab wl --out /tmp/wl.json
    python -m bench.lab.svc_ab broker --wl /tmp/wl.json --runs 2
    python -m bench.lab.svc_ab mem --events /tmp/wl-events.bin --runs 3
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pickle
import pstats
import resource
import sys
import time
from pathlib import Path
from typing import Any

from bench import throughput
from bench.common import Context
from bench.workload import PARTITIONS, Workload, build, interleave, session_logs


def _gc_clock() -> Any:
    """Time spent in collections from now on, per generation."""
    spent = [0.0, 0.0, 0.0]
    count = [0, 0, 0]
    started = [0.0]

    def cb(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            spent[info["generation"]] += time.perf_counter() - started[0]
            count[info["generation"]] += 1

    gc.callbacks.append(cb)

    def report() -> str:
        gc.callbacks.remove(cb)
        return " ".join(f"g{g}:{count[g]}x/{spent[g]:.2f}s" for g in range(3))

    return report


def _settles(proc: Any) -> str:
    heap = getattr(proc, "heap", None)
    return f", settles {heap.settles}x/{heap.settle_seconds:.2f}s" if heap is not None else ""


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _ctx(runs: int = 1) -> Context:
    return Context(
        bootstrap=os.environ["KAFKA_BOOTSTRAP_SERVERS"], runs=runs, scale="1k", command=""
    )


def cmd_wl(args: argparse.Namespace) -> None:
    ctx = _ctx()
    from bench.common import unique

    wl = build(ctx.config(topic_prefix=unique("bench-wl")), args.sessions, args.length)
    Path(args.out).write_text(json.dumps(vars(wl)))
    print(wl.describe())


def cmd_broker(args: argparse.Namespace) -> None:
    doc = json.loads(Path(args.wl).read_text())
    doc["highs"] = {int(k): v for k, v in doc["highs"].items()}
    ctx = _ctx(args.runs)
    ctx.workload = wl = Workload(**doc)
    for i in range(args.runs):
        ceil = throughput.ceiling(ctx.config(topic_prefix=wl.prefix), wl.highs)
        cfg = throughput.fresh_output(ctx, "fold")
        c0 = _cpu()
        svc, metrics = throughput.service(cfg, wl.highs)
        cpu = _cpu() - c0
        load = os.getloadavg()[0]
        svc_cpu_rate = svc.events / svc.cpu
        ceil_cpu_rate = ceil.events / ceil.cpu
        print(
            f"run {i}: service {svc.rate:,.0f} ev/s ({svc.seconds:.2f} s, cpu {cpu:.2f} s), "
            f"ceiling {ceil.rate:,.0f} ev/s, ratio {svc.rate / ceil.rate:.3f}, "
            f"txns {metrics.commits._value.get():.0f}, load {load:.2f}, by CPU: service "
            f"{svc_cpu_rate:,.0f} ev/cpu-s, ceiling {ceil_cpu_rate:,.0f}, "
            f"ratio {svc_cpu_rate / ceil_cpu_rate:.3f}",
            flush=True,
        )


def _events(path: str, sessions: int, length: int) -> list[tuple[bytes, bytes]]:
    p = Path(path)
    if p.exists():
        data: list[tuple[bytes, bytes]] = pickle.loads(p.read_bytes())
        return data
    from processor.codec import default_codec

    codec = default_codec()
    logs = list(session_logs(sessions, length, seed=7))
    data = [(sid.encode(), codec.encode_parsed_event(sid, ev)) for sid, ev in interleave(logs)]
    p.write_bytes(pickle.dumps(data))
    return data


def _partition(key: bytes, n: int) -> int:
    from processor.engine.commands import partition_of

    return int(partition_of(key, n))


def in_partition_order(data: list[tuple[bytes, bytes]]) -> list[tuple[int, int, bytes, bytes]]:
    """(partition, offset, key, value) of each event, in partition order as the
    in-memory consumer hands them out (a batch is then most of one partition:
    each session's events together)."""
    offsets = dict.fromkeys(range(PARTITIONS), 0)
    placed = []
    for key, value in data:
        p = _partition(key, PARTITIONS)
        placed.append((p, offsets[p], key, value))
        offsets[p] += 1
    placed.sort(key=lambda r: r[0])
    return placed


def cmd_mem_run(args: argparse.Namespace) -> None:
    from processor.config import ServiceConfig
    from processor.service.loop.runner import Processor
    from processor.telemetry.metrics import Metrics
    from processor.testing.memory import MemoryBroker, MemoryTransport

    data = _events(args.events, args.sessions, args.length)
    for i in range(args.runs):
        broker = MemoryBroker()
        config = ServiceConfig(
            partitions=PARTITIONS, topic_prefix=f"mem{i}", state_dir=args.state_dir
        ).with_overrides(**json.loads(args.overrides))
        broker.create_topics(config)
        topic = config.topics.events
        highs = dict.fromkeys(range(PARTITIONS), 0)
        for key, value in data:
            p = _partition(key, PARTITIONS)
            broker.append(topic, p, key, value, "committed")
            highs[p] += 1
        metrics = Metrics()
        proc = Processor(config, metrics=metrics, transport=MemoryTransport(broker, config))
        if args.gc_threshold:
            gc.set_threshold(*(int(x) for x in args.gc_threshold.split(",")))
        gc_time = _gc_clock()
        tracked: list[int] = []
        commit = proc._commit

        def watched(commit: Any = commit, tracked: list[int] = tracked, **kw: Any) -> None:
            commit(**kw)  # then: the objects a full collection would walk
            tracked.append(len(gc.get_objects()))

        proc._commit = watched  # type: ignore[method-assign]
        prof = cProfile.Profile() if args.profile else None
        t0, c0 = time.perf_counter(), _cpu()
        if prof is not None:
            prof.enable()
        proc.run(until_offsets={p: h for p, h in highs.items() if h}, max_idle_s=10, max_wait_s=10)
        if prof is not None:
            prof.disable()
        wall, cpu = time.perf_counter() - t0, _cpu() - c0
        n = int(metrics.records_consumed._value.get())
        gcs = gc_time()
        gc.collect()
        frozen = gc.get_freeze_count()
        gc.unfreeze()
        leaked = gc.collect()  # cyclic garbage that a freeze kept
        print(
            f"mem run {i}: {n} events, {n / wall:,.0f} ev/s wall {wall:.2f} s, cpu {cpu:.2f} s, "
            f"{cpu / n * 1e6:.1f} us/event, txns {metrics.commits._value.get():.0f}, "
            f"gc {gcs}{_settles(proc)}, frozen {frozen}, freed after unfreeze {leaked}, "
            f"unfrozen tracked objects after commits: max {max(tracked, default=0)}, "
            f"last {tracked[-2] if len(tracked) > 1 else 0}",
            flush=True,
        )
        if prof is not None:
            stats = pstats.Stats(prof, stream=sys.stdout)
            stats.sort_stats(args.sort).print_stats(args.top)


def cmd_engine(args: argparse.Namespace) -> None:
    import hashlib

    from processor.codec import default_codec
    from processor.config import ServiceConfig
    from processor.core.builtin import default_registry
    from processor.core.defaults import default_message_projections
    from processor.engine import Batch, Engine, PartitionState, Record

    data = _events(args.events, args.sessions, args.length)
    for i in range(args.runs):
        config = ServiceConfig(partitions=PARTITIONS)
        engine = Engine(config, default_codec(), default_registry(), default_message_projections())
        for p in range(PARTITIONS):
            engine.partitions[p] = PartitionState(p)
        records = [
            Record(config.topics.events, p, offset, key, value, 1_000)
            for p, offset, key, value in in_partition_order(data)
        ]
        sha = hashlib.sha256()
        n_out = fold_s = out_s = 0.0
        # the service's collector settings (heap.py): thresholds, a settle per commit
        gc.set_threshold(50_000, 20, 100)
        gc.collect()
        gc.freeze()
        for start in range(0, len(records), args.batch):
            t0 = time.process_time()
            for rec in records[start : start + args.batch]:
                engine.fold(engine.partitions[rec.partition], rec)
            t1 = time.process_time()
            outs = list(engine.output())
            t2 = time.process_time()
            engine.batch = Batch()
            gc.collect()
            gc.freeze()
            fold_s += t1 - t0
            out_s += t2 - t1
            for o in outs:
                sha.update(f"{o.topic}/{o.partition}/".encode())
                sha.update(o.key or b"-")
                sha.update(b"=" + o.value if o.value is not None else b"!")
                n_out += 1
        n = len(records)
        print(
            f"engine run {i}: {n} events, fold {fold_s / n * 1e6:.1f} us/event, "
            f"output {out_s / n * 1e6:.1f} us/event, {n_out:.0f} records, "
            f"sha256 {sha.hexdigest()[:16]}, load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        gc.unfreeze()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.lab.svc_ab")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("wl")
    s.add_argument("--out", required=True)
    s.add_argument("--sessions", type=int, default=1000)
    s.add_argument("--length", type=int, default=60)
    s.set_defaults(func=cmd_wl)
    s = sub.add_parser("broker")
    s.add_argument("--wl", required=True)
    s.add_argument("--runs", type=int, default=1)
    s.set_defaults(func=cmd_broker)
    s = sub.add_parser("mem")
    s.add_argument("--events", required=True)
    s.add_argument("--sessions", type=int, default=1000)
    s.add_argument("--length", type=int, default=60)
    s.add_argument("--runs", type=int, default=1)
    s.add_argument("--state-dir", default="none")
    s.add_argument("--overrides", default="{}")
    s.add_argument("--profile", action="store_true")
    s.add_argument("--gc-threshold", default="", help="e.g. 50000,20,100 (the CLI's)")
    s.add_argument("--sort", default="tottime")
    s.add_argument("--top", type=int, default=40)
    s.set_defaults(func=cmd_mem_run)
    s = sub.add_parser("engine")
    s.add_argument("--events", required=True)
    s.add_argument("--sessions", type=int, default=1000)
    s.add_argument("--length", type=int, default=60)
    s.add_argument("--runs", type=int, default=1)
    s.add_argument("--batch", type=int, default=5000)
    s.set_defaults(func=cmd_engine)
    args: Any = ap.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
