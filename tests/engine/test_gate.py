"""The seq gate (S-1, the seq gate per session) without a broker."""

from __future__ import annotations

from dataclasses import replace

from processor.core.builtin import default_registry
from processor.core.defaults import default_message_projections
from processor.core.session import Session, synthetic_header
from processor.engine import Fate
from processor.engine.gate import Gate, judge, refusal
from processor.engine.runtime import SessionRuntime
from tests.engine.kit import CONFIG, Harness, changed, session_log


def _runtime(window: int = 256) -> SessionRuntime:
    session = Session(
        synthetic_header("s"),
        message_projections=default_message_projections(),
        projections=default_registry(),
    )
    return SessionRuntime("s", 0, session, window=window)


def test_S1_gate_verdicts_for_next_retry_rewrite_old_and_gap() -> None:
    log = session_log(8)
    rt = _runtime(window=3)
    for offset, event in enumerate(log[:6]):
        assert judge(rt, event) is Gate.APPLY
        rt.session.append(event)
        rt.record_applied(event, offset)
    assert judge(rt, log[6]) is Gate.APPLY
    assert judge(rt, log[5]) is Gate.DUPLICATE
    assert judge(rt, log[3]) is Gate.DUPLICATE  # the oldest seq still in the window
    assert judge(rt, changed(log[4])) is Gate.CONFLICT
    assert judge(rt, log[2]) is Gate.UNPROVABLE  # older than the 3-digest window
    assert judge(rt, log[7]) is Gate.GAP
    assert refusal(Gate.GAP, 7, 5) == ("S-1", "seq 7: gap, expected 6 (S-1)")
    assert refusal(Gate.CONFLICT, 4, 5)[0] == "SEQ-GATE"


def test_S1_a_reread_past_the_window_at_a_passed_offset_is_a_duplicate() -> None:
    """A rewind to a committed offset behind the checkpoints (without
    transactions: a crash after the checkpoints were delivered) reads events
    older than the digest window again: their offsets, at or before the
    session's last applied one, prove them judged before, so they drop
    quietly instead of each becoming an "unprovable" dead letter.  A record
    at a later offset (a producer's retry) still cannot be proven equal."""
    log = session_log(8)
    rt = _runtime(window=3)
    for offset, event in enumerate(log[:6]):
        rt.session.append(event)
        rt.record_applied(event, 10 + offset)
    assert judge(rt, log[1], 11) is Gate.DUPLICATE  # the record it was folded from
    assert judge(rt, log[1], 15) is Gate.DUPLICATE  # at or before the last applied offset
    assert judge(rt, log[1], 16) is Gate.UNPROVABLE  # after it: not a re-read
    assert judge(rt, log[1]) is Gate.UNPROVABLE  # no offset: nothing proven
    assert judge(rt, changed(log[4]), 14) is Gate.CONFLICT  # the window still decides


def test_S1_events_in_order_are_applied_and_published_once() -> None:
    h = Harness()
    log = session_log(30)
    outcomes = h.fold_events("s", log)
    assert {o.fate for o in outcomes} == {Fate.APPLIED}
    assert h.engine.tally.events == {"applied": 30}
    assert h.engine.partitions[0].sessions["s"].last_seq == log[-1].seq
    h.commit()
    assert h.dead_letters() == []


def test_S1_an_exact_retry_is_dropped_without_output() -> None:
    h = Harness()
    log = session_log(10)
    h.fold_events("s", log)
    h.commit()
    retry = h.fold(h.event("s", log[4]))
    assert retry.fate is Fate.DUPLICATE
    assert h.engine.batch.empty() and h.commit() == []
    assert h.engine.partitions[0].sessions["s"].quarantine is None
    assert h.engine.tally.events["duplicate"] == 1


def test_S1_a_conflicting_duplicate_is_dead_lettered_and_quarantines() -> None:
    h = Harness()
    log = session_log(10)
    h.fold_events("s", log)
    outcome = h.fold(h.event("s", changed(log[4])))
    assert (outcome.fate, outcome.rule) == (Fate.REJECTED, "SEQ-GATE")
    assert "conflicting duplicate" in (outcome.reason or "")
    rt = h.engine.partitions[0].sessions["s"]
    assert rt.quarantine is not None and rt.quarantine.seq == log[-1].seq
    h.commit()
    [letter] = h.dead_letters()
    assert (letter.rule, letter.seq, letter.session_id) == ("SEQ-GATE", log[4].seq, "s")


def test_S1_a_duplicate_older_than_the_window_cannot_be_proven_equal() -> None:
    h = Harness(config=replace(CONFIG, duplicate_window=2))
    log = session_log(10)
    h.fold_events("s", log)
    outcome = h.fold(h.event("s", log[1]))
    assert (outcome.fate, outcome.rule) == (Fate.REJECTED, "SEQ-GATE")
    assert "verification window" in (outcome.reason or "")


def test_S1_a_gap_is_refused_never_skipped() -> None:
    h = Harness()
    log = session_log(10)
    h.fold_events("s", log[:5])
    gap = h.fold(h.event("s", log[6]))
    assert (gap.fate, gap.rule) == (Fate.REJECTED, "S-1")
    assert gap.reason == f"seq {log[6].seq}: gap, expected {log[5].seq} (S-1)"
    # the missing event arriving late does not resume the session: it is quarantined
    late = h.fold(h.event("s", log[5]))
    assert late.fate is Fate.QUARANTINED
    assert h.engine.partitions[0].sessions["s"].last_seq == log[4].seq


def test_S1_window_digests_are_the_event_digests_checkpoints_anchor_on() -> None:
    """The window keeps the first 8 bytes of ``event_digest`` (computed without its
    hex, once per event): the same bytes a checkpoint's anchor starts with."""
    from processor.core.session import event_digest
    from processor.engine.runtime import _short_digest

    events = session_log(40, seed=3)
    h = Harness()
    h.fold_events("s", events)
    rt = h.engine.partitions[0].sessions["s"]
    assert rt.digests == [bytes.fromhex(event_digest(e)[:16]) for e in events]
    assert all(_short_digest(e) == bytes.fromhex(event_digest(e)[:16]) for e in events)
    h.commit()
    anchor = h.checkpoints()["s"].anchor
    assert anchor.digest == bytes.fromhex(event_digest(events[-1]))
    assert anchor.digest[:8] == rt.digests[-1]
