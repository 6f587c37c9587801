"""``processor fold --compact`` of one generated log by two installed builds, A B A B.

Each side is a venv's python (e.g. two compiled wheels, ``scripts/build_wheel.sh``)
run from an empty folder with ``PYTHONSAFEPATH`` so that it imports its own
installed package.  Per side and round: the command's wall and CPU (children
rusage; stdout is a pipe, read to the end), a bare ``orjson.loads`` of the
log's lines in this process just before it (the ratio of ``bench.lab.fold_cli``),
and the output's SHA-256 (the builds must agree).

    python -m bench.lab.fold_cli_ab --events 150000 --rounds 3 \
        A=/venvA/bin/python B=/venvB/bin/python
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import resource
import subprocess
import tempfile
import time
from pathlib import Path

import orjson

from processor.files import iter_lines, read_bytes, write_session_file
from processor.workload import generate_session


def _parse(log: Path) -> float:
    c0 = time.process_time()
    for _, line, _ in iter_lines(read_bytes(log)):
        orjson.loads(line)
    return time.process_time() - c0


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _fold(python: str, log: Path, cwd: str) -> tuple[float, float, str]:
    env = dict(os.environ, PYTHONSAFEPATH="1")
    env.pop("PYTHONPATH", None)
    t0, c0 = time.perf_counter(), _children_cpu()
    out = subprocess.run(
        [python, "-m", "processor", "fold", str(log), "--compact"],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        check=True,
    ).stdout
    wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
    return wall, cpu, hashlib.sha256(out).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--events", type=int, default=150_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("sides", nargs="+", metavar="NAME=PYTHON")
    args = parser.parse_args()
    sides = [(s.partition("=")[0], s.partition("=")[2]) for s in args.sides]
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "gen.jsonl"
        write_session_file(log, None, generate_session(random.Random(args.seed), args.events))
        empty = Path(tmp) / "run"
        empty.mkdir()
        for r in range(args.rounds):
            for name, python in sides:
                parse = _parse(log)
                wall, cpu, sha = _fold(python, log, str(empty))
                print(
                    f"round {r} {name}: wall {wall:.3f} s, CPU {cpu:.3f} s, "
                    f"{args.events / cpu / 1000:.1f}k events per CPU s; parse / fold by CPU "
                    f"{parse / cpu:.4f}; sha256 {sha[:16]}; load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
