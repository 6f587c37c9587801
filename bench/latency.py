"""Figure 5: latency from produce to the view visible to a read_committed subscriber.

Per run: fresh topics; a ``python -m processor run`` subprocess (service
defaults: exactly-once, ``commit_interval_ms`` as shipped); in this process
a read_committed consumer thread on the views topic and a paced producer.
Warm-up: the first event of every session is produced and the bench waits
until every session's ``status`` view is visible (the processor is
assigned and folding); those events are not counted.  Then ``RATE``
events/s for ``DURATION`` s, sessions interleaved, each send time noted
per (session, seq) at the ``produce`` call.  Whenever a ``status`` view of
a session arrives with ``asOfSeq`` = s, every event of that session with
seq <= s not yet seen is visible now: its latency is receive time - send
time (one clock, one process).
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition

from bench.common import REPO, Context, measure, python_env, result, unique, wait_for
from bench.workload import PARTITIONS, create, interleave, session_logs
from processor.children import popen_tied
from processor.codec import default_codec
from processor.config import ServiceConfig
from processor.kafka import clients
from processor.kafka.topic_admin import delete_topics, topic_specs

SESSIONS = 200
RATE = 400  # events/s: moderate, a few % of one processor's capacity
DURATION = 15.0  # s of paced load per run
#: experiment: a shorter commit interval, to see how the latency follows it
TUNED_INTERVAL_MS = 100
#: ``BENCH_LATENCY_BUSY=1``: a second busy process (``while True: pass``) on the
#: box during every run, started and killed by the bench (issue 15)
BUSY = os.environ.get("BENCH_LATENCY_BUSY", "0") == "1"
#: ``BENCH_LATENCY_TUNED=0``: skip the shorter-interval experiment runs
TUNED = os.environ.get("BENCH_LATENCY_TUNED", "1") != "0"
#: A broker the bench just started (no ``KAFKA_BOOTSTRAP_SERVERS``) is a cold
#: JVM: its JIT compiler burns ~1.5 s of CPU in the first ~30 s (bench/lab/history/
#: 5-latency.md) and the first run's tail showed it.  One unmeasured run
#: first, reported in its own row; ``BENCH_LATENCY_WARMUP=0`` measures it too.
#: ``BENCH_LATENCY_TIMELINE=DIR``: the processor logs one line per transaction
#: (``processor.timeline``: when each commit step ended) and, with
#: ``BENCH_LATENCY_KAFKA_DEBUG=eos,protocol``, librdkafka's lines; each run's
#: stderr is kept as DIR/run-N.log (``bench/lab/txn_timeline.py`` sums them up)
TIMELINE = os.environ.get("BENCH_LATENCY_TIMELINE", "")
KAFKA_DEBUG = os.environ.get("BENCH_LATENCY_KAFKA_DEBUG", "")
#: ``BENCH_LATENCY_ARGS``: more ``processor run`` arguments (``-X key=value`` A/B)
EXTRA_ARGS = os.environ.get("BENCH_LATENCY_ARGS", "").split()
#: ``BENCH_LATENCY_KEEP_TOPICS=1``: leave each run's topics on the broker
DELETE_TOPICS = os.environ.get("BENCH_LATENCY_KEEP_TOPICS", "0") != "1"
WARMUP = os.environ.get("BENCH_LATENCY_WARMUP", "1") != "0" and not os.environ.get(
    "KAFKA_BOOTSTRAP_SERVERS"
)


class ViewWatcher(threading.Thread):
    """Reads ``status`` views (read_committed) and turns them into latencies."""

    def __init__(self, config: ServiceConfig, sent: dict[tuple[str, int], float]) -> None:
        super().__init__(daemon=True)
        self.config = config
        self.sent = sent
        self.seen: dict[str, int] = {}
        self.latencies: list[float] = []
        #: per measured event, split at the view record's timestamp (its produce
        #: call in the processor's commit, wall clock of this box): send -> produced
        #: (batching + fold + output) and produced -> visible here (the rest of the
        #: commit, markers, fetch)
        self.to_produce: list[float] = []
        self.to_visible: list[float] = []
        self.wall_offset = time.time() - time.perf_counter()
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:
            self.error = exc

    def _loop(self) -> None:
        codec = default_codec()
        consumer = clients.plain_consumer(self.config, "bench-latency")
        topic = self.config.topics.views
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        try:
            while not self.stop_flag.is_set():
                # As a subscriber that reacts to each view would: wake on the
                # first record (poll), then take what else is ready.  A batch
                # consume(n, t) returns only when n records came or t is over,
                # which added up to t (mean t/2 = 25 ms) to every latency here.
                first = consumer.poll(0.05)
                if first is None:
                    continue
                msgs = [first, *consumer.consume(num_messages=1000, timeout=0)]
                now = time.perf_counter()
                now_wall = now + self.wall_offset
                for msg in msgs:
                    if msg.error() is not None or msg.value() is None:
                        continue
                    key = (msg.key() or b"").decode()
                    sid, _, view = key.partition("/")
                    if view not in ("status", "~h"):  # the head carries the status (format 2)
                        continue
                    as_of = codec.decode_view(msg.value() or b"").as_of_seq
                    last = self.seen.get(sid, -1)
                    produced = msg.timestamp()[1] / 1000
                    for seq in range(last + 1, as_of + 1):
                        t = self.sent.get((sid, seq))
                        if t is not None:
                            self.latencies.append(now - t)
                            self.to_produce.append(produced - (t + self.wall_offset))
                            self.to_visible.append(now_wall - produced)
                    if as_of > last:
                        self.seen[sid] = as_of
        finally:
            consumer.close()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def one_run(ctx: Context, commit_interval_ms: int | None = None) -> dict[str, float]:
    """One run; ``commit_interval_ms``: passed to ``processor run`` (default: the shipped one)."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if BUSY else None
    load = os.getloadavg()[0]
    try:
        return {
            **_one_run(ctx, commit_interval_ms),
            "load_start": load,
            "load_end": os.getloadavg()[0],
        }
    finally:
        if busy is not None:
            busy.kill()
            busy.wait(10)


