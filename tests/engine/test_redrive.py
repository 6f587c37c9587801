"""Operator redrive (control.py semantics): a redrive at seq N lifts a quarantine taken
at seq N, held if read before, a no-op once past; without a broker."""

from __future__ import annotations

from dataclasses import replace

from processor.core.events import Event
from processor.engine import Fate
from processor.engine.commands import CommandError, redrive
from tests.engine.kit import CONTROL, Harness, changed, session_log


def _quarantined(h: Harness, sid: str = "s", n: int = 6) -> list[Event]:
    log = session_log(12)
    h.fold_events(sid, log[:n])
    h.fold(h.event(sid, changed(log[2])))  # conflicting duplicate: quarantined at log[n-1]
    assert h.engine.partitions[0].sessions[sid].quarantine.seq == log[n - 1].seq  # type: ignore[union-attr]
    return log


def test_redrive_at_the_quarantine_seq_lifts_it_and_the_session_resumes() -> None:
    h = Harness()
    log = _quarantined(h)
    assert h.redrive("s", log[5].seq) == ["lifted"]
    assert h.engine.sessions_quarantined() == 0
    assert {o.fate for o in h.fold_events("s", log[6:])} == {Fate.APPLIED}
    h.commit()
    assert h.views()["s"]["status"].value == {"state": "ok", "lastSeq": log[-1].seq}
    assert h.engine.tally.control == {"applied": 1}
    assert h.engine.batch.control_offsets == {}  # committed with the batch above


def test_redrive_for_another_seq_changes_nothing() -> None:
    h = Harness()
    log = _quarantined(h)
    assert h.redrive("s", log[3].seq) == ["noop"]  # a seq the session moved past
    assert h.fold(h.event("s", log[6])).fate is Fate.QUARANTINED
    assert h.engine.tally.control == {"noop": 1}


def test_redrive_twice_is_redrive_once() -> None:
    """A repeated command (a double click, a script run twice) must not pre-arm a
    lift of the next quarantine taken at the same seq."""
    h = Harness()
    log = _quarantined(h)
    assert h.redrive("s", log[5].seq) == ["lifted"]
    assert h.redrive("s", log[5].seq) == ["noop"]
    h.fold(h.event("s", changed(log[1])))  # refused again at the same seq
    assert h.engine.partitions[0].sessions["s"].quarantine is not None


def test_redrive_read_before_its_quarantine_lifts_it_when_it_happens() -> None:
    h = Harness()
    log = session_log(12)
    h.fold_events("s", log[:6])
    assert h.redrive("s", log[5].seq) == ["pending"]
    rt = h.engine.partitions[0].sessions["s"]
    assert rt.redrive_at == log[5].seq and (0, "s") in h.engine.batch.dirty
    refused = h.fold(h.event("s", changed(log[2])))
    assert refused.fate is Fate.REJECTED  # still dead-lettered ...
    assert rt.quarantine is None and rt.redrive_at is None  # ... but not quarantined
    assert h.fold(h.event("s", log[6])).fate is Fate.APPLIED
    # only the quarantine at that seq: the next refusal quarantines again
    h.fold(h.event("s", changed(log[1])))
    assert rt.quarantine is not None and rt.quarantine.seq == log[6].seq


def test_redrive_before_the_sessions_first_event_gets_no_checkpoint() -> None:
    h = Harness()
    assert h.redrive("new", 0) == ["pending"]
    # an anchor-less checkpoint would fail the restore's anchor check
    assert h.engine.batch.dirty == {}
    assert h.engine.batch.control_offsets == {0: 1}


def test_a_redrive_in_the_control_backlog_is_applied_before_the_next_event() -> None:
    h = Harness()
    log = _quarantined(h)
    h.feeds.backlog[0] = [h.command(redrive("s", log[5].seq))]
    assert h.fold(h.event("s", log[6])).fate is Fate.APPLIED
    assert h.feeds.asked == ["backlog 0"]
    # only the event right after the quarantine asks (a flood would not)
    h.fold(h.event("s", changed(log[0])))
    h.fold(h.event("s", log[8]))
    assert h.feeds.asked == ["backlog 0"]


def test_invalid_and_misrouted_commands_are_dead_lettered() -> None:
    h = Harness()
    log = _quarantined(h)

    class Misrouted(type(h.feeds)):  # type: ignore[misc]
        def check_route(self, command: object, partition: int) -> None:
            raise CommandError("in the wrong partition")

    junk = h.record(b"s", b"{not json", topic=CONTROL)
    assert h.engine.apply_commands([junk]) == ["refused"]
    h.engine.feeds = Misrouted()
    assert h.redrive("s", log[5].seq) == ["refused"]
    assert h.engine.partitions[0].sessions["s"].quarantine is not None
    assert h.engine.tally.control == {"rejected": 2}
    h.commit()
    letters = [d for d in h.dead_letters() if d.rule == "CONTROL"]
    assert [d.topic for d in letters] == [CONTROL, CONTROL]
    assert "wrong partition" in letters[1].reason


def test_commands_of_partitions_not_owned_are_skipped() -> None:
    h = Harness(partitions=(0,))
    assert h.redrive("s", 3, partition=1) == []
    assert h.engine.batch.empty()


def test_a_quarantine_and_a_held_redrive_survive_the_checkpoint() -> None:
    h = Harness()
    log = _quarantined(h, "q")
    h.fold_events("held", log[:4])
    assert h.redrive("held", log[3].seq) == ["pending"]
    h.commit()
    restored = Harness(checkpoints={0: h.checkpoints()})
    assert restored.engine.sessions_quarantined() == 1
    restored.offsets = dict(h.offsets)
    assert restored.fold(restored.event("q", log[6])).fate is Fate.QUARANTINED
    assert restored.redrive("q", log[5].seq) == ["lifted"]
    assert restored.fold(restored.event("q", log[6])).fate is Fate.APPLIED
    held = restored.fold(restored.event("held", changed(log[0])))
    assert held.fate is Fate.REJECTED
    assert restored.engine.partitions[0].sessions["held"].quarantine is None


def test_a_replaying_engine_publishes_no_dead_letters() -> None:
    h = Harness()
    h.engine.replaying = True
    h.fold(h.record(b"s", b"junk"))
    assert h.engine.batch.dead_letters == [] and h.engine.tally.dlq == {}
    assert replace(h.engine.tally).events == {}
