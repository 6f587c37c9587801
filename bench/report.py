"""Render the generated report from ``bench/results/*.json``.

``python -m bench.report`` re-renders without measuring anything.  It writes
``bench/results/REPORT.md``, never ``BENCHMARKS.md``: that file is written by
hand (the verdicts, the method, what the unmet targets mean), and a re-render
over it once wiped every hand-written section the JSON files do not hold.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from bench.common import RESULTS

ORDER = (
    "throughput",
    "quix_peer",
    "restore",
    "replay",
    "latency",
    "memory",
    "scaleout",
    "write_amp",
    "fold_speed",
    "ship",
    "failover",
)
NUMBER = {
    "throughput": "1",
    "quix_peer": "2",
    "restore": "3",
    "replay": "4",
    "latency": "5",
    "memory": "6",
    "scaleout": "7",
    "write_amp": "8",
    "fold_speed": "core",
    "state_budget": "9",
    "ship": "ship",
    "failover": "failover",
}
PROFILE_ROWS = 15


def _num(x: Any) -> str:
    if isinstance(x, float):
        if abs(x) >= 100:
            return f"{x:,.0f}"
        return f"{x:.3g}"
    if isinstance(x, int):
        return f"{x:,}"
    return str(x)


def _met(flag: bool | None) -> str:
    return {True: "**target met**", False: "**target not met**", None: "no target"}[flag]


def one_line(doc: dict[str, Any]) -> str:
    if doc.get("error"):
        return f"FAILED: {doc['error'][:200]}"
    if "ratio" not in doc:
        return "done"
    r = doc["ratio"]
    v = doc.get("value", {})
    met = [t.get("met") for t in doc.get("targets", [])]
    verdict = (
        "" if not met or met[0] is None else (" (target met)" if met[0] else " (target not met)")
    )
    return (
        f"{_num(v.get('median'))} {v.get('unit', '')}, ratio {_num(r['median'])} "
        f"[{_num(r['min'])}..{_num(r['max'])}]{verdict}"
    )


def _load(results: Path) -> dict[str, dict[str, Any]]:
    docs: dict[str, dict[str, Any]] = {}
    for path in sorted(results.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except ValueError:
            continue
        if isinstance(doc, dict) and "figure" in doc:
            docs[doc["figure"]] = doc
    return docs


def _figure(doc: dict[str, Any]) -> list[str]:
    n = NUMBER.get(doc["figure"], "")
    out = [f"## {n}. {doc['title']}" if n.isdigit() else f"## {doc['title']}", ""]
    if doc.get("error"):
        out += [f"**Not measured — failed:** `{doc['error']}`", ""]
    else:
        out += ["| | median | min | max | unit | samples |", "|---|---:|---:|---:|---|---|"]
        for key in ("value", "baseline"):
            m = doc.get(key)
            if m:
                samples = ", ".join(_num(s) for s in m.get("samples", []))
                out.append(
                    f"| {key}: {m['label']} | {_num(m['median'])} | {_num(m['min'])} | "
                    f"{_num(m['max'])} | {m.get('unit', '')} | {samples} |"
                )
        r = doc.get("ratio")
        if r:
            samples = ", ".join(_num(s) for s in r.get("samples", []))
            out.append(
                f"| **ratio: {r['label']}** | **{_num(r['median'])}** | {_num(r['min'])} "
                f"| {_num(r['max'])} | | {samples} |"
            )
        out.append("")
        for t in doc.get("targets", []):
            out.append(f"- {_met(t.get('met'))}: {t['text']}")
        if doc.get("rows"):
            out += ["", "| detail | value |", "|---|---|"]
            out += [f"| {name.strip()} | {value} |" for name, value in doc["rows"]]
        out.append("")
    if doc.get("workload"):
        out.append(f"- workload: {doc['workload']}")
    out.append(
        f"- revision `{doc.get('revision')}`, {doc.get('date')}, runs: {doc.get('runs')}"
        f", took {doc.get('duration_s', '?')} s, build: {doc.get('build', 'pure')}"
    )
    out.append(f"- command: `{doc.get('command')}`")
    for note in doc.get("notes", []):
        out.append(f"- {note}")
    return [*out, ""]


def _profile(doc: dict[str, Any]) -> list[str]:
    out = ["## Where the time goes (profile of one figure-1 Processor run)", ""]
    if doc.get("error"):
        return [*out, f"**Not measured — failed:** `{doc['error']}`", ""]
    for tool, title in (
        ("pyspy", "py-spy (sampling from outside, --idle; trust these %)"),
        ("pyinstrument", "pyinstrument (in-process; inflates deep recursion)"),
    ):
        part = doc.get(tool) or {}
        out += [f"### {title}", ""]
        if part.get("error"):
            out += [f"not available: `{part['error']}`", ""]
            continue
        run = part.get("run") or {}
        unit = "samples" if tool == "pyspy" else "s"
        extra = f", {part.get('samples')} samples" if tool == "pyspy" else ""
        out.append(
            f"Profiled run: {run.get('events')} events in {run.get('seconds')} s "
            f"({run.get('events_per_s')} events/s under the profiler{extra})."
        )
        out.append("")
        for kind in ("inclusive", "self"):
            out += [
                f"{kind.capitalize()} time, top {PROFILE_ROWS}:",
                "",
                f"| function | % of run | {unit} |",
                "|---|---:|---:|",
            ]
            out += [
                f"| `{name}` | {pct} | {sec} |"
                for name, pct, sec in part.get(kind, [])[:PROFILE_ROWS]
            ]
            out.append("")
    out += [
        f"- revision `{doc.get('revision')}`, {doc.get('date')}; command: "
        f"`{doc.get('command')}`; full pyinstrument tree: `bench/results/profile.txt`",
        "",
    ]
    return out


#: (label, key in ``measured.amp`` or a callable of ``measured``) of the before/after table
_AMP_ROWS: tuple[tuple[str, str], ...] = (
    ("ratio at 100 events (key + value)", "first"),
    ("ratio at N events (key + value)", "last"),
    ("ratio at N / ratio at 100", "flat"),
    ("ratio of the last 100 events alone", "tail"),
    ("compressed: ratio at 100 events", "first_compressed"),
    ("compressed: ratio at N events", "last_compressed"),
    ("compressed: at N / at 100", "flat_compressed"),
    ("compressed: the last 100 events alone", "tail_compressed"),
)


def _amp_values(doc: dict[str, Any] | None) -> dict[str, str]:
    if doc is None:
        return {}
    if doc.get("error"):
        return {"first": f"failed: {doc['error'][:60]}"}
    m = doc.get("measured") or {}
    a = dict(m.get("amp") or {})
    if a.get("first"):
        a["flat"] = round(a["last"] / a["first"], 3)
    if a.get("first_compressed"):
        a["flat_compressed"] = round(a["last_compressed"] / a["first_compressed"], 3)
    out = {k: _num(v) for k, v in a.items()}
    last = (m.get("points") or {}).get(str(m.get("events")), {})
    for topic in ("events", "checkpoints", "views"):
        tb = last.get(topic)
        if tb:
            out[topic] = f"{tb['records']:,} records, {tb['raw'] / 1e6:,.1f} MB"
    for n, ratio in (doc.get("small_events") or {}).items():
        out[f"small_{n}"] = _num(ratio)
    out["compression"] = str(m.get("compression", ""))
    seconds = m.get("seconds") or {}
    out["seconds"] = f"{seconds.get('generate', '?')} + {seconds.get('simulate', '?')} s"
    broker = doc.get("broker")
    if broker:
        out["broker"] = (
            f"{broker['amp_broker']} broker / {broker['amp_simulated']} simulated "
            f"({broker['sessions']} x {broker['events']} events)"
        )
    out["revision"] = f"`{doc.get('revision')}`, {doc.get('date')}"
    return out


def _before_after(before: dict[str, Any], after: dict[str, Any] | None) -> list[str]:
    """Issue 12's before/after table: ``write_amp_before.json`` next to ``write_amp.json``."""
    b, a = _amp_values(before), _amp_values(after)
    n = (before.get("measured") or {}).get("events", "N")
    out = [
        "### Write amplification before / after the parted format (issue 12)",
        "",
        f"N = {_num(n)} events per session; compressed = {b.get('compression', '')} per "
        "batch and topic (the producer's compression.type). Target: ratio at N <= 2.0, "
        "at N / at 100 <= 1.5.",
        "",
        f"Workload: {before.get('workload', '')}. Bytes are key + value of every record "
        "produced (a tombstone counts its key); events are the encoded event records. "
        "Checkpoint and view values are already zstd-compressed by the codec above 1 KiB, "
        "events are not, so lz4 shrinks the events more than the output.",
        "",
        "| | before | after |",
        "|---|---:|---:|",
    ]
    for label, key in _AMP_ROWS:
        out.append(
            f"| {label.replace(' N ', f' {_num(n)} ')} | {b.get(key, '')} | "
            f"{a.get(key, 'not measured yet')} |"
        )
    for n in ("100", "2000"):  # bench/parts_sizes.py's workload, 20 sessions x 50 batches
        out.append(
            f"| small events (2% big results): ratio at {_num(int(n))} events "
            f"(`bench/parts_sizes.py`) | {b.get(f'small_{n}', '')} | {a.get(f'small_{n}', '')} |"
        )
    for topic in ("events", "checkpoints", "views"):
        out.append(f"| {topic} written at N | {b.get(topic, '')} | {a.get(topic, '')} |")
    out += [
        f"| real-broker cross-check (`--broker-events`) | {b.get('broker', '')} | "
        f"{a.get('broker', '')} |",
        f"| bench time: generate + fold and count | {b.get('seconds', '')} | "
        f"{a.get('seconds', '')} |",
        f"| revision, date | {b.get('revision', '')} | {a.get('revision', '')} |",
        "",
        f"- before: `{before.get('command')}` (with `--baseline`, which writes "
        "`bench/results/write_amp_before.json`)",
        "- after: `python -m bench.write_amp --broker-events 150 --broker-sessions 2` (writes "
        "`bench/results/write_amp.json` and "
        "renders `bench/results/REPORT.md`)",
        "",
    ]
    return out


