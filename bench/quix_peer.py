"""Figure 2: the same fold in Quix Streams (state store + exactly-once) vs the Processor.

Quix Streams is not a project dependency: it lives in its own plain venv,
``bench/.venv-quix`` (its confluent-kafka pin differs from ours), made on
first use with ``pip install quixstreams==<QUIX_VERSION>``, this checkout
``--no-deps`` and the processor's pure-Python deps.  The peer app is
:mod:`bench.quix_app` (its docstring says exactly what it does), run as a
subprocess of that venv's python.

Per run, back to back on the same events topic: one Processor run (as in
figure 1: exactly-once, fresh group and output topics, until committed),
then one Quix run (fresh consumer group, so fresh changelog topics, fresh
state dir, same commit interval as the Processor).  Rates are events/s
from the first record to the end of the run (all committed).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import build as bench_build
from bench.build import running_build
from bench.common import REPO, Context, measure, ratio, result, unique
from bench.throughput import fresh_output, service

VENV = REPO / "bench" / ".venv-quix"
#: the Quix app folds with the same build as the Processor it is compared with:
#: with the compiled bench (bench.build), a second venv holds the compiled wheel
VENV_COMPILED = REPO / "bench" / "results" / "tmp" / "venv-quix-compiled"
QUIX_VERSION = "3.28.1"
PROCESSOR_DEPS = ("fastavro", "orjson", "zstandard", "click", "tqdm", "prometheus-client")
#: The Processor is at least this many times as fast as Quix in every run.
TARGET = 5.0
_PROBE = "import quixstreams, fastavro, zstandard, processor.core.session as s; print(s.__file__)"


def venv_dir() -> Path:
    return VENV_COMPILED if running_build() == "compiled" else VENV


def venv_python() -> Path:
    return venv_dir() / "bin" / "python"


def ensure_venv(log: Any = print) -> Path:
    """A venv with Quix Streams and this build of the processor, unless one already works."""
    venv, compiled = venv_dir(), running_build() == "compiled"
    py = venv / "bin" / "python"
    check = [str(py), "-c", _PROBE]
    # the compiled venv is current when it holds the wheel of the bench venv's sources
    stamp, want = venv / "source.sha256", bench_build.VENV / "source.sha256"
    current = not compiled or (
        stamp.exists() and want.exists() and stamp.read_text() == want.read_text()
    )
    if py.exists() and current:
        done = subprocess.run(check, capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip().endswith(".py") != compiled:
            return py
    log(f"creating {venv} (quixstreams=={QUIX_VERSION}) ...")
    shutil.rmtree(venv, ignore_errors=True)
    this = (
        ["--no-index", "--find-links", str(bench_build.wheelhouse()), "processor"]
        if compiled
        else ["-e", str(REPO)]
    )
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(py), "-m", "pip", "install", "-q", f"quixstreams=={QUIX_VERSION}"],
        [str(py), "-m", "pip", "install", "-q", "--no-deps", *this],
        [str(py), "-m", "pip", "install", "-q", *PROCESSOR_DEPS],
    ]
    for step in steps:
        # a clean environment: the compiled bench's PYTHONPATH must not reach pip
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
        if not compiled:
            env["PROCESSOR_MYPYC"] = "0"  # the editable install is the pure source
        done = subprocess.run(step, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(step)} failed:\n{done.stderr[-2000:]}")
    done = subprocess.run(check, capture_output=True, text=True)
    if done.returncode != 0 or done.stdout.strip().endswith(".py") == compiled:
        raise RuntimeError(f"the Quix venv does not import this build: {done.stdout}{done.stderr}")
    if compiled:
        stamp.write_text(want.read_text())
    return py


def quix_run(ctx: Context, py: Path, commit_interval_s: float) -> dict[str, Any]:
    wl = ctx.workload
    argv = [
        str(py),
        str(REPO / "bench" / "quix_app.py"),
        "--bootstrap",
        ctx.bootstrap,
        "--topic",
        wl.events_topic,
        "--group",
        unique("bench-quix"),
        "--count",
        str(wl.events),
        "--commit-interval",
        str(commit_interval_s),
    ]
    t0 = time.perf_counter()
    c0 = _children_cpu()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    cpu = _children_cpu() - c0
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"Quix app failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(lines[-1])
    out["process_wall"] = wall
    out["process_cpu"] = cpu
    if out["events"] != wl.events:
        raise RuntimeError(f"Quix app processed {out['events']} of {wl.events} events")
    return out


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(ctx: Context) -> dict[str, Any]:
    wl = ctx.workload
    try:
        py = ensure_venv()
    except Exception as exc:  # report plainly, never fake a number
        return result(
            ctx,
            "quix_peer",
            "Peer: Quix Streams (state store, exactly-once)",
            error=f"Quix Streams could not be installed: {exc}",
        )
    interval = ctx.config().commit_interval_ms / 1000
    services: list[float] = []
    service_cpu: list[float] = []
    loads: list[float] = []
    quix: list[dict[str, Any]] = []
    for _ in range(ctx.runs):
        loads.append(os.getloadavg()[0])
        svc, _ = service(fresh_output(ctx, "peer"), wl.highs)
        services.append(svc.rate)
        service_cpu.append(svc.cpu)
        try:
            quix.append(quix_run(ctx, py, interval))
        except Exception as exc:
            return result(
                ctx, "quix_peer", "Peer: Quix Streams (state store, exactly-once)", error=str(exc)
            )
    quix_rates = [wl.events / q["first_to_end"] for q in quix]
    r = ratio("Processor / Quix", services, quix_rates)
    return result(
        ctx,
        "quix_peer",
        "Peer: Quix Streams (state store, exactly-once) vs the Processor",
        workload=wl.describe(),
        value=measure("Processor, first record -> all committed", "events/s", services),
        baseline=measure(
            f"Quix Streams {QUIX_VERSION}, first record -> stopped after the "
            "last record (committed)",
            "events/s",
            quix_rates,
        ),
        ratio=r,
        targets=[
            {
                "text": f"Processor >= {TARGET:g} x Quix in every run "
                f"(lowest ratio {r['min']:.3f})",
                "met": r["min"] >= TARGET,
            }
        ],
        rows=[
            [
                "Quix process wall incl. interpreter + imports (s)",
                _fmt([q["process_wall"] for q in quix]),
            ],
            ["Quix commit_interval (s), same as the Processor's", f"{interval:g}"],
            ["Processor CPU seconds (its whole run)", _fmt(service_cpu)],
            [
                "Quix process CPU seconds (incl. interpreter + imports)",
                _fmt([q["process_cpu"] for q in quix]),
            ],
            [
                "Processor / Quix by CPU seconds (steadier on a shared box; Quix pays its start)",
                _fmt([q["process_cpu"] / c for q, c in zip(quix, service_cpu, strict=True)]),
            ],
            [
                "1-minute load average at the start of each run",
                ", ".join(f"{x:.1f}" for x in loads),
            ],
        ],
        notes=[
            "Quix app: bench/quix_app.py - per record: codec.decode_event + to_event, "
            "Session.append (same core, same registries), log.trim_before, "
            "state.set('checkpoint', session.checkpoint()) into the RocksDB state store "
            "(changelog-backed); processing_guarantee='exactly-once'; no views output "
            "(the Processor also publishes changed views every batch)."
        ],
        raw={"quix": quix},
    )


def _fmt(samples: list[float]) -> str:
    m = measure("", "", samples, 2)
    return f"{m['median']:g} (min {m['min']:g}, max {m['max']:g})"
