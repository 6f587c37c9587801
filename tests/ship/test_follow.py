"""The follow loop against a runtime-like writer (issue 34, items 2-4), no broker."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from processor.ship.reader import digest
from tests.ship.helpers import Harness, events
from tests.ship.runtime_writer import RuntimeWriter

CORPUS = Path(__file__).parents[1] / "corpus" / "valid"


def _h(tmp_path: Path, **limits: float) -> Harness:
    (tmp_path / "root").mkdir()
    return Harness(tmp_path / "root", tmp_path / "state", **limits)


def test_batches_are_sent_once_in_order_as_they_land(tmp_path: Path) -> None:
    h = _h(tmp_path)
    evs = events(40)
    w = RuntimeWriter(h.root, "s")
    p = RuntimeWriter(h.root, "p", compressed=False)
    for i in range(0, 40, 7):
        w.append(evs[i : i + 7])
        p.append(evs[i : i + 7])
        h.drain()
    assert h.seqs("s") == list(range(40)) and h.seqs("p") == list(range(40))
    assert [e.to_bytes() for e in h.sent("s")] == [e.to_bytes() for e in evs]


def test_positions_advance_only_after_acknowledgement(tmp_path: Path) -> None:
    h = _h(tmp_path)
    w = RuntimeWriter(h.root, "s")
    w.append(events(10))
    h.sink.hold = True
    h.drain()
    assert h.seqs("s") == list(range(10))
    (held,) = h.shipper.registry.load()["s"].values()
    assert held.acked_seq == -1 and held.offset < w.path.stat().st_size  # the header only
    h.sink.hold = False
    h.drain()
    (row,) = h.shipper.registry.load()["s"].values()
    assert row.acked_seq == 9 and row.offset == w.path.stat().st_size


def test_kill_9_resends_only_unacknowledged_exact_duplicates(tmp_path: Path) -> None:
    h = _h(tmp_path)
    w = RuntimeWriter(h.root, "s")
    evs = events(60)
    w.append(evs[:30])
    h.drain()
    h.sink.hold = True
    w.append(evs[30:])
    h.drain()  # sent, never acknowledged
    h.restart()
    h.sink.hold = False
    h.drain()
    seqs = h.seqs("s")
    assert sorted(set(seqs)) == list(range(60))
    resent = [e for e in h.sent("s")[60:]]
    assert [e.seq for e in resent] == list(range(30, 60))
    assert all(digest(e) == digest(evs[e.seq]) for e in resent)  # exact duplicates


def test_unpersisted_events_per_session_stay_below_the_duplicate_window(tmp_path: Path) -> None:
    h = _h(tmp_path)
    w = RuntimeWriter(h.root, "s")
    w.append(events(600))
    h.sink.hold = True
    h.drain()
    assert len(h.seqs("s")) == 200  # the bound: what a kill -9 can make us resend
    h.sink.hold = False
    h.drain()
    assert h.seqs("s")[-1] == 599


def test_lost_registry_with_the_topic_floor_sends_nothing_twice(tmp_path: Path) -> None:
    h = _h(tmp_path)
    w = RuntimeWriter(h.root, "s")
    w.append(events(50))
    h.drain()
    shutil.rmtree(h.state)
    h.restart(floor={"s": 49})
    assert h.shipper.registry.fresh
    h.drain()
    assert h.seqs("s") == list(range(50))


def test_a_rolled_back_batch_rewritten_alike_is_not_sent_again(tmp_path: Path) -> None:
    h = _h(tmp_path)
    w = RuntimeWriter(h.root, "s", compressed=False)
    evs = events(20)
    w.append(evs[:10])
    h.drain()
    w._write(w._batch(evs[10:15]))  # on disk, not yet fsync'd: shipped
    h.drain()
    import os

    os.truncate(w.path, w.committed)  # fsync failed: rolled back
    h.drain()
    w.append(evs[10:20])  # the runtime retries the same events
    h.drain()
    assert h.seqs("s") == list(range(20))
    assert any("shrank" in line for line in h.lines)


def test_a_seq_already_sent_is_never_sent_with_a_different_event(tmp_path: Path) -> None:
    h = _h(tmp_path)
    w = RuntimeWriter(h.root, "s", compressed=False)
    evs = events(20)
    w.append(evs[:10])
    h.drain()
    w._write(w._batch(evs[10:15]))
    h.drain()
    import os

    os.truncate(w.path, w.committed)
    other = events(20, seed=99)
    w.append(other[10:12])
    h.drain()
    assert h.seqs("s") == list(range(15)), h.lines  # nothing new under seqs 10..14
    assert any("differs from the event already sent" in line for line in h.lines), h.lines
    assert h.shipper.metrics.refused.labels("rewritten")._value.get() == 1


def test_torn_tail_then_truncation_then_resume_closers(tmp_path: Path) -> None:
    h = _h(tmp_path)
    evs = events(30)
    for compressed in (True, False):
        w = RuntimeWriter(h.root, f"s{compressed}", compressed=compressed)
        w.append(evs[:10])
        w.write_torn(evs[10:16])  # the crash
        h.drain()
        # a torn frame is unread; the complete lines before a torn line are the log's
        assert h.seqs(w.sid) == list(range(10 if compressed else len(w.events)))
        w.append(evs[len(w.logical) : 30])  # resume: truncate, rewrite, closers and more
        h.drain()
        assert h.seqs(w.sid) == list(range(30))


def test_a_new_generation_is_followed_without_sending_a_seq_twice(tmp_path: Path) -> None:
    h = _h(tmp_path)
    w = RuntimeWriter(h.root, "s", version=3)
    evs = events(30)
    w.append(evs[:12])
    h.drain()
    reshaped = [
        e.__class__(
            e.type, e.seq, e.time + 1, e.data, e.surface_op, e.source_event_seqs, e.ignorable
        )
        if e.seq < 5
        else e
        for e in evs[:12]
    ]
    w.migrate(4, reshaped)
    w.append(evs[12:30])
    h.drain()
    assert h.seqs("s") == list(range(30))
    assert any("newer format generation" in line for line in h.lines)
    rows = h.shipper.registry.load()["s"]
    assert rows[4].acked_seq == 29 and rows[4].offset == w.path.stat().st_size


def test_sessions_created_while_running_and_hundreds_at_once(tmp_path: Path) -> None:
    h = _h(tmp_path)
    evs = events(5)
    h.drain()
    for i in range(300):
        RuntimeWriter(h.root, f"s{i}", cwd=f"/p/{i % 7}", compressed=bool(i % 2)).append(evs)
    h.drain()
    assert len(h.shipper.followed) == 300
    assert all(h.seqs(f"s{i}") == list(range(5)) for i in range(300))


def test_a_fork_is_its_own_session_with_its_copied_events(tmp_path: Path) -> None:
    h = _h(tmp_path)
    d = h.root / "--work-example--" / "forked-subagent"
    d.mkdir(parents=True)
    shutil.copy(CORPUS / "forked-subagent" / "session.v4.jsonl", d)
    h.drain()
    sent = h.sent("forked-subagent")
    assert len(sent) == 71 and sent[0].seq == 0
    assert any(e.type == "session/end-seed" for e in sent)


def test_an_unreadable_file_is_named_once_and_the_others_go_on(tmp_path: Path) -> None:
    h = _h(tmp_path)
    bad = h.root / "_no-cwd" / "bad"
    bad.mkdir(parents=True)
    (bad / "session.v4.jsonl").write_bytes(b"not json at all\n")
    old = h.root / "_no-cwd" / "old"
    old.mkdir()
    (old / "session.v2.jsonl").write_bytes(b'{"type":"session","version":2,"id":"old"}\n')
    RuntimeWriter(h.root, "good").append(events(4))
    h.drain()
    h.drain()
    assert h.seqs("good") == [0, 1, 2, 3]
    named = [line for line in h.lines if "refused" in line]
    assert len(named) == 2 and any("bad" in x for x in named) and any("v2" in x for x in named)
    assert h.shipper.metrics.refused_now._value.get() == 2


def test_a_seq_gap_refuses_the_session(tmp_path: Path) -> None:
    h = _h(tmp_path)
    w = RuntimeWriter(h.root, "s", compressed=False)
    evs = events(10)
    w.append(evs[:3] + evs[5:])
    h.drain()
    assert h.seqs("s") == [0, 1, 2]
    assert any("follows seq 2" in line for line in h.lines)


def test_a_file_rewritten_while_the_shipper_was_down_is_not_resent_differently(
    tmp_path: Path,
) -> None:
    h = _h(tmp_path)
    w = RuntimeWriter(h.root, "s", compressed=False)
    w.append(events(10))
    h.drain()
    h.restart()
    w.append(events(14)[10:])  # the same file grew: read on from the saved position
    h.drain()
    assert h.seqs("s") == list(range(14))
    h.restart()
    w.path.unlink()  # replaced by a different log under the same name
    RuntimeWriter(h.root, "s", compressed=False).append(events(16, seed=77))
    h.drain()
    assert h.seqs("s") == list(range(14))
    assert any("differs from the event already sent" in line for line in h.lines), h.lines


def test_readyz_names_a_broker_that_acknowledges_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from processor.ship import follow

    monkeypatch.setattr(follow, "STALL_S", 0.0)
    h = _h(tmp_path)
    RuntimeWriter(h.root, "s").append(events(5))
    h.sink.hold = True
    h.drain()
    h.shipper.metrics.health.ready = True
    status, body = h.shipper.metrics.health.readiness()
    assert status == 503 and b"no acknowledgement from the broker" in body
    h.sink.hold = False
    h.drain()
    assert h.shipper.metrics.health.readiness()[0] == 200


def test_a_live_writer_with_torn_tails_and_restarts_loses_and_doubles_nothing(
    tmp_path: Path,
) -> None:
    """The runtime appending (torn tails truncated by the next append) while the
    shipper reads, acknowledges at random and is restarted at random."""
    import random
    import threading

    h = _h(tmp_path)
    rng = random.Random(34)
    ws = [RuntimeWriter(h.root, f"s{i}", compressed=i % 2 == 0) for i in range(4)]
    logs = {w.sid: events(300, seed=340 + i) for i, w in enumerate(ws)}

    def write() -> None:
        wrng = random.Random(35)
        while any(len(w.logical) < 300 for w in ws):
            w = wrng.choice(ws)
            n = len(w.logical)
            if n >= 300:
                continue
            batch = logs[w.sid][n : n + wrng.randint(1, 25)]
            if n and wrng.random() < 0.15:
                w.write_torn(batch)
            else:
                w.append(batch)

    writer = threading.Thread(target=write)
    writer.start()
    while writer.is_alive():
        h.shipper.scan()
        h.shipper.turn()
        if rng.random() < 0.5:
            h.sink.poll(0)
        if rng.random() < 0.02:
            h.restart()
    writer.join()
    for w in ws:
        w.truncate_torn()
        if w.recovered:
            w.append([])
    h.restart()
    h.drain()
    assert not [line for line in h.lines if "refused" in line]
    for w in ws:
        assert sorted(set(h.seqs(w.sid))) == list(range(len(w.logical)))
        assert all(digest(e) == digest(w.logical[e.seq]) for e in h.sent(w.sid))  # exact


def test_a_bound_stopping_a_big_frame_carries_its_rest_instead_of_reading_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from processor.ship.reader import TailReader

    polls = []
    real = TailReader.poll

    def counted(self: TailReader, max_bytes: int = 1 << 22) -> object:
        polls.append(self.offset)
        return real(self, max_bytes)

    monkeypatch.setattr(TailReader, "poll", counted)
    h = _h(tmp_path)
    w = RuntimeWriter(h.root, "s", version=3)
    w.append(events(2))
    w.migrate(4, events(1000))  # one frame holding the whole log
    h.drain()
    assert h.seqs("s") == list(range(1000))
    assert len(polls) < 15  # 5 stops at the unpersisted bound, each carried
