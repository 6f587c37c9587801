"""Failover latency under steady load (issue 37, item 1).

Three members, two writers appending continuously; one member is SIGKILLed
with a transaction open (it kills itself at the ``before-send-offsets``
crash point once armed: a kill -9 that always finds a transaction open, the
case subscribers wait for) and replaced under a new instance id; later
another is killed the same way and restarted under its own id.  Per appended
event: the time from its produce being acknowledged
(``SessionWriter.append_event`` returned) to the session's committed
``status`` head showing its seq on a ``read_committed`` follower
(one clock, one process).  Figures: p50/p99/max of the events acknowledged
in the 30 s after each fault, and of those before the first (steady).

Used by ``tests/faults/test_failover.py`` (prints the figures, asserts only
correctness) and ``bench/failover.py`` (the figure, with and without the
fence of dead members' transactions).
"""

from __future__ import annotations

import bisect
import functools
import signal
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from processor.client.session_writer import SessionWriter
from processor.codec import default_codec
from processor.config import ServiceConfig
from processor.core.events import Event
from tests.faults.conftest import (
    FaultStack,
    Follower,
    Member,
    Writer,
    session_plan,
    wait_until,
)

#: seconds after each fault whose acknowledged events are measured
WINDOW_S = 30.0
#: seconds before a fault is armed that count as its window (its transaction's events)
LEAD_S = 1.0
#: seconds of steady load measured before the first fault
STEADY_S = 8.0
#: seconds after every session is visible before the steady window opens
SETTLE_S = 10.0
WRITERS = 2
SESSIONS_PER_WRITER = 8
PACE_S = 0.005  # between appends of one writer


