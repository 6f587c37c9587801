"""The loop's per-record fold (service/fold_loop.py), on the client's own
message objects: what the compiled build's loop reads from a Kafka consumer."""

from __future__ import annotations

from confluent_kafka import KafkaError, Message

from processor.engine import Out
from processor.kafka.transport import Msg
from processor.service.loop.fold_loop import fold_messages
from tests.engine.kit import EVENTS, Harness, session_log


def _msg(partition: int, offset: int, key: bytes | None, value: bytes | None, ts: int) -> Message:
    return Message(
        topic=EVENTS, partition=partition, offset=offset, key=key, value=value, timestamp=(1, ts)
    )


def _outs(h: Harness) -> list[tuple[str, int, bytes | None, bytes | None]]:
    outs: list[Out] = list(h.engine.output())
    return [(o.topic, o.partition, o.key, o.value) for o in outs]


def test_messages_fold_as_their_records_skipping_errors_and_unowned_partitions() -> None:
    direct, looped = Harness((0,)), Harness((0,))
    records = [direct.event("s-1", e) for e in session_log(5)]
    records.append(direct.record(None, b"no key"))  # the engine's dead letter
    for rec in records:
        direct.fold(rec)
    msgs = [_msg(0, r.offset, r.key, r.value, r.timestamp) for r in records]
    msgs.insert(2, Message(topic=EVENTS, partition=0, error=KafkaError(KafkaError._PARTITION_EOF)))
    msgs.insert(4, _msg(1, 0, b"s-2", records[0].value, 5))  # partition 1 is not owned
    errors: list[Msg] = []

    consumed = fold_messages(looped.engine, msgs, errors.append)

    assert consumed == len(records)
    assert [m.error() is not None for m in errors] == [True]
    assert looped.engine.batch.offsets == {0: records[-1].offset + 1}
    assert _outs(looped) == _outs(direct)
