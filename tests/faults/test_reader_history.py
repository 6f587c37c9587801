"""Readers never hide history, and the retry/close helpers ride out broker faults.

Pure tests (no broker): the materializer is fed encoded view records in log
order, exactly as the readers feed it from the views topic.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from processor.client.views_reader import _Materializer, view_update_json
from processor.codec import View, default_codec, split_view, view_key
from processor.kafka.retry import FatalBudget, is_transient, retry, run_all


def _records(
    sid: str,
    name: str,
    seq: int,
    value: Any,
    max_bytes: int = 1 << 20,
) -> list[tuple[bytes, bytes]]:
    codec = default_codec()
    parts = split_view(View.of(sid, name, seq, -1, value, threshold=1 << 30), max_bytes)
    return [
        (view_key(sid, name, p.part), codec.encode_view(p))
        for p in sorted(parts, key=lambda p: -p.part)
    ]


def _feed(m: _Materializer, records: list[tuple[bytes, bytes]]) -> list[Any]:
    out = [m.apply(k, v, 0, i) for i, (k, v) in enumerate(records)]
    return [u for u in out if u is not None]


def test_lower_as_of_seq_is_surfaced_and_the_latest_record_wins() -> None:
    m = _Materializer(default_codec(), None, None)
    updates = _feed(
        m,
        [
            *_records("s", "status", 49, {"state": "ok", "lastSeq": 49}),
            *_records("s", "status", 69, {"state": "ok", "lastSeq": 69}),
            *_records("s", "status", 49, {"state": "quarantined", "lastSeq": 49}),
        ],
    )
    assert [u.record.as_of_seq for u in updates] == [49, 69, 49]
    assert [u.regressed_from for u in updates] == [None, None, 69]
    assert m.views["s"]["status"].value["state"] == "quarantined"  # not hidden behind "ok"
    assert [(r.view, r.previous, r.as_of_seq) for r in m.regressions] == [("status", 69, 49)]
    assert view_update_json(updates[2])["regressedFrom"] == 69


def test_a_split_view_going_back_is_assembled_not_dropped() -> None:
    m = _Materializer(default_codec(), None, None)
    big = ["x" * 50 for _ in range(40)]
    newer = _records("s", "messages", 70, big, max_bytes=300)
    older = _records("s", "messages", 50, big[:30], max_bytes=300)
    assert len(newer) > 1 and len(older) > 1
    updates = _feed(m, [*newer, *older])
    assert [u.record.as_of_seq for u in updates] == [70, 50]
    assert m.views["s"]["messages"].value == big[:30]
    assert len(m.regressions) == 1


def test_a_tombstone_lets_a_view_start_again_lower_without_a_warning() -> None:
    m = _Materializer(default_codec(), None, None)
    recs = _records("s", "status", 40, {"lastSeq": 40})
    _feed(m, recs)
    m.apply(recs[-1][0], None)  # a rebuild tombstones the old views first
    _feed(m, _records("s", "status", 3, {"lastSeq": 3}))
    assert m.views["s"]["status"].as_of_seq == 3 and not m.regressions


@pytest.mark.parametrize(
    "code",
    [
        KafkaError._DESTROY_BROKER,
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNSTABLE_OFFSET_COMMIT,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    ],
)
def test_broker_fault_errors_are_retried_until_they_pass(code: int) -> None:
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise KafkaException(KafkaError(code))
        return "ok"

    assert is_transient(KafkaException(KafkaError(code)))
    assert retry(flaky, "test", deadline_s=10, first_delay=0.01) == "ok"
    assert len(calls) == 3


def test_permanent_and_fatal_errors_are_not_retried() -> None:
    calls = []

    def denied() -> None:
        calls.append(1)
        raise KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))

    with pytest.raises(KafkaException):
        retry(denied, "test", deadline_s=10, first_delay=0.01)
    assert len(calls) == 1
    assert not is_transient(KafkaException(KafkaError(KafkaError._TRANSPORT, fatal=True)))


def test_a_transient_error_past_the_deadline_reaches_the_caller() -> None:
    def down() -> None:
        raise KafkaException(KafkaError(KafkaError._TRANSPORT))

    with pytest.raises(KafkaException):
        retry(down, "test", deadline_s=0.2, first_delay=0.05)


def test_close_steps_all_run_when_one_raises() -> None:
    ran = []

    def timed_out() -> None:
        ran.append("consumer")
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT))

    run_all(
        [
            ("consumer close", timed_out),
            ("producer flush", lambda: ran.append("producer")),
            ("nothing", None),
            ("restore close", lambda: ran.append("restore")),
        ]
    )
    assert ran == ["consumer", "producer", "restore"]


def test_a_fatal_producer_error_is_replaced_a_bounded_number_of_times() -> None:
    budget = FatalBudget(limit=2, window_s=60)
    broken = KafkaError(KafkaError.INVALID_TXN_STATE, fatal=True)
    assert budget.allow(broken) and budget.allow(broken)
    assert not budget.allow(broken)  # a cause that stays ends the process
    budget.succeeded()  # a transaction committed since: the cause did not stay
    assert budget.allow(broken) and budget.allow(broken)
    assert not budget.allow(broken)
    denied = KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, fatal=True)
    assert not FatalBudget().allow(denied)
