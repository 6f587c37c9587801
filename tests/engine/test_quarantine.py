"""Bad input: dead letters and quarantine (bad input never stops the
partition and is never lost), without a broker."""

from __future__ import annotations

from processor.engine import Fate
from processor.engine.dead_letters import MAX_COPIED_VALUE, MAX_KEY_BYTES
from tests.engine.kit import CODEC, EVENTS, Harness, session_log


def test_undecodable_bytes_are_dead_lettered_and_quarantine_at_the_last_valid_seq() -> None:
    h = Harness()
    log = session_log(12)
    h.fold_events("bad", log[:4])
    h.fold_events("good", log[:4])
    junk = h.record(b"bad", b"\x00not avro")
    outcome = h.fold(junk)
    assert (outcome.fate, outcome.rule) == (Fate.REJECTED, "CODEC")
    # later events of the quarantined session are dead letters too; others flow
    assert h.fold(h.event("bad", log[4])).fate is Fate.QUARANTINED
    assert {o.fate for o in h.fold_events("good", log[4:])} == {Fate.APPLIED}
    h.commit()
    letters = h.dead_letters()
    assert [(d.rule, d.offset) for d in letters] == [
        ("CODEC", junk.offset),
        ("QUARANTINED", junk.offset + 1),
    ]
    first = letters[0]
    assert (
        first.session_id,
        first.topic,
        first.partition,
        first.key,
        first.value,
        first.timestamp,
        first.processor,
    ) == ("bad", EVENTS, 0, b"bad", b"\x00not avro", junk.timestamp, "unit")
    status = h.views()["bad"]["status"].value
    assert status["state"] == "quarantined" and status["lastSeq"] == log[3].seq
    assert status["quarantine"]["rule"] == "CODEC" and status["quarantine"]["seq"] == log[3].seq
    assert h.views()["good"]["status"].value == {"state": "ok", "lastSeq": log[-1].seq}


def test_a_quarantined_session_keeps_its_views_at_the_quarantine_seq() -> None:
    h = Harness()
    log = session_log(12)
    h.fold_events("s", log[:6])
    h.commit()
    before = {name: v for name, v in h.views()["s"].items() if name != "status"}
    h.fold(h.event("s", log[7]))  # gap: quarantined at log[5].seq
    h.fold_events("s", log[8:])
    out = h.commit()
    # only the head (which carries the status) is rewritten
    assert {o.key for o in out if o.topic == h.engine.topics.views} == {b"s/~h"}
    after = h.views()["s"]
    assert {name: v for name, v in after.items() if name != "status"} == before


def test_key_problems_are_dead_lettered_without_quarantining_anyone() -> None:
    h = Harness()
    value = CODEC.encode_parsed_event("s", session_log(1)[0])
    no_key = h.fold(h.record(None, value))
    long_key = h.fold(h.record(b"k" * (MAX_KEY_BYTES + 1), value))
    not_utf8 = h.fold(h.record(b"\xff\xfe", value))
    for outcome, why in ((no_key, "has no key"), (long_key, "exceeds"), (not_utf8, "not UTF-8")):
        assert (outcome.fate, outcome.rule, outcome.session_id) == (Fate.REJECTED, "KEY", None)
        assert why in (outcome.reason or "")
    assert h.engine.partitions[0].sessions == {}
    h.commit()
    letters = h.dead_letters()
    assert [d.key for d in letters] == [None, None, b"\xff\xfe"]  # an oversized key is not copied
    assert h.engine.sessions_quarantined() == 0


def test_a_key_naming_another_session_quarantines_the_key_session() -> None:
    h = Harness()
    outcome = h.fold(h.record(b"a", CODEC.encode_parsed_event("b", session_log(1)[0])))
    assert (outcome.fate, outcome.rule, outcome.session_id) == (Fate.REJECTED, "KEY", "a")
    assert h.engine.partitions[0].sessions["a"].quarantine is not None
    assert h.engine.sessions_quarantined() == 1


def test_a_tombstone_on_the_events_topic_is_an_undecodable_record() -> None:
    h = Harness()
    outcome = h.fold(h.record(b"s", None))
    assert (outcome.fate, outcome.rule) == (Fate.REJECTED, "CODEC")
    assert "tombstone" in (outcome.reason or "")


def test_an_invalid_event_is_refused_with_the_core_rule() -> None:
    h = Harness()
    log = session_log(3)
    h.fold_events("s", log[:2])
    bad = h.record(
        b"s",
        CODEC.encode_event("s", {"type": "user/message", "seq": log[2].seq, "time": 0, "data": {}}),
    )
    outcome = h.fold(bad)
    assert outcome.fate is Fate.REJECTED and outcome.rule not in ("CODEC", "KEY", "S-1")
    assert h.engine.partitions[0].sessions["s"].quarantine.rule == outcome.rule  # type: ignore[union-attr]


def test_an_oversized_record_is_referenced_not_copied() -> None:
    h = Harness()
    outcome = h.fold(h.record(b"s", b"\x01" * (MAX_COPIED_VALUE + 1)))
    assert outcome.rule == "CODEC"
    assert h.engine.tally.dlq_oversized == 1
    h.commit()
    [letter] = h.dead_letters()
    assert letter.value is None and "sha256" in letter.reason


def test_a_failure_interpreting_a_record_is_that_records_dead_letter() -> None:
    h = Harness()
    rec = h.record(b"s", b"whatever")
    outcome = h.engine.fail(h.engine.partitions[0], rec, KeyError("boom"))
    assert (outcome.fate, outcome.rule) == (Fate.REJECTED, "INTERNAL")
    assert "KeyError" in (outcome.reason or "")
    assert h.engine.partitions[0].sessions["s"].quarantine is not None


def test_dead_letters_are_counted_by_rule_and_events_by_outcome() -> None:
    h = Harness()
    log = session_log(5)
    h.fold_events("s", log[:3])
    h.fold(h.event("s", log[2]))  # duplicate
    h.fold(h.event("s", log[4]))  # gap
    h.fold(h.event("s", log[3]))  # quarantined
    tally = h.engine.tally
    assert tally.events == {"applied": 3, "duplicate": 1, "rejected": 1, "quarantined": 1}
    assert tally.dlq == {"S-1": 1, "QUARANTINED": 1}
