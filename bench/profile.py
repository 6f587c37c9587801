"""Where the time goes: one Processor run of figure 1's workload, profiled twice.

The Processor folds the whole events topic into fresh output topics (same
as a figure-1 run):

1. **py-spy** (sampling from outside the process, ``--idle`` so time blocked
   in librdkafka calls counts too, 1000 Hz, non-blocking) over a child process
   (``python -m bench.profile --child ...``): nearly no overhead, so its
   percentages are the ones to trust;
2. **pyinstrument** (1 ms, in-process, main thread): its call tree is kept in
   ``bench/results/profile.txt``; its per-call overhead inflates deep
   recursive helpers (``freeze``/``thaw``), so read its percentages with care.

Per profiler, two tables: **inclusive** (a function and everything it
calls, % of the run, recursion counted once per stack) and **self** (the
function's own code, C calls it makes included).  Both tools are installed
into this environment with pip when missing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.common import REPO, Context, python_env, result
from bench.throughput import fresh_output, service

PYSPY_RATE = 1000
#: frames above the Processor (interpreter start, this bench): left out of the tables
_WRAPPERS = ("<frozen runpy>", "bench/")
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")

TOP = 25


def _name(frame: Any) -> str:
    path = frame.file_path_short or frame.file_path or "?"
    path = path.replace(str(REPO) + "/", "")
    return f"{path}:{frame.function} (line {frame.line_no})"


def _walk(
    frame: Any, inclusive: dict[str, float], self_time: dict[str, float], ancestors: frozenset[str]
) -> None:
    if frame.function == "[self]":
        return  # pyinstrument's synthetic self-time node: counted in the parent's self time
    name = _name(frame)
    if name not in ancestors:  # recursion: count the outermost call only
        inclusive[name] += frame.time
    self_time[name] += frame.total_self_time
    inner = ancestors | {name}
    for child in frame.children:
        _walk(child, inclusive, self_time, inner)


def ensure_tools() -> list[str]:
    """pip-install pyinstrument and py-spy when missing; returns what is still missing."""
    wanted = {
        "pyinstrument": importlib.util.find_spec("pyinstrument") is not None,
        "py-spy": _pyspy() is not None,
    }
    missing = [name for name, ok in wanted.items() if not ok]
    if missing:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", *missing], capture_output=True
        )
    still = []
    if importlib.util.find_spec("pyinstrument") is None:
        still.append("pyinstrument")
    if _pyspy() is None:
        still.append("py-spy")
    return still


def _pyspy() -> str | None:
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def _frame_key(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if m is None:
        return frame.strip()
    path = m["file"].replace(str(REPO) + "/", "")
    path = re.sub(r"^.*/site-packages/", "", path)
    return f"{path}:{m['func']}"


def parse_collapsed(text: str) -> tuple[dict[str, float], dict[str, float], int]:
    """Inclusive and self sample counts per function from py-spy's raw output."""
    inclusive: dict[str, float] = defaultdict(float)
    self_time: dict[str, float] = defaultdict(float)
    total = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_frame_key(f) for f in stack.split(";") if f.strip()]
        if not frames:
            continue
        # py-spy puts the thread name first: drop it (not a function)
        frames = [f for f in frames if not f.startswith("thread (")]
        total += n
        for key in set(frames):
            inclusive[key] += n
        if frames:
            self_time[frames[-1]] += n
    return inclusive, self_time, total


