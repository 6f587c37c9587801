"""A subscriber follows the views topic of a running processor (issue 12).

The sessions compact (surface replace ranges) and offload images (a
message's content changes in place), produced a few events at a time so
the follower sees many commits.  Every session snapshot the follower
assembles from ``views_reader.follow_views`` equals the offline fold of the
log up to that snapshot's ``asOfSeq``, and at the end every session's views
equal the fold of its whole log.

``follow_views`` yields one update per view; the updates of one session
and commit come together and hold exactly one ``status`` change (the
session's ``lastSeq`` moves in every commit that folds one of its events),
but their order within the commit is the reader's business.  So the check
is: between one status update and the next one of the same session, the
follower's view of that session must, at some update, equal the fold at
that status' ``lastSeq`` (the commit's end lies in that window whatever the
order).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from processor.client.views_reader import follow_views, session_fold_equivalent
from processor.core.events import Event
from processor.service.loop.runner import Processor
from processor.workload import generate_session
from tests.engine.kit import offline_fold, plain
from tests.service.conftest import Stack
from tests.service.running import RunningProcessor

pytestmark = pytest.mark.kafka

LENGTH = 90
SESSIONS = 3
DEADLINE_S = 240.0


def _replaces(log: list[Event]) -> int:
    return sum(
        isinstance(e.surface_op, Mapping) and e.surface_op.get("op") == "replace" for e in log
    )


def _logs() -> dict[str, list[Event]]:
    """Sessions whose logs compact and offload images (the first seeds that do)."""
    logs: dict[str, list[Event]] = {}
    for seed in range(500):
        log = generate_session(random.Random(seed), LENGTH, context_budget=14)
        if _replaces(log) >= 2 and any(e.type == "image/offload" for e in log):
            logs[f"follow/{seed}"] = log
            if len(logs) == SESSIONS:
                return logs
    raise AssertionError("no generated log both compacts and offloads images")


@dataclass
class Seen:
    """What the follower saw, per session: one entry per update."""

    # (lastSeq when the update is the session's status, else None; snapshot or None)
    updates: dict[str, list[tuple[int | None, Any]]] = field(default_factory=dict)
    last_seq: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def at_least(self, want: dict[str, int]) -> bool:
        with self.lock:
            return all(self.last_seq.get(sid, -1) >= seq for sid, seq in want.items())


def _snapshot(views: dict[str, Any]) -> Any:
    """The session as the fold shows it, or None while a core view is still missing."""
    try:
        return plain(session_fold_equivalent(views))
    except (KeyError, ValueError):
        return None


def _produce_paced(
    stack: Stack, logs: dict[str, list[Event]], seen: Seen, errors: list[BaseException]
) -> None:
    """A few events per session, then wait until the follower saw them committed."""
    try:
        rng = random.Random(5)
        producer = stack.producer()
        at = dict.fromkeys(logs, 0)
        while any(at[sid] < len(log) for sid, log in logs.items()):
            want: dict[str, int] = {}
            for sid, log in logs.items():
                chunk = log[at[sid] : at[sid] + rng.randint(1, 4)]
                if chunk:
                    stack.produce(sid, chunk, producer)
                    at[sid] += len(chunk)
                    want[sid] = chunk[-1].seq
            assert producer.flush(30) == 0
            deadline = time.monotonic() + 60
            while not seen.at_least(want):
                assert not errors, errors
                assert time.monotonic() < deadline, f"the follower did not see {want}"
                time.sleep(0.05)
    except BaseException as exc:  # reported by the main thread
        errors.append(exc)


def test_a_follower_sees_only_snapshots_equal_to_the_fold_at_their_seq(stack: Stack) -> None:
    cfg = stack.config
    logs = _logs()
    final = {sid: log[-1].seq for sid, log in logs.items()}
    whole = {sid: offline_fold(log) for sid, log in logs.items()}
    latest: dict[str, Any] = {}
    running = RunningProcessor(Processor(cfg))
    errors = running.errors
    seen = Seen()
    producer = threading.Thread(
        target=_produce_paced, args=(stack, logs, seen, errors), daemon=True
    )
    producer.start()
    views: dict[str, dict[str, Any]] = {}
    try:
        for update in follow_views(cfg, stop_after_s=DEADLINE_S):
            assert not errors, errors
            sid = update.session_id
            if sid not in logs:
                continue
            assert update.regressed_from is None, update
            session = views.setdefault(sid, {})
            if update.record is None:
                session.pop(update.view, None)
            else:
                session[update.view] = update.record
            status = (
                update.record.value["lastSeq"]
                if update.view == "status" and update.record
                else None
            )
            latest[sid] = _snapshot(session)
            with seen.lock:
                seen.updates.setdefault(sid, []).append((status, latest[sid]))
                if status is not None:
                    seen.last_seq[sid] = status
            if all(latest.get(s) == whole[s] for s in logs):
                break  # every session's last commit fully read
    finally:
        running.stop()
        producer.join(60)
    assert not errors, errors
    assert seen.at_least(final), f"the follower stopped at {seen.last_seq}, want {final}"

    for sid, log in logs.items():
        folds: dict[int, Any] = {}
        updates = seen.updates[sid]
        statuses = [i for i, (status, _) in enumerate(updates) if status is not None]
        assert len(statuses) >= 10, f"{sid}: only {len(statuses)} commits seen"
        for k, start in enumerate(statuses):
            seq = updates[start][0]
            assert seq is not None
            end = statuses[k + 1] if k + 1 < len(statuses) else len(updates)
            window = [snap for _, snap in updates[start:end]]
            if seq not in folds:
                folds[seq] = offline_fold([e for e in log if e.seq <= seq])
            want = folds[seq]
            assert any(snap == want for snap in window), (
                f"{sid}: no snapshot between update {start} and {end} equals the fold at seq {seq}"
            )
        assert updates[-1][1] == whole[sid], sid  # the follower ended on the whole fold
    # the compaction and the image offloads were among what the follower checked
    for sid, log in logs.items():
        checked = {s for s, _ in seen.updates[sid] if s is not None}
        offload = next(e.seq for e in log if e.type == "image/offload")
        assert any(s >= offload for s in checked), sid
