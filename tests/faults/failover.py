"""Failover latency under steady load (issue 37, items 1 and 5).

Three members, two writers appending continuously; then, one after the
other, the faults of ``failover_faults.py``: a member SIGKILLed with a
transaction open and replaced under a new instance id, another SIGKILLed and
restarted under its own id, one paused past its session timeout, the group
coordinator's broker killed, a transaction coordinator's broker killed, and
rolling restarts (SIGTERM, start again, wait for ``/readyz``), one with a
member running the commit before HEAD.  Per appended event: the time from
its produce being acknowledged (``SessionWriter.append_event`` returned) to
the session's committed ``status`` head showing its seq on a
``read_committed`` follower (one clock, one process).  Figures: p50/p99/max
of the events acknowledged from ``LEAD_S`` before each fault to the window
after it (30 s; a rollout's: until 5 s after its last member is ready, at
least 30 s), and of those before the first (steady).

Used by ``tests/faults/test_failover.py`` (prints the figures, asserts only
correctness) and ``bench/failover.py`` (the figure).
"""

from __future__ import annotations

import bisect
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
    Writer,
    session_plan,
    wait_until,
)
from tests.faults.failover_faults import Fault, Faults

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


#: one acknowledged event's wait: session, seq, acknowledged at, seconds to visible
Wait = tuple[str, int, float, float]


def waits(
    acked: list[tuple[str, int, float]], heads: HeadWatch, lo: float, hi: float
) -> tuple[list[Wait], int]:
    """The waits of the events acknowledged in ``[lo, hi)``, and how many never showed."""
    got: list[Wait] = []
    missing = 0
    for sid, seq, at in acked:
        if not lo <= at < hi:
            continue
        seen = heads.visible_at(sid, seq)
        if seen is None:
            missing += 1
        else:
            got.append((sid, seq, at, max(0.0, seen - at)))
    return got, missing


def latencies(
    acked: list[tuple[str, int, float]], heads: HeadWatch, lo: float, hi: float
) -> dict[str, Any]:
    got, missing = waits(acked, heads, lo, hi)
    return stats([w[3] for w in got], missing)


def default_faults(long: bool) -> list[Fault]:
    """The faults in order (``failover_faults.py``); the bounded form does one
    rollout, with the older code in the mix."""
    faults = [
        Fault("member killed, new instance id", "kill-new-id", "fo-a", "fo-a2"),
        Fault("member killed, same instance id", "kill-same-id", "fo-b", "fo-b"),
        Fault("member paused past its session timeout", "pause", "fo-c"),
        Fault("group coordinator's broker killed", "kill-group-coordinator"),
        Fault("txn coordinator's broker killed", "kill-txn-coordinator"),
        Fault("rolling restart", "rollout"),
        Fault("rolling restart, one a commit older", "rollout-older"),
    ]
    return faults if long else [f for f in faults if f.kind != "rollout"]


@dataclass
class FailoverRun:
    """One run: the steady window and the faults, in order."""

    faults: list[Fault]
    window_s: float
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: per fault, its slowest events: (session, seq, acknowledged at, wait s)
    slowest: dict[str, list[Wait]] = field(default_factory=dict)


def run_failover(
    stack: FaultStack,
    *,
    env: dict[str, str] | None = None,
    seed: int = 37,
    faults: list[Fault] | None = None,
    window_s: float = WINDOW_S,
    session_timeout_ms: int | None = None,
    args: tuple[str, ...] = (),
    say: Callable[[str], object] = lambda line: None,
) -> FailoverRun:
    """The scenario; checks correctness (views equal the offline fold, no
    violation, every member alive) and returns the latency figures.
    ``session_timeout_ms`` None: the members' default; ``args``: more
    ``processor run`` arguments for every member."""
    run = FailoverRun(faults if faults is not None else default_faults(True), window_s)
    members = {"fo-a", "fo-b", "fo-c"}
    do = Faults(stack, env or {}, members, session_timeout_ms, args)
    killed = {f.victim for f in run.faults if f.kind.startswith("kill-") and f.victim}
    for name in sorted(members):
        # a victim kills itself (SIGKILL) at its next transaction once armed, with
        # the transaction's records produced: a kill -9 that always finds a
        # transaction open, the case readers wait for
        crash = {
            "PROCESSOR_FAULTPOINT": "before-send-offsets",
            "PROCESSOR_FAULTPOINT_ARM": str(stack.workdir / f"arm-{name}"),
        }
        do.spawn(name, crash if name in killed else None)
    heads, follower = HeadWatch(stack.config), Follower(stack.config)
    heads.start()
    follower.start()
    stop = threading.Event()
    writers = [
        AckWriter(stack, session_plan(SESSIONS_PER_WRITER, 6000, seed + i, f"w{i}-"), stop, PACE_S)
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
            say(f"{time.strftime('%H:%M:%S')} fault: {fault.label}")
            do.do(fault)
            say(
                f"  {fault.note} (took effect {fault.at - fault.armed:.1f} s after armed, "
                f"over {fault.done - fault.armed:.1f} s)"
            )
            time.sleep(max(0.0, fault.window(window_s, LEAD_S)[1] - time.monotonic()))
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
    first = run.faults[0].armed - LEAD_S if run.faults else time.monotonic()
    run.figures["steady"] = latencies(acked, heads, steady_from, first)
    for i, fault in enumerate(run.faults):
        lo, hi = fault.window(window_s, LEAD_S)
        if i + 1 < len(run.faults):  # an event counts for one fault: the next one's opens here
            hi = min(hi, run.faults[i + 1].window(window_s, LEAD_S)[0])
        run.figures[fault.label] = {**latencies(acked, heads, lo, hi), "note": fault.note}
        run.slowest[fault.label] = slowest(acked, heads, lo, hi)
    return run


def slowest(
    acked: list[tuple[str, int, float]], heads: HeadWatch, lo: float, hi: float, n: int = 8
) -> list[Wait]:
    """The ``n`` slowest events acknowledged in ``[lo, hi)``, for a diagnosis."""
    return sorted(waits(acked, heads, lo, hi)[0], key=lambda w: -w[3])[:n]


def _all_visible(writers: list[AckWriter], heads: HeadWatch) -> bool:
    return all(heads.visible_at(sid, seq) is not None for w in writers for sid, seq, _ in w.acked)


def table(rows: dict[str, dict[str, Any]]) -> str:
    """The figures as lines: window, events, p50, p99, max."""
    lines = [f"{'window':<40} {'events':>6} {'p50 s':>6} {'p99 s':>6} {'max s':>6}"]
    for label, f in rows.items():
        lines.append(
            f"{label:<40} {f['events']:>6} {f.get('p50_s', '-'):>6} "
            f"{f.get('p99_s', '-'):>6} {f.get('max_s', '-'):>6}  {f.get('note') or ''}"
        )
    return "\n".join(lines)