def _one_run(ctx: Context, commit_interval_ms: int | None) -> dict[str, float]:
    prefix = unique("bench-latency")
    config = ctx.config(topic_prefix=prefix, group_id=f"{prefix}-group")
    create(config)
    per_session = int(RATE * DURATION / SESSIONS) + 2
    logs = list(session_logs(SESSIONS, per_session, seed=31, tag="lat"))
    sent: dict[tuple[str, int], float] = {}
    watcher = ViewWatcher(config, sent)
    watcher.start()
    argv = [
        sys.executable,
        "-m",
        "processor",
        "run",
        "-b",
        ctx.bootstrap,
        "--topic-prefix",
        prefix,
        "--group-id",
        config.group_id,
        "--instance-id",
        f"{prefix}-0",
        "--max-idle-s",
        "60",
        "--log-level",
        "WARNING",
        "--metrics-port",
        "0",
    ]
    if commit_interval_ms is not None:
        argv += ["--commit-interval-ms", str(commit_interval_ms)]
    argv += EXTRA_ARGS
    keep = None
    if TIMELINE:
        argv[argv.index("WARNING")] = "DEBUG"
        if KAFKA_DEBUG:
            argv += ["-X", f"debug={KAFKA_DEBUG}", "--kafka-log-level", "DEBUG"]
        os.makedirs(TIMELINE, exist_ok=True)
        keep = os.path.join(TIMELINE, f"{prefix}.log")
    proc = popen_tied(  # dies with the bench (children.py)
        argv, cwd=REPO, env=python_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    stderr = _Drain(proc, keep)
    codec = default_codec()
    producer = clients.event_producer(config, "bench-latency")
    topic = config.topics.events
    try:
        for sid, events in logs:  # warm-up: seq 0 of every session, not measured
            producer.produce(
                topic, key=sid.encode(), value=codec.encode_parsed_event(sid, events[0])
            )
        producer.flush(30)
        if not wait_for(lambda: len(watcher.seen) >= SESSIONS, 60):
            raise RuntimeError(
                f"warm-up: {len(watcher.seen)} of {SESSIONS} sessions visible; "
                f"processor stderr: {stderr.tail()}"
            )
        stream = list(interleave([(sid, evs[1:]) for sid, evs in logs]))
        stream = stream[: int(RATE * DURATION)]
        payloads = [(sid, e.seq, codec.encode_parsed_event(sid, e)) for sid, e in stream]
        t0 = time.perf_counter()
        for i, (sid, seq, value) in enumerate(payloads):
            due = t0 + i / RATE
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            sent[(sid, seq)] = time.perf_counter()
            producer.produce(topic, key=sid.encode(), value=value)
            producer.poll(0)
        producer.flush(30)
        last = {sid: seq for sid, seq, _ in payloads}
        wait_for(lambda: all(watcher.seen.get(s, -1) >= q for s, q in last.items()), 60)
        commit = _commit_stats(stderr.metrics_url())
    finally:
        watcher.stop_flag.set()
        watcher.join(10)
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        # Each run's five topics (60 partitions) go: left on the broker they
        # added up, and a devbroker with ~900 partitions committed 2-3x slower
        # (txn 25 -> 75 ms, p99 250 -> 900 ms within 20 runs, lab history 5-latency.md)
        if DELETE_TOPICS:
            _drop_topics(config)
    if watcher.error is not None:
        raise watcher.error
    lat = watcher.latencies
    if len(lat) < len(payloads) * 0.99:
        raise RuntimeError(f"only {len(lat)} of {len(payloads)} events became visible")
    return {
        "p50_ms": 1000 * statistics.median(lat),
        "p99_ms": 1000 * _percentile(lat, 0.99),
        "max_ms": 1000 * max(lat),
        "events": len(lat),
        "to_produce_p50_ms": 1000 * statistics.median(watcher.to_produce),
        "to_produce_p99_ms": 1000 * _percentile(watcher.to_produce, 0.99),
        "to_visible_p50_ms": 1000 * statistics.median(watcher.to_visible),
        "to_visible_p99_ms": 1000 * _percentile(watcher.to_visible, 0.99),
        **commit,
    }


def _drop_topics(config: ServiceConfig) -> None:
    try:
        delete_topics(clients.admin(config), [s.name for s in topic_specs(config)])
    except KafkaException as exc:  # the run's figures stand; the broker keeps them
        print(f"[bench] latency: {config.topic_prefix} topics kept: {exc}", file=sys.stderr)


class _Drain(threading.Thread):
    """Keeps the processor's stderr pipe empty; remembers the metrics URL line."""

    def __init__(self, proc: subprocess.Popen[bytes], keep: str | None = None) -> None:
        super().__init__(daemon=True)
        self.proc = proc
        self.keep = keep  # a file every line also goes to
        self.lines: list[str] = []
        self.url: str | None = None
        self.start()

    def run(self) -> None:
        assert self.proc.stderr is not None
        with open(self.keep or os.devnull, "w") as kept:
            for raw in self.proc.stderr:
                line = raw.decode(errors="replace").rstrip()
                if self.keep:
                    print(line, file=kept)
                found = self.url is None and re.search(r"metrics on (http://\S+)", line)
                if found:  # early: a DEBUG run's last 200 lines no longer hold it
                    self.url = found.group(1)
                self.lines.append(line)
                del self.lines[:-200]

    def metrics_url(self) -> str | None:
        return self.url

    def tail(self) -> str:
        return "\n".join(self.lines[-20:])


def _commit_stats(url: str | None) -> dict[str, float]:
    """Mean transaction time and events per batch from the processor's /metrics."""
    if url is None:
        return {}
    try:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError:
        return {}
    values: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in (
            "processor_commit_seconds_sum",
            "processor_commit_seconds_count",
            "processor_batch_events_sum",
            "processor_batch_events_count",
        ):
            values[name] = float(value)
    count = values.get("processor_commit_seconds_count", 0)
    if not count:
        return {}
    return {
        "commit_ms_mean": 1000 * values["processor_commit_seconds_sum"] / count,
        "batch_events_mean": values.get("processor_batch_events_sum", 0) / count,
        "commits": count,
    }


def run(ctx: Context) -> dict[str, Any]:
    runs: list[dict[str, float]] = []
    tuned: list[dict[str, float]] = []
    warm = one_run(ctx) if WARMUP else None  # the broker's JVM warms up: not measured
    if warm is not None:
        print(f"[bench] latency warm-up run: {_one_line(warm)}", file=sys.stderr, flush=True)
    for _ in range(ctx.runs):  # alternate shipped and tuned settings
        runs.append(one_run(ctx))
        print(f"[bench] latency run: {_one_line(runs[-1])}", file=sys.stderr, flush=True)
        if TUNED:
            tuned.append(one_run(ctx, TUNED_INTERVAL_MS))
    interval = ctx.config().commit_interval_ms
    p99 = [r["p99_ms"] for r in runs]
    med99 = statistics.median(p99)
    ok99 = sum(p <= 2 * interval for p in p99)
    doc = result(
        ctx,
        "latency",
        "Latency: produce -> view visible to a read_committed subscriber",
        workload=f"{SESSIONS} sessions, {RATE} events/s for {DURATION:g} s per run",
        value=measure("p99", "ms", p99),
        baseline={
            "label": "commit interval (ServiceConfig.commit_interval_ms)",
            "unit": "ms",
            "median": interval,
            "min": interval,
            "max": interval,
            "samples": [interval],
        },
        ratio={
            "label": "p99 / commit interval",
            "median": round(med99 / interval, 3),
            "min": round(min(p99) / interval, 3),
            "max": round(max(p99) / interval, 3),
            "samples": [round(p / interval, 3) for p in p99],
        },
        targets=[
            {
                "text": f"p99 <= 2 x commit interval = {2 * interval} ms (median p99 "
                f"{med99:.0f} ms)",
                "met": med99 <= 2 * interval,
            },
            {
                "text": f"p99 <= 2 x commit interval in every run ({ok99} of {len(p99)}), "
                "p50 <= 1 x in every run "
                f"({sum(r['p50_ms'] <= interval for r in runs)} of {len(runs)})",
                "met": all(p <= 2 * interval for p in p99)
                and all(r["p50_ms"] <= interval for r in runs),
            },
        ],
        rows=[
            [
                "every run: p50 / p99 / max ms, load start -> end",
                "; ".join(_one_line(r) for r in runs),
            ],
            ["a second busy process on the box (BENCH_LATENCY_BUSY)", "yes" if BUSY else "no"],
            [
                "split at the view's produce: send -> produced (batch + fold + output), "
                "p50 / p99 ms",
                "; ".join(
                    f"{r['to_produce_p50_ms']:.0f} / {r['to_produce_p99_ms']:.0f}" for r in runs
                ),
            ],
            [
                "split at the view's produce: produced -> visible (rest of the commit, "
                "markers, fetch), p50 / p99 ms",
                "; ".join(
                    f"{r['to_visible_p50_ms']:.0f} / {r['to_visible_p99_ms']:.0f}" for r in runs
                ),
            ],
            [
                "broker warm-up run (fresh broker JVM, not in the figure): p50 / p99 / max ms",
                "-"
                if warm is None
                else f"{warm['p50_ms']:.0f} / {warm['p99_ms']:.0f} / {warm['max_ms']:.0f}",
            ],
            ["p50 (ms)", _fmt([r["p50_ms"] for r in runs])],
            ["max (ms)", _fmt([r["max_ms"] for r in runs])],
            ["events measured per run", _fmt([r["events"] for r in runs])],
            [
                "processor: mean transaction time (produce + send_offsets + commit), ms",
                _fmt([r.get("commit_ms_mean", float("nan")) for r in runs]),
            ],
            [
                "processor: mean events per transaction",
                _fmt([r.get("batch_events_mean", float("nan")) for r in runs]),
            ],
            [
                "processor: implied batch period = events per transaction / load rate (ms)",
                _fmt([1000 * r.get("batch_events_mean", float("nan")) / RATE for r in runs]),
            ],
        ],
        notes=[
            "Transaction time and events per transaction come from the processor's own "
            "/metrics (processor_commit_seconds, processor_batch_events) at the end of each "
            "run; the experiment rows run the same load with a shorter commit interval, "
            "alternating with the shipped-default runs."
        ],
        raw={"runs": runs, "tuned": tuned},
    )
    if tuned:
        doc["rows"] += [
            [
                f"experiment, --commit-interval-ms {TUNED_INTERVAL_MS}: p50 (ms)",
                _fmt([r["p50_ms"] for r in tuned]),
            ],
            [
                f"experiment, --commit-interval-ms {TUNED_INTERVAL_MS}: p99 (ms)",
                _fmt([r["p99_ms"] for r in tuned]),
            ],
            [
                f"experiment, --commit-interval-ms {TUNED_INTERVAL_MS}: p99 / its interval",
                _fmt([r["p99_ms"] / TUNED_INTERVAL_MS for r in tuned]),
            ],
            [
                f"experiment, --commit-interval-ms {TUNED_INTERVAL_MS}: implied batch period (ms)",
                _fmt([1000 * r.get("batch_events_mean", float("nan")) / RATE for r in tuned]),
            ],
        ]
    return doc


def _one_line(r: dict[str, float]) -> str:
    return (
        f"{r['p50_ms']:.0f} / {r['p99_ms']:.0f} / {r['max_ms']:.0f}, "
        f"load {r['load_start']:.1f} -> {r['load_end']:.1f}; split p50/p99: to produce "
        f"{r.get('to_produce_p50_ms', 0):.0f}/{r.get('to_produce_p99_ms', 0):.0f}, to visible "
        f"{r.get('to_visible_p50_ms', 0):.0f}/{r.get('to_visible_p99_ms', 0):.0f}; txn "
        f"{r.get('commit_ms_mean', 0):.0f} ms, {r.get('batch_events_mean', 0):.0f} ev/txn"
    )


def _fmt(samples: list[float]) -> str:
    m = measure("", "", samples, 1)
    return f"{m['median']:g} (min {m['min']:g}, max {m['max']:g})"
