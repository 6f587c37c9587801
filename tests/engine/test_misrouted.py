"""A record outside the partition its key hashes to is refused, not folded (rule KEY).

A session lives in the events partition its key hashes to (murmur2): its
views and checkpoints carry that partition's number, redrives are refused
anywhere else and queries look there.  A writer with another partitioner
(librdkafka's default is CRC32) or an explicit partition put a session's
record elsewhere; folded there, it started a second copy of the session
(a gap at its first event: a quarantined status view in another views
partition), and readers saw two values for one view.  Pure: the engine
alone decides.
"""

from __future__ import annotations

from processor.engine import Fate
from processor.engine.commands import partition_of
from tests.engine.kit import Harness, session_log

N = 3


def _home(sid: str) -> int:
    return partition_of(sid.encode(), N)


def test_a_record_in_another_partition_is_a_key_dead_letter_and_touches_no_session() -> None:
    h = Harness(partitions=tuple(range(N)))
    h.engine.partition_count = N
    log = session_log(8)
    sid = "s"
    home, other = _home(sid), (_home(sid) + 1) % N
    assert {o.fate for o in h.fold_events(sid, log[:5], home)} == {Fate.APPLIED}
    stray = h.event(sid, log[5], other)
    outcome = h.fold(stray)
    assert (outcome.fate, outcome.rule, outcome.session_id) == (Fate.REJECTED, "KEY", sid)
    assert f"hashes to partition {home} of {N}" in (outcome.reason or "")
    # nothing of the session exists in the other partition; its home folds on
    assert sid not in h.engine.partitions[other].sessions
    assert h.engine.sessions_quarantined() == 0
    assert {o.fate for o in h.fold_events(sid, log[5:], home)} == {Fate.APPLIED}
    h.commit()
    letters = h.dead_letters()
    assert [(d.rule, d.partition, d.offset, d.session_id) for d in letters] == [
        ("KEY", other, stray.offset, sid)
    ]
    assert letters[0].value == stray.value  # the record itself, to produce again
    # views and checkpoints only in the home partition
    assert {o.partition for o in h.produced if o.topic != h.engine.topics.dlq} == {home}
    assert h.views()[sid]["status"].value == {"state": "ok", "lastSeq": log[-1].seq}


def test_undecodable_bytes_in_another_partition_quarantine_nothing_there() -> None:
    """The route is checked before the value: a misrouted bad record must not
    quarantine a shadow copy of the session in the wrong partition."""
    h = Harness(partitions=tuple(range(N)))
    h.engine.partition_count = N
    sid = "s"
    other = (_home(sid) + 2) % N
    outcome = h.fold(h.record(sid.encode(), b"\x00garbage", other))
    assert (outcome.fate, outcome.rule) == (Fate.REJECTED, "KEY")
    assert h.engine.partitions[other].sessions == {}
    assert h.engine.sessions_quarantined() == 0


def test_an_unknown_partition_count_checks_nothing() -> None:
    """Before a restore has read the topic's partition count (broker-less harnesses)."""
    h = Harness(partitions=(0,))
    sid = next(s for s in (f"s{i}" for i in range(50)) if _home(s) != 0)
    assert {o.fate for o in h.fold_events(sid, session_log(3))} == {Fate.APPLIED}
