"""Hostile input without a broker: bounds, classification, commands, secrets (issue 9)."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from confluent_kafka import KafkaError, KafkaException

from processor.cli.main import cli
from processor.codec import DeadLetter
from processor.config import ServiceConfig, load_config
from processor.core.errors import SessionError
from processor.core.events import parse_event_bytes
from processor.core.frozen import MAX_DEPTH, JsonDepthError, freeze, json_problem
from processor.engine.dead_letters import MAX_COPIED_VALUE, MAX_KEY_BYTES, bounded
from processor.kafka.client_errors import ClientProblems, KafkaFatal, Kind, classify
from processor.service.loop.control import Command, CommandError, parse_command, redrive
from processor.service.ops.failures import FailureTracker
from processor.service.ops.http import serve
from processor.service.txn import transactions
from processor.telemetry.metrics import Metrics

HEADER = (
    b'{"type":"session","version":4,"id":"deep","createdAt":0,"isSeeded":false,'
    b'"delegationDepth":0}\n'
)
SYSTEM = (
    b'{"type":"system/message","seq":0,"time":1,"data":{"turn":0,"step":0,"message":'
    b'{"id":"s","role":"system","content":[{"type":"text","text":"p"}],'
    b'"source":{"kind":"system-prompt"}}},"surfaceOp":"append"}\n'
)


def nested(levels: int) -> str:
    return "[" * levels + "]" * levels


# ------------------------------------------------------------------ bounds (E-3)


def test_E3_freeze_bounds_depth_instead_of_overflowing_the_stack() -> None:
    ok = orjson.loads(nested(MAX_DEPTH))
    assert freeze(ok) == ok
    for levels in (MAX_DEPTH + 1, 1000):
        with pytest.raises(JsonDepthError) as info:
            freeze(orjson.loads(nested(levels)))
        assert info.value.rule == "E-3" and isinstance(info.value, SessionError)
    deep_dict = orjson.loads('{"a":' * 900 + "1" + "}" * 900)
    assert "nests deeper than" in (json_problem(deep_dict) or "")


def test_E3_parse_event_of_a_nesting_bomb_is_a_session_error() -> None:
    line = (
        b'{"type":"custom/x","seq":0,"time":0,"ignorable":true,"data":%s}' % nested(1000).encode()
    )
    with pytest.raises(SessionError) as info:
        parse_event_bytes(line)
    assert info.value.rule == "E-3"


def test_E3_fold_of_a_nesting_bomb_exits_1_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "deep.jsonl"
    path.write_bytes(
        HEADER + SYSTEM + b'{"type":"custom/x","seq":1,"time":2,'
        b'"ignorable":true,"data":%s}\n' % nested(1000).encode()
    )
    result = CliRunner().invoke(cli, ["fold", str(path)])
    assert result.exit_code == 1
    assert result.stderr.strip().endswith("(E-3)") and len(result.stderr.splitlines()) == 1
    assert "Traceback" not in result.output


def _ingest(tmp_path: Path, body: bytes, *extra: str) -> tuple[int, str]:
    path = tmp_path / "s.jsonl"
    path.write_bytes(body)
    # nothing reaches a broker: the file is refused before anything is produced
    result = CliRunner().invoke(
        cli, ["ingest", "-b", "127.0.0.1:1", "--topic-prefix", "x", *extra, str(path)]
    )
    return result.exit_code, result.stderr


def test_E3_ingest_of_a_nesting_bomb_is_refused_with_one_line(tmp_path: Path) -> None:
    code, err = _ingest(
        tmp_path,
        HEADER + SYSTEM + b'{"type":"custom/x","seq":1,"time":2,'
        b'"ignorable":true,"data":%s}\n' % nested(1000).encode(),
    )
    assert code == 1 and "(E-3)" in err and "Traceback" not in err


def test_ingest_refuses_a_record_kafka_cannot_take_before_producing(tmp_path: Path) -> None:
    big = "x" * 1_200_000
    line = (
        orjson.dumps(
            {
                "type": "user/message",
                "seq": 1,
                "time": 2,
                "surfaceOp": "append",
                "data": {
                    "id": "u",
                    "role": "user",
                    "source": {"kind": "test"},
                    "content": [{"type": "text", "text": big}],
                },
            }
        )
        + b"\n"
    )
    for extra in ((), ("--raw",)):
        code, err = _ingest(tmp_path, HEADER + SYSTEM + line, *extra)
        assert code == 1, err
        assert "exceeds message.max.bytes (1,000,000); nothing of this file was produced" in err
        assert "Traceback" not in err


# ------------------------------------------------------------------ dead letters fit


def letter(value: bytes | None, key: bytes | None = b"s") -> DeadLetter:
    return DeadLetter("s", "p.events", 3, 77, None, "CODEC", "undecodable", key, value, 1, "i")


def test_dead_letter_of_an_oversized_record_is_referenced_not_copied() -> None:
    small, copied = bounded(letter(b"abc"))
    assert small.value == b"abc" and not copied
    fitted, copied = bounded(letter(b"\x01" * 1_040_000, key=b"k" * 5000))
    assert copied and fitted.value is None and fitted.key is None
    assert "1040000 bytes, sha256 " in fitted.reason and "p.events[3]@77" in fitted.reason
    assert "key not copied (5000 bytes" in fitted.reason
    edge, copied = bounded(letter(b"\x01" * MAX_COPIED_VALUE))
    assert edge.value is not None and not copied
    long_sid = DeadLetter(
        "s" * (MAX_KEY_BYTES + 1), "t", 0, 0, None, "r", "x" * 10_000, None, None, 1, "i"
    )
    clipped, _ = bounded(long_sid)
    assert clipped.session_id is None and len(clipped.reason) <= 2000


# ------------------------------------------------------------------ control commands


def test_control_command_round_trip_and_refusals() -> None:
    assert parse_command(b"s", redrive("s", 4).encode()) == Command("redrive", "s", 4)
    bad = {
        "not json": b"redrive",
        "array": b"[]",
        "unknown command": orjson.dumps({"v": 1, "command": "nuke", "sessionId": "s", "seq": 1}),
        "version": orjson.dumps({"v": 2, "command": "redrive", "sessionId": "s", "seq": 1}),
        "extra": orjson.dumps({"v": 1, "command": "redrive", "sessionId": "s", "seq": 1, "x": 1}),
        "seq": orjson.dumps({"v": 1, "command": "redrive", "sessionId": "s", "seq": "1"}),
        "bool seq": orjson.dumps({"v": 1, "command": "redrive", "sessionId": "s", "seq": True}),
        "unsafe seq": orjson.dumps({"v": 1, "command": "redrive", "sessionId": "s", "seq": 2**53}),
        "sid": orjson.dumps({"v": 1, "command": "redrive", "sessionId": "", "seq": 1}),
        "size": b" " * 5000,
    }
    for why, value in bad.items():
        with pytest.raises(CommandError):
            parse_command(b"s", value)
            pytest.fail(why)
    with pytest.raises(CommandError, match="does not match"):
        parse_command(b"other", redrive("s", 1).encode())
    with pytest.raises(CommandError, match="no value"):
        parse_command(b"s", None)


# ------------------------------------------------------------------ transaction errors


def kerr(code: int, **flags: bool) -> KafkaException:
    return KafkaException(KafkaError(code, "x", **flags))


def test_transaction_errors_are_classified_by_the_confluent_model() -> None:
    assert classify(kerr(KafkaError._TIMED_OUT, retriable=True)).kind is Kind.RETRY
    assert classify(kerr(KafkaError._STATE, txn_requires_abort=True)).kind is Kind.ABORT
    assert classify(kerr(KafkaError._FENCED, fatal=True)).kind is Kind.FATAL
    assert classify(kerr(KafkaError.MSG_SIZE_TOO_LARGE)).kind is Kind.ABORT
    denied = classify(
        kerr(KafkaError.TOPIC_AUTHORIZATION_FAILED, txn_requires_abort=True),
        operation="WRITE",
        resource="p.views",
    )
    assert denied.kind is Kind.DENIED
    assert "WRITE on Topic 'p.views' is denied" in denied.line
    auth = classify(kerr(KafkaError._AUTHENTICATION))
    assert auth.kind is Kind.DENIED and "authentication with the broker failed" in auth.line


def test_a_failed_handshake_reported_by_librdkafka_becomes_fatal_at_once() -> None:
    problems = ClientProblems()
    problems.error_cb(KafkaError(KafkaError._TRANSPORT, "broker down"))
    problems.raise_if_fatal()  # transient: only noted
    assert problems.last_error and "broker down" in problems.last_error
    problems.error_cb(
        KafkaError(
            KafkaError._AUTHENTICATION,
            "SASL authentication error: Authentication failed due to invalid credentials",
        )
    )
    with pytest.raises(KafkaFatal, match="invalid credentials"):
        problems.raise_if_fatal()


def test_a_repeating_failure_backs_off_and_turns_readyz_503_with_its_cause() -> None:
    metrics = Metrics()
    metrics.health.ready = True
    server = serve(metrics, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.server_port}/readyz"
    try:
        tracker = FailureTracker(metrics, bound=3, base_s=0.1, max_s=1.0)
        waits = [tracker.failed("MSG_SIZE_TOO_LARGE on p.dlq") for _ in range(6)]
        assert waits == sorted(waits) and waits[-1] == 1.0 and waits[0] == 0.1
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(url)
        body = info.value.read().decode()
        assert info.value.code == 503 and "6 transactions failed in a row" in body
        assert "MSG_SIZE_TOO_LARGE on p.dlq" in body
        assert b"processor_degraded 1.0" in metrics.exposition()
        tracker.succeeded()
        assert urllib.request.urlopen(url).status == 200
    finally:
        server.shutdown()


# ------------------------------------------------------------------ secrets


def test_secrets_come_from_a_file_or_the_environment_never_repr(tmp_path: Path) -> None:
    secret = tmp_path / "kafka.secret"
    secret.write_text("# SASL\nsasl.password = s3cret\nsasl.username=proc\n")
    cfg = load_config(env={}, secret_file=secret)
    assert cfg.kafka["sasl.password"] == "s3cret" and cfg.kafka["sasl.username"] == "proc"
    env = {"PROCESSOR_X_SASL_PASSWORD": "fromenv", "PROCESSOR_KAFKA_SECRET_FILE": str(secret)}
    assert load_config(env=env).kafka["sasl.password"] == "s3cret"  # the file wins
    assert load_config(env={"PROCESSOR_X_SASL_PASSWORD": "e"}).kafka["sasl.password"] == "e"
    assert "s3cret" not in repr(cfg) and "s3cret" not in repr(ServiceConfig(kafka=cfg.kafka))


def test_a_secret_on_the_command_line_is_warned_about(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"not json\n")  # refused before any connection
    result = CliRunner().invoke(
        cli, ["ingest", "-b", "127.0.0.1:1", "-X", "sasl.password=oops", str(path)]
    )
    assert "sasl.password given with -X is visible to every user" in result.stderr
    assert "oops" not in result.output


def test_a_retriable_transaction_step_is_retried_an_abortable_one_is_not() -> None:
    metrics = Metrics()
    calls: list[int] = []

    def flaky() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise kerr(KafkaError._TIMED_OUT, retriable=True)

    transactions.retrying(flaky, metrics)
    assert len(calls) == 3 and metrics.txn_failures.labels("retriable")._value.get() == 2

    def abortable() -> None:
        calls.append(1)
        raise kerr(KafkaError._STATE, retriable=True, txn_requires_abort=True)

    calls.clear()
    with pytest.raises(KafkaException):
        transactions.retrying(abortable, metrics)
    assert len(calls) == 1  # abort first: retrying inside a doomed transaction is useless

    def always() -> None:
        calls.append(1)
        raise kerr(KafkaError._TIMED_OUT, retriable=True)

    calls.clear()
    with pytest.raises(KafkaException):
        transactions.retrying(always, metrics, attempts=3)
    assert len(calls) == 3  # bounded
