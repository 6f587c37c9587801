"""A static KIP-848 member refused with UNRELEASED_INSTANCE_ID closes its
(fatal) consumer and joins again with a new one after a bounded backoff,
each refusal reported; other errors pass through (rejoin.py, issue 37).

Pure: fake consumers stand in for librdkafka's; the real broker's refusal is
``test_group_protocol_kafka.py``'s.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import KafkaError

from processor.kafka import rejoin
from processor.kafka.rejoin import RejoiningConsumer, unreleased

FATAL_TEXT = f"Fatal error: {rejoin.UNRELEASED_TEXT}: ConsumerGroupHeartbeat fatal error"


class _Msg:
    def __init__(self, err: KafkaError | None) -> None:
        self._err = err

    def error(self) -> KafkaError | None:
        return self._err


class _Consumer:
    def __init__(self, answers: list[list[_Msg]]) -> None:
        self.answers = answers
        self.subscribed: list[Any] = []
        self.closed = False

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        self.subscribed.append((topics, callbacks))

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[_Msg]:
        return self.answers.pop(0) if self.answers else []

    def assignment(self) -> list[int]:
        return [0] if self.subscribed and not self.answers else []

    def close(self) -> None:
        self.closed = True


def test_unreleased_is_the_fatal_error_naming_the_instance_id() -> None:
    assert unreleased(KafkaError(KafkaError._FATAL, FATAL_TEXT, fatal=True))
    assert not unreleased(KafkaError(KafkaError._FATAL, "Fatal error: something else"))
    assert not unreleased(KafkaError(KafkaError.UNKNOWN_MEMBER_ID))


def test_a_refused_member_closes_its_consumer_waits_and_joins_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    refusal = [_Msg(KafkaError(KafkaError._FATAL, FATAL_TEXT, fatal=True))]
    made = [_Consumer([refusal]), _Consumer([refusal]), _Consumer([]), _Consumer([])]
    spare = list(made)
    lines: list[str] = []
    member = RejoiningConsumer(lambda: spare.pop(0), "g", lines.append)
    member.subscribe(["events"], on_assign=print)
    assert member.consume(10, 0.1) == []  # refused: reported, consumer replaced
    assert made[0].closed and len(lines) == 1 and "UNRELEASED_INSTANCE_ID" in lines[0]
    assert made[1].subscribed == []  # not before the backoff
    waited_from = clock[0]
    while not made[1].subscribed:
        assert member.consume(10, 0.1) == []
    assert clock[0] - waited_from == pytest.approx(rejoin.BACKOFF_S[0])
    # joined with the same subscription, and refused at once again: the next step
    assert made[1].subscribed == [(["events"], {"on_assign": print})]
    assert made[1].closed and len(lines) == 2
    waited_from = clock[0]
    while not made[2].subscribed:
        member.consume(10, 0.1)
    assert clock[0] - waited_from == pytest.approx(rejoin.BACKOFF_S[1])
    assert member.consume(10, 0.1) == [] and member.assignment() == [0]
    assert not made[2].closed and len(lines) == 2


def test_other_consume_errors_pass_through() -> None:
    other = _Msg(KafkaError(KafkaError._TRANSPORT))
    inner = _Consumer([[other]])
    member = RejoiningConsumer(lambda: inner, "g", lambda line: None)
    assert member.consume(10, 0.1) == [other]
    assert not inner.closed