def pyspy_profile(ctx: Context) -> dict[str, Any]:
    spy = _pyspy()
    if spy is None:
        return {"error": "py-spy is not installed (pip install py-spy)"}
    wl = ctx.workload
    config = fresh_output(ctx, "pyspy")
    out = ctx.results / "tmp" / "pyspy.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    child = [
        sys.executable,
        "-m",
        "bench.profile",
        "--child",
        json.dumps(
            {
                "bootstrap": ctx.bootstrap,
                "events_topic": wl.events_topic,
                "prefix": config.topic_prefix,
                "highs": wl.highs,
            }
        ),
    ]
    argv = [
        spy,
        "record",
        "--idle",
        "--nonblocking",
        "-r",
        str(PYSPY_RATE),
        "-f",
        "raw",
        "-o",
        str(out),
        "--",
        *child,
    ]
    done = subprocess.run(
        argv, cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0 or not out.exists():
        return {"error": f"py-spy failed (exit {done.returncode}): {done.stderr[-1500:]}"}
    inclusive, self_time, total = parse_collapsed(out.read_text())
    child_out = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]

    def top(table: dict[str, float]) -> list[list[Any]]:
        rows = sorted(
            ((k, v) for k, v in table.items() if not k.startswith(_WRAPPERS)), key=lambda kv: -kv[1]
        )[:TOP]
        return [[name, round(100 * n / total, 1), int(n)] for name, n in rows]

    return {
        "samples": total,
        "rate_hz": PYSPY_RATE,
        "run": json.loads(child_out[-1]) if child_out else None,
        "inclusive": top(inclusive),
        "self": top(self_time),
    }


def _child(spec: dict[str, Any]) -> None:
    from processor.config import ServiceConfig

    highs = {int(p): int(h) for p, h in spec["highs"].items()}
    prefix = spec["prefix"]
    config = ServiceConfig(
        bootstrap_servers=spec["bootstrap"],
        topic_prefix=prefix,
        events_topic=spec["events_topic"],
        group_id=f"{prefix}-group",
        instance_id=f"{prefix}-0",
        partitions=len(highs),
    )
    svc, _ = service(config, highs, watch_first=False)
    print(
        json.dumps(
            {
                "events": svc.events,
                "seconds": round(svc.seconds, 3),
                "events_per_s": round(svc.rate),
            }
        )
    )


def pyinstrument_profile(ctx: Context) -> dict[str, Any]:
    from pyinstrument import Profiler

    wl = ctx.workload
    profiler = Profiler(interval=0.001)
    t0 = time.perf_counter()
    svc, _ = service(fresh_output(ctx, "profile"), wl.highs, profiler=profiler)
    wall = time.perf_counter() - t0
    session = profiler.last_session
    root = session.root_frame()
    total = root.time if root is not None else 0.0
    inclusive: dict[str, float] = defaultdict(float)
    self_time: dict[str, float] = defaultdict(float)
    if root is not None:
        _walk(root, inclusive, self_time, frozenset())
    text = profiler.output_text(unicode=False, color=False, show_all=False)
    (ctx.results / "profile.txt").write_text(text)

    def top(table: dict[str, float]) -> list[list[Any]]:
        rows = sorted(table.items(), key=lambda kv: -kv[1])[:TOP]
        return [[name, round(100 * t / total, 1), round(t, 3)] for name, t in rows]

    return {
        "run": {
            "events": svc.events,
            "seconds": round(svc.seconds, 3),
            "events_per_s": round(svc.rate),
            "wall": round(wall, 3),
        },
        "sampled_s": round(total, 3),
        "inclusive": top(inclusive),
        "self": top(self_time),
    }


def run(ctx: Context) -> dict[str, Any]:
    missing = ensure_tools()
    spy = (
        pyspy_profile(ctx)
        if "py-spy" not in missing
        else {"error": "py-spy could not be installed"}
    )
    inst = (
        pyinstrument_profile(ctx)
        if "pyinstrument" not in missing
        else {"error": "pyinstrument could not be installed"}
    )
    return result(
        ctx,
        "profile",
        "Where the time goes (one Processor run of figure 1)",
        workload=ctx.workload.describe(),
        pyspy=spy,
        pyinstrument=inst,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", required=True, help="JSON: bootstrap, events_topic, prefix, highs")
    _child(json.loads(ap.parse_args().child))


if __name__ == "__main__":
    main()
