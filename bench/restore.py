"""Figure 3: restore cost after a restart, short vs 100x longer log behind the checkpoint.

Two events topics with the same session ids (``SESSIONS`` sessions on 12
partitions): *short* has ``SHORT`` events per session behind the
checkpoint, *long* has ``100 x SHORT``.  Set-up: produce that log and fold
it with one Processor until committed (checkpoints + offsets).  Then, per
run, for each variant in turn: produce the same small tail (``TAIL`` more
events per session), start a new Processor of the same group and instance
id, and time from its construction to ``run(until_offsets=...)`` returning
(tail folded, views + checkpoints + offsets committed, consumer closed):
restore of every checkpoint, anchor checks, group join and the tail fold.
The restarts are in-process, so interpreter start-up (the same for both)
is left out.  Each run's tail is folded from the previous run's checkpoint,
so the log behind the checkpoint grows by ``TAIL`` per run on both sides.
Each run also restarts both variants once more with ``TUNED`` librdkafka
settings (an experiment row; the figure uses the shipped settings).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING

from bench.common import Context, group_offsets, measure, ratio, result, unique
from bench.workload import create, high_watermarks, interleave, produce, session_logs
from processor.config import ServiceConfig
from processor.core.events import Event
from processor.kafka import clients
from processor.kafka.reads import read_partitions
from processor.service.loop.runner import Processor
from processor.telemetry.metrics import Metrics

SESSIONS = 100
SHORT = 10
LONG_FACTOR = 100
TAIL = 2
TARGET = 1.5
IDLE_S = 30.0  # a restart that makes no progress this long is a failure, not a hang
#: experiment: restores without fetch long-polling (librdkafka's default waits 500 ms)
TUNED = {"fetch.wait.max.ms": "10"}


@dataclass
class Variant:
    name: str
    behind: int
    config: ServiceConfig
    logs: list[tuple[str, list[Event]]]
    produced: int = 0  # events per session produced so far
    setup_s: float = 0.0


def _produce_slice(v: Variant, start: int, stop: int) -> None:
    produce(v.config, interleave([(sid, evs[start:stop]) for sid, evs in v.logs]))
    v.produced = stop


def _fold(v: Variant, kafka: dict[str, str] | None = None) -> tuple[float, Metrics]:
    metrics = Metrics()
    config = v.config.with_overrides(kafka=kafka) if kafka else v.config
    highs = high_watermarks(v.config)
    t0 = time.perf_counter()
    Processor(config, metrics=metrics).run(
        until_offsets=highs, max_idle_s=IDLE_S, max_wait_s=IDLE_S
    )
    seconds = time.perf_counter() - t0
    done = group_offsets(v.config, v.config.group_id, v.config.topics.events, highs)
    behind = {p: (done.get(p), h) for p, h in highs.items() if h > 0 and done.get(p, -1) < h}
    if behind:
        raise RuntimeError(
            f"{v.name}: the restarted processor stopped idle without catching "
            f"up (partition: (committed, high)) {behind}"
        )
    return seconds, metrics


def _checkpoint_bytes(config: ServiceConfig) -> float:
    """Average size of the newest checkpoint record per session."""
    consumer = clients.plain_consumer(config, "bench-cp-size")
    try:
        parts = read_partitions(
            consumer,
            config.topics.checkpoints,
            {p: OFFSET_BEGINNING for p in range(config.partitions)},
        )
    finally:
        consumer.close()
    newest: dict[bytes, int] = {}
    for msgs in parts.values():
        for m in msgs:
            if m.key() is not None:
                newest[m.key() or b""] = len(m.value() or b"")
    return sum(newest.values()) / max(len(newest), 1)


def _records(config: ServiceConfig) -> int:
    return sum(high_watermarks(config, config.topics.checkpoints).values())


def setup(ctx: Context, name: str, behind: int) -> Variant:
    prefix = unique(f"bench-restore-{name}")
    config = ctx.config(topic_prefix=prefix, group_id=f"{prefix}-group", instance_id=f"{prefix}-0")
    create(config)
    length = behind + TAIL * ctx.runs
    logs = list(session_logs(SESSIONS, length, seed=23, tag="restore"))
    v = Variant(name, behind, config, logs)
    _produce_slice(v, 0, behind)
    v.setup_s, _ = _fold(v)
    return v


def run(ctx: Context) -> dict[str, Any]:
    variants = [setup(ctx, "short", SHORT), setup(ctx, "long", SHORT * LONG_FACTOR)]
    times: dict[str, list[float]] = {v.name: [] for v in variants}
    restore_s: dict[str, list[float]] = {v.name: [] for v in variants}
    tuned: dict[str, list[float]] = {v.name: [] for v in variants}
    tuned_restore: dict[str, list[float]] = {v.name: [] for v in variants}
    for _ in range(ctx.runs):
        for v in variants:  # alternate, so drift hits both alike
            _produce_slice(v, v.produced, v.produced + TAIL)
            seconds, metrics = _fold(v)
            times[v.name].append(seconds)
            restore_s[v.name].append(metrics.restore_seconds._sum.get())
        for v in variants:  # the same restart with TUNED client settings
            _produce_slice(v, v.produced, v.produced + TAIL)
            seconds, metrics = _fold(v, TUNED)
            tuned[v.name].append(seconds)
            tuned_restore[v.name].append(metrics.restore_seconds._sum.get())
    short, long = variants
    r = ratio("long / short", times["long"], times["short"])
    return result(
        ctx,
        "restore",
        "Restore cost: restart to caught-up, short vs 100x longer log",
        workload=(
            f"{SESSIONS} sessions; {SHORT} vs {SHORT * LONG_FACTOR} events per session "
            f"behind the checkpoint, tail {TAIL} events per session per run"
        ),
        value=measure(f"long log ({long.behind} events/session behind)", "s", times["long"], 3),
        baseline=measure(
            f"short log ({short.behind} events/session behind)", "s", times["short"], 3
        ),
        ratio=r,
        targets=[
            {
                "text": f"long / short <= {TARGET} (median ratio {r['median']:.3f})",
                "met": r["median"] <= TARGET,
            }
        ],
        rows=[
            [
                "restore_seconds (checkpoint load + anchor check), short (s)",
                _fmt(restore_s["short"]),
            ],
            ["restore_seconds (checkpoint load + anchor check), long (s)", _fmt(restore_s["long"])],
            [
                "avg newest checkpoint record, short (bytes)",
                f"{_checkpoint_bytes(short.config):.0f}",
            ],
            ["avg newest checkpoint record, long (bytes)", f"{_checkpoint_bytes(long.config):.0f}"],
            [
                "records in the checkpoints topic at the end (sum of high watermarks, "
                "transaction markers included), short / long",
                f"{_records(short.config)} / {_records(long.config)}",
            ],
            [f"experiment, {_tuned()}: restart -> caught up, short (s)", _fmt(tuned["short"])],
            [f"experiment, {_tuned()}: restart -> caught up, long (s)", _fmt(tuned["long"])],
            [
                f"experiment, {_tuned()}: long / short",
                _fmt([a / b for a, b in zip(tuned["long"], tuned["short"], strict=True)]),
            ],
            [
                f"experiment, {_tuned()}: restore_seconds short / long (s)",
                f"{_fmt(tuned_restore['short'])} / {_fmt(tuned_restore['long'])}",
            ],
            [
                "set-up fold of the whole log, short / long (s)",
                f"{short.setup_s:.2f} / {long.setup_s:.2f}",
            ],
        ],
        notes=[
            "A longer session also has more state (surface nodes, open transcript page, "
            "projection rows), so some growth of the checkpoint and its decode is "
            "inherent; the checkpoint sizes above show how much."
        ],
    )


def _tuned() -> str:
    return ", ".join(f"{k}={v}" for k, v in TUNED.items())


def _fmt(samples: Sequence[float]) -> str:
    m = measure("", "", samples, 3)
    return f"{m['median']:g} (min {m['min']:g}, max {m['max']:g})"


# ---------------------------------------------------------------- 100x sessions

#: same-host restart with 100x more sessions in the partitions (issue 13)
FEW = 100
EVENTS_EACH = 8
ACTIVE_TAIL = 100  # sessions that get the tail: the same in both variants


def _restart(config: ServiceConfig) -> dict[str, float]:
    """One restart on the same host (same state dir and instance id): seconds to
    the first event consumed for folding, and to caught up (run returns)."""
    import threading

    metrics = Metrics()
    highs = high_watermarks(config)
    proc = Processor(config, metrics=metrics)
    t0 = time.perf_counter()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            proc.run(until_offsets=highs, max_idle_s=IDLE_S, max_wait_s=IDLE_S)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    first = None
    while thread.is_alive():
        folded = metrics.registry.get_sample_value("processor_records_consumed_total") or 0
        if first is None and folded:
            first = time.perf_counter() - t0
        time.sleep(0.005)
    caught_up = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"restart failed: {errors[0]!r}")
    return {
        "first_s": first if first is not None else caught_up,
        "caught_up_s": caught_up,
        "restore_s": metrics.restore_seconds._sum.get(),
        "store_records_read": metrics.registry.get_sample_value(
            "processor_store_records_read_total"
        )
        or 0.0,
    }


def sessions_run(bootstrap: str, runs: int = 3, few: int = FEW) -> dict[str, Any]:
    """``few`` vs ``100 x few`` sessions folded once; then, alternating, the same
    tail for ``ACTIVE_TAIL`` of them and a same-host restart of the member."""
    import tempfile

    state = tempfile.mkdtemp(prefix="bench-restart-")
    pool = [evs for _, evs in session_logs(300, EVENTS_EACH + TAIL * runs, seed=29, tag="rs")]
    variants = []
    for name, n in (("few", few), ("many", few * LONG_FACTOR)):
        prefix = unique(f"bench-restart-{name}")
        config = ServiceConfig(bootstrap_servers=bootstrap).with_overrides(
            topic_prefix=prefix,
            group_id=f"{prefix}-group",
            instance_id=f"{prefix}-0",
            state_dir=f"{state}/{name}",
        )
        create(config)
        logs = [(f"{name}-{i:06d}", pool[i % len(pool)]) for i in range(n)]
        produce(config, interleave([(sid, evs[:EVENTS_EACH]) for sid, evs in logs]))
        t0 = time.perf_counter()
        Processor(config, metrics=Metrics()).run(
            until_offsets=high_watermarks(config), max_idle_s=IDLE_S, max_wait_s=IDLE_S
        )
        variants.append((name, n, config, logs, time.perf_counter() - t0))
    out: dict[str, Any] = {"setup": {name: s for name, _, _, _, s in variants}}
    for r in range(runs):
        for name, _, config, logs, _ in variants:  # alternate: drift hits both alike
            lo = EVENTS_EACH + TAIL * r
            tail = [(sid, evs[lo : lo + TAIL]) for sid, evs in logs[:ACTIVE_TAIL]]
            produce(config, interleave(tail))
            out.setdefault(name, []).append(_restart(config))
    return out


def main() -> None:
    import argparse
    import json
    import logging

    ap = argparse.ArgumentParser(description="same-host restart, few vs 100x sessions")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--few", type=int, default=FEW)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from processor.devbroker import LocalBroker

    broker = LocalBroker()
    try:
        out = sessions_run(broker.start(), args.runs, args.few)
    finally:
        broker.stop()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
