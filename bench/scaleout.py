"""Figure 7: scale-out, one vs two ``processor run`` processes in one consumer group.

Per run, back to back: fresh output topics and group; start 1 (then 2)
``python -m processor run`` subprocesses (``PROCESSOR_EVENTS_TOPIC`` points
them at the workload's events topic) at once, and poll the group's
committed offsets (a non-member consumer, every 50 ms) until every
partition is committed up to its high watermark.  Time = spawn -> all
committed (interpreter start-up, group join and the cooperative rebalance
when the second member arrives included); *steady* = first committed
progress -> all committed.  The machine has 2 cores shared with the broker
and this bench, so two processes compete with the broker for CPU.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from bench.common import REPO, Context, measure, python_env, ratio, result
from bench.throughput import fresh_output
from processor.children import popen_tied
from processor.kafka.client_errors import LIBRDKAFKA_LOGGER


def one_run(ctx: Context, processes: int) -> tuple[float, float]:
    wl = ctx.workload
    config = fresh_output(ctx, f"scale{processes}")
    env = python_env()
    env["PROCESSOR_EVENTS_TOPIC"] = wl.events_topic
    poller = Consumer(
        {
            **config.common(),
            "logger": LIBRDKAFKA_LOGGER,
            "group.id": config.group_id,
            "enable.auto.commit": False,
        }
    )
    tps = [TopicPartition(wl.events_topic, p) for p in wl.highs]
    t0 = time.perf_counter()
    procs = [
        popen_tied(  # die with the bench (children.py)
            [
                sys.executable,
                "-m",
                "processor",
                "run",
                "-b",
                ctx.bootstrap,
                "--topic-prefix",
                config.topic_prefix,
                "--group-id",
                config.group_id,
                "--instance-id",
                f"{config.topic_prefix}-{i}",
                "--max-idle-s",
                "120",
                "--log-level",
                "WARNING",
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(processes)
    ]
    first: float | None = None
    try:
        deadline = t0 + 600
        while True:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"{processes} processes did not commit everything in 600 s")
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"a processor exited early: {[p.returncode for p in procs]}")
            committed = {tp.partition: tp.offset for tp in poller.committed(tps, timeout=10)}
            now = time.perf_counter()
            if first is None and any(o > 0 for o in committed.values()):
                first = now
            if all(committed[p] >= high for p, high in wl.highs.items()):
                break
            time.sleep(0.05)
        end = time.perf_counter()
    finally:
        poller.close()
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
    return end - t0, end - (first or t0)


def run(ctx: Context) -> dict[str, Any]:
    wl = ctx.workload
    one: list[tuple[float, float]] = []
    two: list[tuple[float, float]] = []
    for _ in range(ctx.runs):
        one.append(one_run(ctx, 1))
        two.append(one_run(ctx, 2))
    rate1 = [wl.events / t for t, _ in one]
    rate2 = [wl.events / t for t, _ in two]
    steady1 = [wl.events / s for _, s in one]
    steady2 = [wl.events / s for _, s in two]
    r = ratio("two / one (spawn -> all committed)", rate2, rate1)
    rs = ratio("two / one (steady)", steady2, steady1)
    return result(
        ctx,
        "scaleout",
        "Scale-out: one vs two processor processes in one group",
        workload=wl.describe(),
        value=measure("two processes, spawn -> all committed", "events/s", rate2),
        baseline=measure("one process, spawn -> all committed", "events/s", rate1),
        ratio=r,
        targets=[
            {
                "text": "no target; 2 cores shared with the broker and the bench "
                f"(median ratio {r['median']:.3f})",
                "met": None,
            }
        ],
        rows=[
            [
                "one process, steady (first commit -> all committed), events/s",
                _fmt(measure("", "", steady1)),
            ],
            ["two processes, steady, events/s", _fmt(measure("", "", steady2))],
            [rs["label"], _fmt(rs)],
        ],
        raw={"one": one, "two": two},
    )


def _fmt(m: dict[str, Any]) -> str:
    return f"{m['median']:g} (min {m['min']:g}, max {m['max']:g})"