def render(results: Path = RESULTS) -> str:
    docs = _load(results)
    summary = docs.pop("summary", {})
    full = summary.get("full_suite") or {}
    out = [
        "# Benchmarks",
        "",
        "Generated by `bench/report.py` from `bench/results/*.json`; re-render with "
        "`python -m bench.report`. The suite is not part of the test suite. How the figures "
        "came to be (before/after runs, analysis): `bench/lab/README.md`.",
        "",
        "Run everything (starts a local Kafka broker unless `KAFKA_BOOTSTRAP_SERVERS` is set; "
        "makes `bench/.venv-quix` for the Quix peer on first use):",
        "",
        "```",
        "python -m bench                      # whole suite, default scale 1k, 3 runs per figure",
        "python -m bench --only throughput,restore --runs 5",
        "python -m bench --scale 10k          # 10k sessions x 60 events (100k: x 12 events)",
        "python -m bench --build pure         # the pure source instead of the compiled wheel",
        "```",
        "",
        "The processor measured is the build that ships, the compiled wheel (built once per "
        "source state into `bench/results/tmp/venv-compiled`, the bench re-run there); every "
        "result records its build.",
        "",
        "Every figure that matters is a ratio of two measurements taken back to back in the "
        "same run; the tables give the median over runs with min and max. The machine is "
        f"shared and noisy ({os.cpu_count()} cores, broker and bench on the same box).",
        "",
    ]
    if full:
        out += [
            f"Last whole-suite run: `{full.get('command')}` took **{full.get('total_s')} s** "
            f"({full.get('date')}, revision `{full.get('revision')}`).",
            "",
        ]
    if summary:
        out += [
            f"Last run of any part: `{summary.get('command')}` ({summary.get('total_s')} s, "
            f"{summary.get('date')}); workload: {summary.get('workload')}.",
            "",
        ]
    out += [
        "## Summary",
        "",
        "| # | figure | value (median) | baseline (median) | ratio: median (min..max) | target |",
        "|---|---|---:|---:|---|---|",
    ]
    for name in ORDER:
        doc = docs.get(name)
        if doc is None:
            continue
        n = NUMBER.get(name, name)
        if doc.get("error"):
            out.append(f"| {n} | {doc['title']} | failed | | | `{doc['error'][:120]}` |")
            continue
        v, b, r = doc.get("value", {}), doc.get("baseline", {}), doc.get("ratio", {})
        targets = "; ".join(f"{_met(t.get('met'))}: {t['text']}" for t in doc.get("targets", []))
        out.append(
            f"| {n} | {doc['title']} | {_num(v.get('median'))} {v.get('unit', '')} | "
            f"{_num(b.get('median'))} {b.get('unit', '')} | {r.get('label', '')}: "
            f"**{_num(r.get('median'))}** ({_num(r.get('min'))}..{_num(r.get('max'))}) "
            f"| {targets} |"
        )
    out.append("")
    for name in ORDER:
        if name in docs:
            out += _figure(docs[name])
        if "write_amp_ab" in docs:  # issue 12: the same figure before / after, ABAB
            from bench.lab.write_amp_ab import rows

            out += rows(docs["write_amp_ab"], name)
        if name == "write_amp" and "write_amp_before" in docs:
            out += _before_after(docs["write_amp_before"], docs.get("write_amp"))
    if "profile" in docs:
        out += _profile(docs["profile"])
    return "\n".join(out)


#: where the generated report goes; BENCHMARKS.md quotes from it by hand
REPORT = RESULTS / "REPORT.md"


def write(results: Path = RESULTS, target: Path = REPORT) -> Path:
    target.write_text(render(results))
    return target


if __name__ == "__main__":
    print(write())
