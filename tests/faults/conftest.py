"""The fault suite's cluster, members, writers and the read_committed follower.

A 3-node KRaft cluster (:class:`processor.devcluster.LocalCluster`, replication
factor 3, ``min.insync.replicas=2``) is started once per test session.
Members are real ``processor run`` OS processes (so they can be SIGKILLed,
SIGSTOPped and SIGCONTed); writers are threads appending through
``SessionWriter``; a follower thread tails the views and the DLQ with
``read_committed`` and checks every record as it commits.

Scale (environment):

- ``PROCESSOR_FAULTS=bounded`` (default; what ``.ci/run`` runs): one round of
  each fault, a few thousand events, a few minutes on 2 cores;
- ``PROCESSOR_FAULTS=long`` for the bench machine: faults on a seeded random
  schedule for ``PROCESSOR_FAULTS_SECONDS`` (default 300) with
  ``PROCESSOR_FAULTS_SESSIONS`` sessions per writer (default 40) and seed
  ``PROCESSOR_FAULTS_SEED``;
- ``PROCESSOR_FAULTS=skip`` leaves the suite out.

A long outage (``test_chaos.py``): ``PROCESSOR_FAULTS_DOWN_S`` (default 8) is
how long a broker fault keeps its broker down, and ``PROCESSOR_FAULTS_DOWN=all``
makes that fault a whole-cluster outage met by a restore (a member stopped,
its replacement waiting at its first restore, fault point ``before-restore``)
instead of the coordinator's broker alone.  With the members' put-off bounds
(``PROCESSOR_RESTORE_DEADLINE_S``, ``PROCESSOR_FILL_STALL_S``: 120 s each, the
members inherit the environment) shorter than the outage, that restore is
put off ("restore of ...[p] put off" in the member log, counted in the run's
summary); the suite's 6 s session timeout then takes the partitions away
(``-X session.timeout.ms=...`` in ``PROCESSOR_FAULTS_MEMBER_ARGS`` keeps them,
but also holds every rebalance after a SIGKILL that long).

``PROCESSOR_FAULTS_MEMBER_ARGS`` adds arguments to every member's command line,
e.g. ``--kafka-log-level DEBUG -X debug=consumer,fetch,topic`` for librdkafka's
fetch state in the member logs (kept under pytest's ``--basetemp``).

``PROCESSOR_FAULTS_KEEP=<dir>`` (a new dir each run) keeps what a diagnosis needs:
the cluster's root in ``<dir>/cluster`` (each node's ``node.log``, its earlier
runs' ``node.log.<n>`` and its data dir, for ``DumpLogSegments``) and the
member logs in ``<dir>/members/<test>``; the path is printed at the end.
``PROCESSOR_KAFKA_LOG4J=<file>`` gives the nodes a log4j2 file of one's own:
``tests/faults/log4j2-debug.properties`` logs the transaction coordinator, its
markers and the group coordinator's offsets at DEBUG, which
``python3 -m tests.faults.diagnose <dir>`` reads (coordinator elections out of
order, transactions both committed and aborted, committed offsets going back).
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from processor.client.session_writer import DeliveryError, SessionWriter
from processor.client.views_reader import offline_equivalent, read_views, session_fold_equivalent
from processor.codec import default_codec
from processor.config import ServiceConfig
from processor.core.events import Event
from processor.devcluster import LocalCluster
from processor.kafka import clients
from processor.kafka.reads import watermarks
from processor.kafka.topic_admin import create_topics
from processor.offline import fold_events, session_output
from processor.workload import generate_session
from tests.kafka_fixtures import unique_prefix

REPO = Path(__file__).parents[2]
SESSION_TIMEOUT_MS = 6_000  # the broker's minimum: a dead member is noticed soonest

MODE = os.environ.get("PROCESSOR_FAULTS", "bounded").strip().lower()
LONG = MODE == "long"
SEED = int(os.environ.get("PROCESSOR_FAULTS_SEED", "8"))
LONG_SECONDS = float(os.environ.get("PROCESSOR_FAULTS_SECONDS", "300"))
SESSIONS_PER_WRITER = int(os.environ.get("PROCESSOR_FAULTS_SESSIONS", "40" if LONG else "8"))
MEMBER_ARGS = tuple(shlex.split(os.environ.get("PROCESSOR_FAULTS_MEMBER_ARGS", "")))
DOWN_S = float(os.environ.get("PROCESSOR_FAULTS_DOWN_S", "8"))
DOWN_ALL = os.environ.get("PROCESSOR_FAULTS_DOWN", "one").strip().lower() == "all"
KEEP = os.environ.get("PROCESSOR_FAULTS_KEEP", "").strip()


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    if MODE == "skip":
        pytest.skip("PROCESSOR_FAULTS=skip")
    c = LocalCluster(3, keep=bool(KEEP))
    c.start(Path(KEEP, "cluster") if KEEP else None)
    try:
        yield c
    finally:
        c.stop()
        if KEEP:  # said past pytest's capture: the run's logs and data are there
            terminal = request.config.pluginmanager.get_plugin("terminalreporter")
            if terminal is not None:
                terminal.write_line(f"PROCESSOR_FAULTS_KEEP: cluster and member logs in {KEEP}")


def as_json(value: Any) -> Any:
    return orjson.loads(orjson.dumps(value))


@dataclass
class Member:
    instance_id: str
    proc: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)

    def tail(self, lines: int = 30) -> str:
        """The log's last lines, librdkafka's debug lines left out."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        kept = [line for line in text.splitlines() if not _DEBUG_LINE.search(line)]
        return "\n".join(kept[-lines:])

    def probe(self) -> str:
        """/healthz, /readyz and the watchdog's series of a member that serves them
        (``--metrics-port 0``: the port is in its log)."""
        try:
            urls = METRICS_URL.findall(self.log.read_text(errors="replace"))
        except OSError:
            urls = []
        if not urls or not self.alive():
            return ""
        base = urls[-1].removesuffix("/metrics")
        out = []
        for path in ("/healthz", "/readyz"):
            out.append(f"{path}: {_get(base + path)}")
        metrics = _get(base + "/metrics")
        out += [line for line in metrics.splitlines() if WATCHED.match(line)]
        return "\n".join(out)