class AckWriter(Writer):
    """A :class:`Writer` that notes when each event's produce was acknowledged."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.acked: list[tuple[str, int, float]] = []

    def _append(self, writer: SessionWriter, sid: str, event: Event) -> None:
        super()._append(writer, sid, event)
        self.acked.append((sid, event.seq, time.monotonic()))


class HeadWatch(threading.Thread):
    """When each session's committed ``status`` head first showed each seq
    (``read_committed``, as a subscriber reads)."""

    def __init__(self, config: ServiceConfig) -> None:
        super().__init__(daemon=True)
        self.config = config
        self.stop = threading.Event()
        self.heads: dict[str, tuple[list[int], list[float]]] = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        codec = default_codec()
        t = self.config.topics
        consumer = Consumer(
            {
                **self.config.common(),
                "group.id": f"{t.views}-heads",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 20,
            }
        )
        try:
            parts = range(self.config.partitions)
            consumer.assign([TopicPartition(t.views, p, OFFSET_BEGINNING) for p in parts])
            while not self.stop.is_set():
                # poll, then what is already fetched: consume(n, t) waits t out
                first = consumer.poll(0.05)
                if first is None:
                    continue
                now = time.monotonic()
                for m in [first, *consumer.consume(1000, timeout=0)]:
                    value = m.value()
                    if m.error() is not None or value is None:
                        continue
                    sid, _, view = (m.key() or b"").decode().partition("/")
                    if view not in ("status", "~h"):  # the head carries the status
                        continue
                    as_of = codec.decode_view(value).as_of_seq
                    seqs, times = self.heads.setdefault(sid, ([], []))
                    if not seqs or as_of > seqs[-1]:
                        seqs.append(as_of)
                        times.append(now)
        except BaseException as exc:
            self.error = exc
        finally:
            consumer.close()

    def visible_at(self, sid: str, seq: int) -> float | None:
        seqs, times = self.heads.get(sid, ([], []))
        i = bisect.bisect_left(seqs, seq)
        return times[i] if i < len(times) else None


def stats(samples: list[float], missing: int = 0) -> dict[str, Any]:
    """p50/p99/max in seconds of latencies (and how many never showed)."""
    if not samples:
        return {"events": 0, "missing": missing}
    s = sorted(samples)
    p99 = s[min(len(s) - 1, round(0.99 * (len(s) - 1)))]
    return {
        "events": len(s),
        "missing": missing,
        "p50_s": round(statistics.median(s), 2),
        "p99_s": round(p99, 2),
        "max_s": round(s[-1], 2),
    }


def latencies(
    acked: list[tuple[str, int, float]], heads: HeadWatch, lo: float, hi: float
) -> dict[str, Any]:
    got, missing = [], 0
    for sid, seq, at in acked:
        if not lo <= at < hi:
            continue
        seen = heads.visible_at(sid, seq)
        if seen is None:
            missing += 1
        else:
            got.append(max(0.0, seen - at))
    return stats(got, missing)


@dataclass
class Fault:
    label: str
    victim: str
    replacement: str
    armed: float = 0.0  # the victim dies at its next transaction
    at: float = 0.0  # it was seen dead


@dataclass
class FailoverRun:
    """One run: the steady window and the faults, in order."""

    faults: list[Fault] = field(
        default_factory=lambda: [
            Fault("member killed, new instance id", "fo-a", "fo-a2"),
            Fault("member killed, same instance id", "fo-b", "fo-b"),
        ]
    )
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)


def run_failover(
    stack: FaultStack,
    *,
    env: dict[str, str] | None = None,
    seed: int = 37,
    say: Callable[[str], object] = lambda line: None,
) -> FailoverRun:
    """The scenario; checks correctness (views equal the offline fold, no
    violation, every member alive) and returns the latency figures."""
    run = FailoverRun()
    members = {"fo-a", "fo-b", "fo-c"}
    victims = {f.victim for f in run.faults}
    for name in sorted(members):
        # a victim kills itself (SIGKILL) at its next transaction once armed, with
        # the transaction's records produced: a kill -9 that always finds a
        # transaction open, the case readers wait for
        crash = {
            "PROCESSOR_FAULTPOINT": "before-send-offsets",
            "PROCESSOR_FAULTPOINT_ARM": str(stack.workdir / f"arm-{name}"),
        }
        # the service's own transaction timeout (0: derived), not the suite's 10 s
        stack.spawn(
            name,
            env={**(env or {}), **(crash if name in victims else {})},
            transaction_timeout_ms=0,
        )
    heads, follower = HeadWatch(stack.config), Follower(stack.config)
    heads.start()
    follower.start()
    stop = threading.Event()
    writers = [
        AckWriter(stack, session_plan(SESSIONS_PER_WRITER, 4000, seed + i, f"w{i}-"), stop, PACE_S)
        for i in range(WRITERS)
    ]
    try:
        for w in writers:
            w.start()
        wait_until(
            lambda: len(heads.heads) >= WRITERS * SESSIONS_PER_WRITER,
            180,
            "every session's status view",
            lambda: f"head watch error: {heads.error!r}\n{stack.member_report()}",
        )
        time.sleep(SETTLE_S)  # the members' first rebalances are not steady load
        steady_from = time.monotonic()
        time.sleep(STEADY_S)
        for fault in run.faults:
            say(f"fault: {fault.label}")
            fault.armed = time.monotonic()
            (stack.workdir / f"arm-{fault.victim}").touch()
            victim = stack.members[fault.victim]
            wait_until(functools.partial(_dead, victim), 30, f"{fault.victim} to die")
            fault.at = time.monotonic()
            assert victim.proc.returncode == -signal.SIGKILL, victim.tail()
            stack.spawn(fault.replacement, env=env, transaction_timeout_ms=0)
            members = (members - {fault.victim}) | {fault.replacement}
            time.sleep(WINDOW_S)
        stop.set()
        for w in writers:
            w.join(120)
            assert w.error is None, f"writer failed: {w.error!r}"
        stack.wait_caught_up(240)
        stack.assert_views_equal_offline_fold()
        wait_until(lambda: _all_visible(writers, heads), 60, "every acknowledged event visible")
        dead = [m for m in members if not stack.members[m].alive()]
        assert not dead, f"members exited: {dead}\n{stack.member_report()}"
    finally:
        stop.set()
        heads.stop.set()
        follower.stop.set()
        heads.join(30)
        follower.join(30)
    follower.check()
    assert heads.error is None, f"head watch failed: {heads.error!r}"
    acked = [a for w in writers for a in w.acked]
    # the events of the transaction the victim dies in were acknowledged just
    # before: a fault's window opens LEAD_S before it was armed
    run.figures["steady"] = latencies(acked, heads, steady_from, run.faults[0].armed - LEAD_S)
    for fault in run.faults:
        run.figures[fault.label] = latencies(
            acked, heads, fault.armed - LEAD_S, fault.at + WINDOW_S
        )
    return run


def _dead(member: Member) -> bool:
    return not member.alive()


def _all_visible(writers: list[AckWriter], heads: HeadWatch) -> bool:
    return all(heads.visible_at(sid, seq) is not None for w in writers for sid, seq, _ in w.acked)


def table(rows: dict[str, dict[str, Any]]) -> str:
    """The figures as lines: window, events, p50, p99, max."""
    lines = [f"{'window':<40} {'events':>6} {'p50 s':>6} {'p99 s':>6} {'max s':>6}"]
    for label, f in rows.items():
        lines.append(
            f"{label:<40} {f['events']:>6} {f.get('p50_s', '-'):>6} "
            f"{f.get('p99_s', '-'):>6} {f.get('max_s', '-'):>6}"
        )
    return "\n".join(lines)
