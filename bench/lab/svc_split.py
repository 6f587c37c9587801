"""Where one figure-1 Processor's wall time goes (issue 15).

Per run, as figure 1 (``bench/throughput.py``, the workload saved by
``python -m bench.lab.svc_ab wl``): the ceiling, then one Processor over the
whole topic with exactly-once on, fresh outputs and group.  During the
Processor's run it records:

- CPU seconds (``/proc/<pid>/task/<tid>/stat`` utime + stime) of each of the
  process's threads, grouped by name (the loop, librdkafka's, the
  transaction helper), and of the broker's JVM (``--broker-pid``);
- the loop thread's time on a CPU and runnable-but-waiting (``schedstat``);
- wall time of the loop's steps: ``consume`` calls (returning records or
  nothing), the fold (``processor_fold_seconds``), the commit call (which
  waits for the previous commit first), the heap settle, the collector
  (``gc.callbacks``, outside the settles);
- the transaction timeline (``processor.timeline`` DEBUG): per step of each
  transaction, summed.

Everything is printed per event (us) and as a share of the run's wall time
(first record -> all committed), and the run's fold output is hashed so two
trees can be checked for identical views and checkpoints (``--sha``).

    python -m bench.lab.svc_ab wl --out /tmp/wl.json
    python -m bench.lab.svc_split --wl /tmp/wl.json --broker-pid PID --runs 3
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench import throughput
from bench.common import Context
from bench.workload import Workload
from processor.client.views_reader import materialize_views, session_fold_equivalent
from processor.kafka import clients
from processor.kafka.topic_admin import delete_topics, topic_specs
from processor.kafka.transport import KafkaTransport
from processor.service.loop.runner import Processor
from processor.service.txn import schedstat
from processor.telemetry.metrics import Metrics

TICK = os.sysconf("SC_CLK_TCK")


def _task_cpu(pid: int | str, tid: str) -> tuple[str, float]:
    """(thread name, CPU seconds) of one thread."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            raw = f.read()
    except OSError:
        return "?", 0.0
    name = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    return name, (int(fields[11]) + int(fields[12])) / TICK


