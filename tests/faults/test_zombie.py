"""The zombie scenario of issue 8, made deterministic with a crash point.

Member A dies with a transaction open: its views and checkpoints for the
batch are produced, its offsets never sent.  B takes the partition over and
commits; B is killed; C restores.  Before the fix, B's committed checkpoints
sat behind A's open transaction, invisible to C's ``read_committed`` restore
while B's offsets were not: C resumed a stale state at B's offset, met
"gap, expected 50" (S-1), dead-lettered valid events, quarantined the
sessions, and the status views went 49 -> 69 -> 49.  Now a restore waits for
the checkpoints partition to be stable (restore.wait_stable) first
(``wait``); with the wait switched off (``restore_stable_wait_ms = 0``, the
path taken when the wait gives up) C repairs each stale session from its
checkpoint's anchor when the gap shows, instead of quarantining it
(``repair``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from processor.client.session_writer import SessionWriter
from processor.devcluster import LocalCluster
from tests.faults.conftest import (
    SEED,
    FaultStack,
    Follower,
    make_stack,
    session_plan,
    wait_until,
)

pytestmark = pytest.mark.faults

A_TRANSACTION_TIMEOUT_MS = 30_000  # long enough that A's transaction outlives B


def _write(stack: FaultStack, plan: dict[str, list], lo: int, hi: int) -> None:
    """Events ``lo..hi`` of every session; a ``late`` session starts 20 events later
    (its first events are in A's dying transaction, its first checkpoint is B's)."""
    with SessionWriter(stack.config, client_id="zombie-writer") as writer:
        for sid, events in plan.items():
            shift = 20 if sid.startswith("late") else 0
            if hi - shift <= 0:
                continue
            writer.attach(sid, _session_at(stack, sid))
            for event in events[max(lo - shift, 0) : hi - shift]:
                writer.append_event(sid, event)
                stack.written.setdefault(sid, []).append(event)


def _session_at(stack: FaultStack, sid: str):
    from processor.offline import fold_events

    return fold_events(stack.written.get(sid, []))


def _caught_up(stack: FaultStack) -> bool:
    try:
        committed = stack.committed()
    except Exception:
        return False
    return all(committed.get(p, -1) >= end for p, end in stack.ends().items())


@pytest.mark.parametrize("mode", ["wait", "repair"])
def test_restore_behind_a_zombie_transaction_is_never_stale(
    cluster: LocalCluster, tmp_path: Path, mode: str
) -> None:
    stack = make_stack(cluster, tmp_path, partitions=1)
    env = {"PROCESSOR_RESTORE_STABLE_WAIT_MS": "0"} if mode == "repair" else {}
    plan = {**session_plan(6, 80, SEED, "z"), **session_plan(2, 60, SEED + 1, "late")}
    follower = Follower(stack.config)
    follower.start()
    try:
        _write(stack, plan, 0, 20)
        arm = tmp_path / "arm"
        a = stack.spawn(
            "zA",
            env={
                "PROCESSOR_FAULTPOINT": "before-send-offsets",
                "PROCESSOR_FAULTPOINT_ARM": str(arm),
            },
            transaction_timeout_ms=A_TRANSACTION_TIMEOUT_MS,
        )
        wait_until(
            lambda: _caught_up(stack), 120, "A to commit the first events", stack.member_report
        )
        arm.touch()  # A's next transaction dies before it sends its offsets
        _write(stack, plan, 20, 40)
        wait_until(lambda: not a.alive(), 60, "A to die at the crash point", stack.member_report)
        b = stack.spawn("zB", env=env)
        _write(stack, plan, 40, 60)
        wait_until(lambda: _caught_up(stack), 180, "B to commit past A", stack.member_report)
        assert "open transaction" in b.log.read_text(), (
            "B restored without meeting A's open transaction: the scenario did not happen\n"
            + stack.member_report()
        )
        b.kill()
        _write(stack, plan, 60, 80)
        c = stack.spawn("zC", env=env)
        stack.wait_caught_up(180)
        stack.assert_views_equal_offline_fold()
        assert c.alive(), stack.member_report()
        if mode == "repair":
            assert "restored stale" in c.log.read_text(), stack.member_report()
        wait_until(lambda: follower.records > 0, 30, "the follower to read")
    finally:
        follower.stop.set()
        follower.join(30)
        stack.stop_all()
    follower.check()
