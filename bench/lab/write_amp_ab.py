"""Issue 12's last "done when": throughput, latency and restore before / after the parted format.

The box is shared and noisy, so the two revisions are measured alternately
(ABAB...) with the same command, each run a directory holding that run's
``throughput.json``, ``latency.json`` and ``restore.json`` (what ``python -m
bench --only throughput,latency,restore --no-report`` writes into
``bench/results``) plus ``run.json`` (side, revision, start, load averages).
This module folds those directories into ``bench/results/write_amp_ab.json``,
which ``bench/report.py`` renders under figures 1, 3 and 5:

    python -m bench.lab.write_amp_ab RUN_DIR... [--note TEXT]

Per figure and side: the median over runs of each run's median (value,
baseline, ratio); the ratio (a service figure over its same-run baseline)
is the comparison that survives the noise best.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.common import RESULTS

FIGURES = ("throughput", "latency", "restore")
#: Detail rows (label prefix in the figure's ``rows``) also compared, per figure.
DETAILS = {
    "throughput": ("transactions per run",),
    "latency": ("p50 (ms)", "processor: mean transaction time"),
    "restore": ("restore_seconds (checkpoint load + anchor check), long",),
}
#: Which way is better, per unit.
BETTER = {"events/s": "higher is better", "ms": "lower is better", "s": "lower is better"}
OUT = RESULTS / "write_amp_ab.json"


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 3) if xs else None


def collect(runs: list[Path]) -> dict[str, Any]:
    """The document ``report.py`` renders: per figure, per side, medians and samples."""
    sides: dict[str, dict[str, Any]] = {}
    meta: list[dict[str, Any]] = []
    figures: dict[str, dict[str, Any]] = {}
    for run in runs:
        info = json.loads((run / "run.json").read_text())
        meta.append(info)
        side = info["side"]
        sides.setdefault(side, {"revision": info["revision"], "runs": 0})["runs"] += 1
        for name in FIGURES:
            path = run / f"{name}.json"
            if not path.exists():
                continue
            doc = json.loads(path.read_text())
            fig = figures.setdefault(name, {"title": doc.get("title", name), "sides": {}})
            per = fig["sides"].setdefault(side, {"value": [], "baseline": [], "ratio": []})
            per["runs"] = per.get("runs", 0) + 1  # invocations that measured this figure
            for part in ("value", "baseline", "ratio"):
                if doc.get(part, {}).get("median") is not None:
                    per[part].append(doc[part]["median"])
            for part in ("value", "baseline", "ratio"):
                fig.setdefault("labels", {})[part] = doc.get(part, {}).get("label", part)
                fig.setdefault("units", {})[part] = doc.get(part, {}).get("unit", "")
            for label, text in doc.get("rows", []):
                for prefix in DETAILS.get(name, ()):
                    if label.startswith(prefix):
                        per.setdefault("details", {}).setdefault(label, []).append(
                            float(str(text).split()[0])
                        )
    for fig in figures.values():
        for per in fig["sides"].values():
            for part in ("value", "baseline", "ratio"):
                per[f"{part}_median"] = _median(per[part])
    return {"figure": "write_amp_ab", "sides": sides, "runs": meta, "figures": figures}


#: Column order of the sides a run.json may name (before the parted format,
#: main before bundles, after).
SIDES = ("before", "main", "after")


def _change(num: float | None, den: float | None) -> str:
    return f"{num / den:.2f}" if num is not None and den else ""


def rows(doc: dict[str, Any], name: str) -> list[str]:
    """Markdown of one figure's before / after table (empty when not measured)."""
    fig = doc.get("figures", {}).get(name)
    if not fig:
        return []
    order = [s for s in SIDES if s in fig["sides"]]
    sides = doc["sides"]
    head = " | ".join(
        f"{s} (`{sides[s]['revision']}`, {fig['sides'][s].get('runs', sides[s]['runs'])} x)"
        for s in order
    )
    # the last side against each earlier one (before / after: one column)
    pairs = [(s, order[-1]) for s in order[:-1]]
    heads = " | ".join(f"{b} / {a}" for a, b in pairs)
    out = [
        f"#### {fig['title']}: {' / '.join(order)} (issue 12, alternated runs on the real broker)",
        "",
        f"| median of run medians | {head} | {heads} |",
        "|---|" + "---:|" * (len(order) + len(pairs)),
    ]
    for part in ("value", "baseline", "ratio"):
        vals = [fig["sides"][s][f"{part}_median"] for s in order]
        unit = fig["units"].get(part) or ""
        change = " | ".join(_change(vals[order.index(b)], vals[order.index(a)]) for a, b in pairs)
        samples = " | ".join(
            f"{v} ({', '.join(str(x) for x in fig['sides'][s][part])})"
            for v, s in zip(vals, order, strict=True)
        )
        better = BETTER.get(unit, "") if part == "value" else ""
        label = f"{part}: {fig['labels'].get(part, part)} {unit}"
        label += f" ({better})" if better else ""
        out.append(f"| {label} | {samples} | {change} |")
    labels = sorted({k for s in order for k in fig["sides"][s].get("details", {})})
    for label in labels:
        per_side = [fig["sides"][s].get("details", {}).get(label, []) for s in order]
        meds = [_median(xs) for xs in per_side]
        change = " | ".join(_change(meds[order.index(b)], meds[order.index(a)]) for a, b in pairs)
        cells = " | ".join(
            f"{m} ({', '.join(str(x) for x in xs)})" for m, xs in zip(meds, per_side, strict=True)
        )
        out.append(f"| detail: {label} | {cells} | {change} |")
    measured = [r for r in doc.get("runs", []) if name in r.get("figures", name)]
    loads = ", ".join(
        f"{r['side']} {r.get('load_start', '?')}->{r['load_end']}"
        for r in measured
        if "load_end" in r
    )
    out += [
        "",
        f"- command per run: `{doc.get('command', '')}`, sides alternated "
        f"({' '.join(r['side'] for r in measured)}); "
        f"1-minute load average at start -> end of each run: {loads}",
    ]
    if doc.get("note") and name == FIGURES[0]:
        out.append(f"- {doc['note']}")
    return [*out, ""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.lab.write_amp_ab", description=__doc__)
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--command", default="python -m bench --only throughput,latency,restore")
    ap.add_argument("--note", default="")
    args = ap.parse_args(argv)
    doc = collect(args.runs)
    doc["command"], doc["note"] = args.command, args.note
    RESULTS.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(doc, indent=2) + "\n")
    for name in FIGURES:
        print("\n".join(rows(doc, name)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
