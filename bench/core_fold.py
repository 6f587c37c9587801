"""Core fold speed (offline, no Kafka): :mod:`bench.fold_speed` as a suite figure.

Runs ``bench.fold_speed`` (one long generated session folded by the core,
baselines ``json`` = orjson.loads per line and ``envelope`` = parse +
validate + freeze, interleaved) and reports the fold rate against the
envelope baseline.  Its own JSON goes to ``bench/results/tmp/``.
"""

from __future__ import annotations

from typing import Any

from bench import fold_speed
from bench.common import Context, result

EVENTS = 30_000
#: CPU microseconds per event of the whole offline fold (JSON line -> folded
#: session), the fixed target of the core.
TARGET_US = 4.0


def run(ctx: Context) -> dict[str, Any]:
    raw_path = ctx.results / "tmp" / "fold_speed_raw.json"
    raw: dict[str, Any] = fold_speed.main(
        ["--events", str(EVENTS), "--runs", str(ctx.runs), "--out", str(raw_path)]
    )
    rates: dict[str, dict[str, Any]] = raw["events_per_s"]
    fold, env, js = rates["fold"], rates["envelope"], rates["json"]
    ratio = raw["ratio_fold_to_envelope"]
    us: dict[str, float] = raw["cpu_us_per_event_median"]
    return result(
        ctx,
        "fold_speed",
        "Core fold speed, offline (bench/fold_speed.py)",
        workload=f"one generated session of {EVENTS:,} events, "
        f"{raw['file_bytes'] / 2**20:.1f} MiB JSONL",
        value={"label": "core fold (processor fold)", "unit": "events/s", **fold},
        baseline={
            "label": "envelope: orjson + parse_event (validate + freeze)",
            "unit": "events/s",
            **env,
        },
        ratio={
            "label": "fold / envelope (of medians)",
            "median": ratio,
            "min": ratio,
            "max": ratio,
        },
        targets=[
            {
                "text": f"core fold <= {TARGET_US:g} us CPU per event (median {us['fold']:.2f} us)",
                "met": us["fold"] <= TARGET_US,
            }
        ],
        rows=[
            [
                "CPU us per event, median: fold / envelope / json",
                f"{us['fold']:.2f} / {us['envelope']:.2f} / {us['json']:.2f}",
            ],
            [
                "json only: orjson.loads per line (events/s)",
                f"{js['median']:,} (min {js['min']:,}, max {js['max']:,})",
            ],
            ["fold / json (of medians)", f"{raw['ratio_fold_to_json']}"],
            [
                "exact command of the underlying bench",
                f"python -m bench.fold_speed --events {EVENTS} --runs {ctx.runs}",
            ],
        ],
    )