def threads_cpu(pid: int | str = "self") -> dict[str, float]:
    """CPU seconds per thread id (``name/tid``) of a process."""
    out: dict[str, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        name, cpu = _task_cpu(pid, tid)
        out[f"{name}/{tid}"] = cpu
    return out


def _group(name: str, loop_tid: int) -> str:
    thread, tid = name.rsplit("/", 1)
    if int(tid) == loop_tid:
        return "loop thread"
    if thread.startswith("rdk:"):
        return "librdkafka threads"
    if "txn" in thread:
        return "transaction helper"
    return "other threads"


class _Timed:
    """A consumer whose ``consume`` calls are timed (empty vs with records)."""

    def __init__(self, inner: Any, clock: dict[str, float]) -> None:
        self._inner = inner
        self._clock = clock

    def consume(self, num_messages: int = 1, timeout: float = -1) -> Any:
        t0 = time.perf_counter()
        msgs = self._inner.consume(num_messages=num_messages, timeout=timeout)
        spent = time.perf_counter() - t0
        if msgs:
            key = "consume (records)"
        elif not self._clock["records per consume"]:
            key = "consume (joining: before the first record)"
        elif self._clock["records per consume"] < self._clock["events"]:
            key = "consume (nothing, records still to come)"
        else:
            key = "consume (nothing)"
        self._clock[key] += spent
        self._clock["consume calls"] += 1
        self._clock["records per consume"] += len(msgs)
        return msgs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Transport(KafkaTransport):
    def __init__(self, config: Any, clock: dict[str, float]) -> None:
        super().__init__(config)
        self._clock = clock

    def group_consumer(self, instance_id: str, problems: Any) -> Any:
        return _Timed(super().group_consumer(instance_id, problems), self._clock)


class _Timeline(logging.Handler):
    """Sums each step of the ``processor.timeline`` lines."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.steps: dict[str, float] = defaultdict(float)
        self.events: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage()
        head, _, sched = line.partition("|")
        self.events.append(int(re.search(r"events=(\d+)", head).group(1)))  # type: ignore[union-attr]
        for name, ms in re.findall(r"(\w+)=([\d.]+)", head):
            if name != "events":
                self.steps[name] += float(ms) / 1000
        for name, ms in re.findall(r"(\w+)=([\d.]+)", sched):
            self.steps[f"sched {name}"] += float(ms) / 1000


def _timed_method(obj: Any, name: str, clock: dict[str, float], key: str) -> None:
    inner = getattr(obj, name)

    def timed(*a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return inner(*a, **kw)
        finally:
            clock[key] += time.perf_counter() - t0

    setattr(obj, name, timed)


def output_sha(config: Any) -> str:
    """SHA-256 of every session's committed views, assembled (``views_reader``)
    and shaped as ``processor fold`` output: what a reader sees once the run
    committed.  The records themselves differ from run to run (which events
    share a transaction depends on fetch timing; each transaction publishes a
    session's changed views once), the assembled views must not."""
    sha = hashlib.sha256()
    views = materialize_views(config, timeout=30)
    for session in sorted(views):
        doc = session_fold_equivalent(views[session])
        sha.update(session.encode() + b"=" + json.dumps(doc, sort_keys=True).encode())
    return f"{sha.hexdigest()[:16]} ({len(views)} sessions)"


def one_run(ctx: Context, wl: Workload, broker_pid: int | None, sha: bool) -> dict[str, Any]:
    ceil = throughput.ceiling(ctx.config(topic_prefix=wl.prefix), wl.highs)
    config = throughput.fresh_output(ctx, "fold")
    clock: dict[str, float] = defaultdict(float)
    clock["events"] = wl.events
    metrics = Metrics()
    proc = Processor(config, metrics=metrics, transport=_Transport(config, clock))
    _timed_method(proc, "_commit", clock, "commit call (loop)")
    _timed_method(proc.txn, "settle", clock, "  of which settle (waits for the previous)")
    _timed_method(proc.txn, "wait_in_flight", clock, "wait_in_flight (due, commit busy)")
    gc_spent = [0.0, 0.0]

    def gc_cb(phase: str, info: dict[str, int]) -> None:
        if threading.get_ident() != loop_ident:
            return
        if phase == "start":
            gc_spent[0] = time.perf_counter()
        else:
            gc_spent[1] += time.perf_counter() - gc_spent[0]

    loop_ident = threading.get_ident()
    gc.callbacks.append(gc_cb)
    tl = _Timeline()
    tlog = logging.getLogger("processor.timeline")
    tlog.addHandler(tl)
    tlog.setLevel(logging.DEBUG)
    tlog.propagate = False
    loop_tid = threading.get_native_id()
    first: list[float] = []
    cpu0: dict[str, float] = {}
    jvm0 = sum(threads_cpu(broker_pid).values()) if broker_pid else 0.0
    sched0 = schedstat.thread_ms()

    seen: dict[str, float] = {}  # each thread's last CPU figure (the clients' end at close)
    running = threading.Event()

    def watch() -> None:
        while not first:
            if metrics.records_consumed._value.get() > 0:
                first.append(time.perf_counter())
                cpu0.update(threads_cpu())
                break
            time.sleep(0.002)
        while not running.wait(0.02):
            seen.update(threads_cpu())

    w = threading.Thread(target=watch, daemon=True)
    w.start()
    cpu_start = threads_cpu()
    try:
        proc.run(until_offsets=dict(wl.highs), max_idle_s=60, max_wait_s=60)
    finally:
        end = time.perf_counter()
        gc.callbacks.remove(gc_cb)
        tlog.removeHandler(tl)
        tlog.propagate = True
    sched1 = schedstat.thread_ms()
    running.set()
    w.join(1)
    cpu1 = {**seen, **threads_cpu()}
    jvm1 = sum(threads_cpu(broker_pid).values()) if broker_pid else 0.0
    start = first[0] if first else end
    wall = end - start
    n = int(metrics.records_consumed._value.get())
    base = cpu0 or cpu_start
    groups: dict[str, float] = defaultdict(float)
    for name, cpu in cpu1.items():
        groups[_group(name, loop_tid)] += cpu - base.get(name, 0.0)
    fold_s = metrics.fold_seconds._sum.get()
    rows: list[tuple[str, float]] = [
        ("wall, first record -> all committed", wall),
        ("-- CPU, whole window (s of CPU) --", float("nan")),
        *sorted(groups.items()),
        ("all threads of the Processor's process", sum(groups.values())),
        ("broker JVM (same window incl. start-up)", jvm1 - jvm0),
        ("-- loop thread, start -> end (schedstat) --", float("nan")),
        ("on a CPU", (sched1[0] - sched0[0]) / 1000),
        ("runnable, waiting for a CPU", (sched1[1] - sched0[1]) / 1000),
        ("-- loop thread wall, by step --", float("nan")),
        ("fold (fold_seconds)", fold_s),
        ("consume returning records", clock["consume (records)"]),
        (
            "consume returning nothing, records to come",
            clock["consume (nothing, records still to come)"],
        ),
        ("consume returning nothing, all records read", clock["consume (nothing)"]),
        ("commit call (loop)", clock["commit call (loop)"]),
        (
            "  of which settle (waits for the previous)",
            clock["  of which settle (waits for the previous)"],
        ),
        ("wait_in_flight (due, commit busy)", clock["wait_in_flight (due, commit busy)"]),
        ("heap settle (gc.collect + freeze)", proc.heap.settle_seconds),
        ("collector outside settles (gc.callbacks)", gc_spent[1] - proc.heap.settle_seconds),
        ("-- transactions (timeline, summed) --", float("nan")),
        *sorted((k, v) for k, v in tl.steps.items() if k not in ("close", "begun")),
    ]
    doc = {
        "events": n,
        "wall": wall,
        "ceiling_rate": ceil.rate,
        "ceiling_cpu": ceil.cpu,
        "rate": n / wall,
        "txns": metrics.commits._value.get(),
        "batch_events": tl.events,
        "consume_calls": clock["consume calls"],
        "records_per_consume": clock["records per consume"] / max(1, clock["consume calls"]),
        "rows": rows,
        "load": os.getloadavg()[0],
    }
    if sha:
        doc["sha"] = output_sha(config)
    # an aging devbroker (topics never deleted) gets slower (history/5-latency.md)
    delete_topics(
        clients.admin(config), [t.name for t in topic_specs(config) if t.name != wl.events_topic]
    )
    return doc


def _print(doc: dict[str, Any]) -> None:
    n, wall = doc["events"], doc["wall"]
    print(
        f"{n} events in {wall:.2f} s: {doc['rate']:,.0f} ev/s, ceiling {doc['ceiling_rate']:,.0f}"
        f" ev/s (cpu {doc['ceiling_cpu'] / n * 1e6:.1f} us/ev), ratio "
        f"{doc['rate'] / doc['ceiling_rate']:.3f}; txns {doc['txns']:.0f}, events per txn "
        f"{doc['batch_events']}; consume calls {doc['consume_calls']:.0f}, "
        f"{doc['records_per_consume']:.0f} records each; load {doc['load']:.1f}"
        + (f"; sha {doc['sha']}" if "sha" in doc else "")
    )
    print(f"| {'part':<48} | {'us/event':>9} | {'% of wall':>9} |")
    print(f"|{'-' * 50}|{'-' * 11}:|{'-' * 11}:|")
    for name, s in doc["rows"]:
        if s != s:  # nan: a heading
            print(f"| {name:<48} | {'':>9} | {'':>9} |")
            continue
        print(f"| {name:<48} | {s / n * 1e6:9.1f} | {100 * s / wall:8.1f}% |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.lab.svc_split")
    ap.add_argument("--wl", required=True)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--broker-pid", type=int, default=None)
    ap.add_argument("--sha", action="store_true", help="hash the committed output")
    ap.add_argument("--overrides", default="{}", help="ServiceConfig overrides (JSON)")
    ap.add_argument("--json", default="", help="append each run's figures to this file")
    args = ap.parse_args(argv)
    doc = json.loads(Path(args.wl).read_text())
    doc["highs"] = {int(k): v for k, v in doc["highs"].items()}
    ctx = Context(
        bootstrap=os.environ["KAFKA_BOOTSTRAP_SERVERS"], runs=args.runs, scale="1k", command=""
    )
    ctx.workload = wl = Workload(**doc)
    overrides = json.loads(args.overrides)
    if overrides:
        base = ctx.config

        def config(**kw: Any) -> Any:
            return base(**kw).with_overrides(**overrides)

        ctx.config = config  # type: ignore[method-assign]
    for _ in range(args.runs):
        d = one_run(ctx, wl, args.broker_pid, args.sha)
        _print(d)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(d) + "\n")


if __name__ == "__main__":
    main()
