"""Shared helpers of the benchmark suite: context, statistics, results, names.

Every figure is a dict written as ``bench/results/<figure>.json`` with the
same top-level keys, so :mod:`bench.report` can render any of them:

- ``figure``, ``title``, ``revision``, ``command``, ``date``, ``runs``;
- ``value`` / ``baseline``: ``{"label", "unit", "median", "min", "max", "samples"}``;
- ``ratio``: ``{"label", "median", "min", "max", "samples"}`` (per-run ratios,
  each measured within one run, so machine drift hits both sides alike);
- ``targets``: ``[{"text", "met": bool | None}]``;
- ``rows``: extra table rows ``[[name, value], ...]``; ``notes``: list of text;
- ``error``: set when the figure could not be measured (with the reason).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from bench.build import child_pythonpath, running_build
from processor.config import ServiceConfig
from processor.files import SessionFile, read_session_file, write_session_file
from processor.kafka.client_errors import LIBRDKAFKA_LOGGER
from processor.workload import generate_session

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"


@dataclass
class Context:
    """What every figure runner gets: the broker, the produced workload, the options."""

    bootstrap: str
    runs: int
    scale: str
    command: str
    results: Path = RESULTS
    workload: Any = None  # bench.workload.Workload once produced
    revision: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def config(self, **overrides: Any) -> ServiceConfig:
        """A service config on this broker (defaults of the service otherwise)."""
        return ServiceConfig(bootstrap_servers=self.bootstrap).with_overrides(**overrides)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def topics_dropped_after(config: ServiceConfig, keep: Iterable[str] = ()) -> Iterator[None]:
    """Delete, on exit, every topic created on the broker inside the block.

    A figure's runs leave output topics (views, checkpoints, Quix changelogs)
    behind; on a broker that outlives one figure (``KAFKA_BOOTSTRAP_SERVERS``,
    the whole suite) they add up, and later figures ran on a heavier broker
    than the first (bench/lab/history/5-latency.md: latency sets after peer runs).  ``keep``:
    names created inside the block that must stay (the shared workload).
    """
    from processor.kafka import clients
    from processor.kafka.topic_admin import delete_topics, internal_topic

    admin = clients.admin(config)
    before = set(admin.list_topics(timeout=30).topics)
    try:
        yield
    finally:
        try:
            now = set(admin.list_topics(timeout=30).topics)
            # never the broker's own (a figure that first committed offsets or
            # a transaction created them): deleting them stalled the next runs
            new = sorted(n for n in now - before - set(keep) if not internal_topic(n))
            if new:
                delete_topics(admin, new)
        except KafkaException as exc:  # the figure's numbers stand; the topics stay
            print(f"[bench] topics left on the broker: {exc}", file=sys.stderr)


def git_revision() -> str:
    """Short HEAD, with ``+dirty`` when ``processor/`` or ``bench/`` has local changes."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()

    rev = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "processor", "schemas")
    return f"{rev}+dirty" if dirty else rev


def spread(samples: Sequence[float], digits: int = 3) -> dict[str, Any]:
    return {
        "median": round(statistics.median(samples), digits),
        "min": round(min(samples), digits),
        "max": round(max(samples), digits),
        "samples": [round(s, digits) for s in samples],
    }


def measure(
    label: str,
    unit: str,
    samples: Sequence[float],
    digits: int = 1,
) -> dict[str, Any]:
    return {"label": label, "unit": unit, **spread(samples, digits)}


def ratio(label: str, nums: Sequence[float], dens: Sequence[float]) -> dict[str, Any]:
    """Per-run ratios ``nums[i] / dens[i]`` (pairs measured back to back)."""
    return {"label": label, **spread([n / d for n, d in zip(nums, dens, strict=True)], 3)}


def result(ctx: Context, figure: str, title: str, **fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "figure": figure,
        "title": title,
        "revision": ctx.revision or git_revision(),
        "command": ctx.command,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "runs": ctx.runs,
        "scale": ctx.scale,
        "python": sys.version.split()[0],
        "build": running_build(),
    }
    doc.update(fields)
    return doc


def write_result(ctx: Context, doc: dict[str, Any]) -> Path:
    ctx.results.mkdir(parents=True, exist_ok=True)
    path = ctx.results / f"{doc['figure']}.json"
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return path


def rss_bytes() -> int:
    """Resident set size of this process (VmRSS)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def group_offsets(
    config: ServiceConfig, group: str, topic: str, partitions: Iterable[int]
) -> dict[int, int]:
    """Committed offsets of ``group`` (the consumer is created with that group id)."""
    consumer = Consumer(
        {
            **config.common(),
            "logger": LIBRDKAFKA_LOGGER,
            "group.id": group,
            "enable.auto.commit": False,
        }
    )
    try:
        tps = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=10)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in tps}


def wait_topics_ready(
    config: ServiceConfig,
    topics: Iterable[str],
    timeout: float = 30,
) -> None:
    """Block until every partition of ``topics`` has a leader that answers a watermark query.

    A just-created topic answers NOT_LEADER_FOR_PARTITION for a moment; the
    processor's restore does not retry that, so the benches wait first.
    """
    consumer = Consumer(
        {**config.common(), "logger": LIBRDKAFKA_LOGGER, "group.id": "bench-ready-probe"}
    )
    deadline = time.monotonic() + timeout
    try:
        for topic in topics:
            while True:
                try:
                    meta = consumer.list_topics(topic, timeout=10).topics[topic]
                    if (
                        meta.error is None
                        and meta.partitions
                        and all(pm.leader >= 0 for pm in meta.partitions.values())
                    ):
                        for p in meta.partitions:
                            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                        break
                except KafkaException:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"topic {topic} not ready after {timeout} s")
                time.sleep(0.1)
    finally:
        consumer.close()


def wait_for(cond: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(interval)
    return cond()


def python_env() -> dict[str, str]:
    """Environment for subprocesses that import the build this bench measures (bench.build)."""
    env = dict(os.environ)
    paths = [*child_pythonpath(), *(env.get("PYTHONPATH") or "").split(os.pathsep)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p))
    return env


def shell_command(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


@contextlib.contextmanager
def broker_bootstrap(say: Callable[[str], None] | None = None) -> Iterator[tuple[str, bool]]:
    """``KAFKA_BOOTSTRAP_SERVERS``, or a local broker started for the block (and
    stopped after it): ``(bootstrap, local)``."""
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "")
    if bootstrap:
        yield bootstrap, False
        return
    from processor.devbroker import LocalBroker

    broker = LocalBroker()
    bootstrap = broker.start()
    if say is not None:
        say(f"local broker at {bootstrap}")
    try:
        yield bootstrap, True
    finally:
        broker.stop()


def run_child_json(argv: Sequence[str], what: str, timeout: float = 3600) -> dict[str, Any]:
    """Run a bench child process (``python -m bench.<x> --child ...``) from the
    repository root; its last stdout line, as JSON."""
    done = subprocess.run(
        list(argv), cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed: {done.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


@contextlib.contextmanager
def generated_session_file(events: int, seed: int) -> Iterator[tuple[Path, SessionFile]]:
    """A generated session log of ``events`` events, written to a temporary
    ``session.jsonl`` and read back: its path and the parsed file, the
    offline fold's input (``bench.lab.fold_icount``, ``bench.lab.fold_parts``)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "session.jsonl"
        write_session_file(path, None, generate_session(random.Random(seed), events))
        yield path, read_session_file(path)