#: where a member serves /metrics (``processor run`` logs it at start)
METRICS_URL = re.compile(r"metrics on (http://\S+/metrics)")
#: the series a stalled partition shows: lag, the progress watchdog, failed transactions
WATCHED = re.compile(
    r"processor_(partition_lag|partition_stalls_total|partition_stall_reseeks_total|"
    r"partitions_stalled|transaction_aborts_total|transaction_failures_total)\b(?!_created)"
)
_DEBUG_LINE = re.compile(r"^%7\||DEBUG processor\.librdkafka")


def _get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return f"{resp.status} {resp.read().decode(errors='replace').strip()}"
    except urllib.error.HTTPError as exc:  # 503: the body names the cause
        return f"{exc.code} {exc.read().decode(errors='replace').strip()}"
    except OSError as exc:
        return f"({exc})"


@dataclass
class FaultStack:
    cluster: LocalCluster
    config: ServiceConfig
    workdir: Path
    members: dict[str, Member] = field(default_factory=dict)
    written: dict[str, list[Event]] = field(default_factory=dict)

    # ------------------------------------------------------------ members

    def spawn(
        self,
        instance_id: str,
        *extra: str,
        env: dict[str, str] | None = None,
        transaction_timeout_ms: int = 10_000,
        session_timeout_ms: int | None = None,
    ) -> Member:
        """A ``processor run`` member; ``session_timeout_ms`` None: the member's
        default, the suite's 6 s (``clients.SESSION_TIMEOUT_MS``; under KIP-848
        the cluster's ``group.consumer.session.timeout.ms``, devcluster.py); a
        value is a ``-X session.timeout.ms``, which makes ``auto`` run classic."""
        cfg = self.config
        cmd = [
            sys.executable,
            "-m",
            "processor",
            "run",
            "-b",
            cfg.bootstrap_servers,
            "--topic-prefix",
            cfg.topic_prefix,
            "--group-id",
            cfg.group_id,
            "--instance-id",
            instance_id,
            "--commit-interval-ms",
            "100",
            "--transaction-timeout-ms",
            str(transaction_timeout_ms),
            *(
                ()
                if session_timeout_ms is None
                else ("-X", f"session.timeout.ms={session_timeout_ms}")
            ),
            *extra,
            *MEMBER_ARGS,
        ]
        log = self.workdir / f"{instance_id}.log"
        with log.open("ab") as sink:
            proc = subprocess.Popen(
                cmd,
                env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
                stdout=sink,
                stderr=sink,
            )
        member = Member(instance_id, proc, log)
        self.members[instance_id] = member
        return member

    def stop_all(self) -> None:
        for m in self.members.values():
            m.kill()

    def member_report(self) -> str:
        return "\n".join(
            f"--- {m.instance_id} (exit {m.proc.poll()}):\n{m.probe()}\n{m.tail()}"
            for m in self.members.values()
        )

    # ------------------------------------------------------------ offsets

    def group_consumer(self) -> Consumer:
        return Consumer(
            {
                **self.config.common(),
                "group.id": self.config.group_id,
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )

    def committed(self) -> dict[int, int]:
        consumer = self.group_consumer()
        try:
            tps = [
                TopicPartition(self.config.topics.events, p) for p in range(self.config.partitions)
            ]
            return {tp.partition: tp.offset for tp in consumer.committed(tps, timeout=30)}
        finally:
            consumer.close()

    def ends(self) -> dict[int, int]:
        consumer = clients.plain_consumer(self.config, "faults-ends")
        try:
            return {
                p: watermarks(consumer, self.config.topics.events, p)[1]
                for p in range(self.config.partitions)
            }
        finally:
            consumer.close()

    def wait_caught_up(self, timeout: float, stuck_s: float = 150) -> None:
        """Every events partition committed to its end (the group has folded everything).

        Fails early when a partition with lag has not committed for ``stuck_s``:
        longer than anything legitimate (a zombie's transaction timeout plus the
        broker's abort check, a producer replaced after a stuck call, a
        rebalance) and shorter than ``max.poll.interval.ms`` (300 s), whose
        eviction of a hung member would otherwise hide the hang (stop 25's stall
        of partition 0 at 1926: a member's loop stuck in librdkafka).
        """
        now = time.monotonic()
        deadline = now + timeout
        ends = self.ends()
        got: dict[int, int] = {}
        moved: dict[int, tuple[int, float]] = {}  # partition -> (committed, since)
        while time.monotonic() < deadline:
            try:
                got = self.committed()
            except Exception:  # a coordinator moving: ask again
                time.sleep(1)
                continue
            if all(got.get(p, -1) >= end for p, end in ends.items()):
                return
            now = time.monotonic()
            for p, end in ends.items():
                at = got.get(p, -1)
                if moved.get(p, (None, 0.0))[0] != at:
                    moved[p] = (at, now)
                elif at < end and now - moved[p][1] >= stuck_s:
                    raise AssertionError(
                        f"partition {p} stuck at committed offset {at} of {end} for "
                        f"{now - moved[p][1]:.0f} s (committed {got}, ends {ends})\n"
                        f"{self.member_report()}"
                    )
            time.sleep(1)
        raise AssertionError(f"not caught up: committed {got}, ends {ends}\n{self.member_report()}")

    # ------------------------------------------------------------ checks

    def expected(self, sid: str) -> Any:
        return as_json(offline_equivalent(session_output(fold_events(self.written[sid]))))

    def assert_views_equal_offline_fold(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        wrong: list[str] = []
        while True:
            snap = read_views(self.config, timeout=60)
            assert not snap.regressions, f"asOfSeq went back: {snap.regressions[:5]}"
            wrong = []
            for sid in self.written:
                views = snap.views.get(sid)
                if (
                    views is None
                    or "status" not in views
                    or (as_json(session_fold_equivalent(views)) != self.expected(sid))
                ):
                    wrong.append(sid)
            if not wrong:
                return
            if time.monotonic() > deadline:
                break
            time.sleep(2)
        sid = wrong[0]
        views = snap.views.get(sid) or {}
        status = views["status"].value if "status" in views else None
        raise AssertionError(
            f"{len(wrong)} sessions differ from the offline fold, e.g. {sid} "
            f"(status {status}, written {len(self.written[sid])} events)"
        )


@pytest.fixture
def fault_stack(
    cluster: LocalCluster, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[FaultStack]:
    workdir = tmp_path
    if KEEP:  # next to the cluster's node logs
        workdir = Path(KEEP, "members", re.sub(r"[^\w.-]", "_", request.node.name))
        workdir.mkdir(parents=True, exist_ok=True)
    stack = make_stack(cluster, workdir, partitions=3)
    try:
        yield stack
    finally:
        stack.stop_all()


def make_stack(cluster: LocalCluster, workdir: Path, *, partitions: int) -> FaultStack:
    prefix = unique_prefix("f")
    config = ServiceConfig(
        bootstrap_servers=cluster.bootstrap,
        topic_prefix=prefix,
        group_id=f"{prefix}-group",
        partitions=partitions,
        replication_factor=3,
        commit_interval_ms=100,
        transaction_timeout_ms=10_000,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            create_topics(clients.admin(config), config)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
    return FaultStack(cluster, config, workdir)


# ---------------------------------------------------------------- writers


def session_plan(n: int, length: int, seed: int, label: str) -> dict[str, list[Event]]:
    rng = random.Random(seed)
    return {
        f"{label}{i:03d}": generate_session(
            random.Random(rng.random()), length, big_result_bytes=2_000
        )
        for i in range(n)
    }


class Writer(threading.Thread):
    """Appends its sessions round-robin through one ``SessionWriter`` until stopped.

    A delivery failure (a broker down) retries the same event — safe by
    design: a copy that did land is an exact duplicate the processor drops.
    """

    def __init__(
        self,
        stack: FaultStack,
        plan: dict[str, list[Event]],
        stop: threading.Event,
        pace_s: float = 0.0,
    ) -> None:
        super().__init__(daemon=True)
        self.stack, self.plan, self.stop, self.pace_s = stack, plan, stop, pace_s
        self.error: BaseException | None = None
        self.appended = 0
        for sid in plan:
            stack.written[sid] = []

    def run(self) -> None:
        writer = SessionWriter(self.stack.config, client_id="faults-writer")
        try:
            pos = dict.fromkeys(self.plan, 0)
            while not self.stop.is_set() and any(pos[s] < len(e) for s, e in self.plan.items()):
                for sid, events in self.plan.items():
                    if pos[sid] >= len(events) or self.stop.is_set():
                        continue
                    self._append(writer, sid, events[pos[sid]])
                    pos[sid] += 1
                    if self.pace_s:
                        time.sleep(self.pace_s)
        except BaseException as exc:
            self.error = exc
        finally:
            writer.close(60)

    def _append(self, writer: SessionWriter, sid: str, event: Event) -> None:
        deadline = time.monotonic() + 180
        while True:
            try:
                writer.append_event(sid, event)
                break
            except DeliveryError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        self.stack.written[sid].append(event)
        self.appended += 1


# ---------------------------------------------------------------- follower


class Follower(threading.Thread):
    """Tails views and DLQ with ``read_committed`` and checks every record as it commits.

    Per (session, view) the head's ``asOfSeq`` never goes back; every part
    decodes; no dead letter appears (the suite writes only valid sessions).
    """

    def __init__(self, config: ServiceConfig) -> None:
        super().__init__(daemon=True)
        self.config = config
        self.stop = threading.Event()
        self.records = 0
        self.violations: list[str] = []
        self.dead_letters: list[Any] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        codec = default_codec()
        t = self.config.topics
        consumer = Consumer(
            {
                **self.config.common(),
                "group.id": f"{t.views}-follower",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": False,
                "fetch.wait.max.ms": 100,
            }
        )
        seen: dict[tuple[str, str], int] = {}
        try:
            consumer.assign(
                [
                    TopicPartition(topic, p, OFFSET_BEGINNING)
                    for topic in (t.views, t.dlq)
                    for p in range(self.config.partitions)
                ]
            )
            while not self.stop.is_set():
                for m in consumer.consume(500, timeout=0.2):
                    err = m.error()
                    if err is not None:
                        if err.fatal():
                            raise RuntimeError(str(err))
                        continue  # a broker restarting
                    self.records += 1
                    value = m.value()
                    if m.topic() == t.dlq:
                        if value is not None:
                            self.dead_letters.append(codec.decode_dead_letter(value))
                        continue
                    if value is None:
                        continue
                    view = codec.decode_view(value)
                    if view.part != 0:
                        continue
                    ident = (view.session_id, view.view)
                    prev = seen.get(ident)
                    if prev is not None and view.as_of_seq < prev:
                        self.violations.append(
                            f"{ident}: asOfSeq {prev} -> {view.as_of_seq} "
                            f"at {m.partition()}@{m.offset()}"
                        )
                    seen[ident] = max(prev or -1, view.as_of_seq)
        except BaseException as exc:
            self.error = exc
        finally:
            consumer.close()

    def check(self) -> None:
        assert self.error is None, f"follower failed: {self.error!r}"
        assert not self.violations, f"asOfSeq went back: {self.violations[:5]}"
        letters = [(d.session_id, d.seq, d.rule, d.reason) for d in self.dead_letters]
        assert not letters, f"{len(letters)} dead letters, e.g. {letters[:5]}"


def wait_until(
    cond: Callable[[], bool], timeout: float, what: str, report: Callable[[], str] = lambda: ""
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}\n{report()}")


__all__ = [
    "LONG",
    "LONG_SECONDS",
    "SEED",
    "SESSIONS_PER_WRITER",
    "SESSION_TIMEOUT_MS",
    "FaultStack",
    "Follower",
    "Member",
    "Writer",
    "as_json",
    "make_stack",
    "session_plan",
    "wait_until",
]
