"""A hostile producer against two processors on a real broker (issue 9).

Over sixty kinds of bad record — undecodable bytes, bad keys, nesting bombs,
every invalid-event case of the corpus, seq-gate abuse, forged control
headers, malformed and unknown control commands, a record too big to copy
into a dead letter — are written among valid sessions while two processors
share the group.  Then:

- no processor died (both threads ran until told to stop, no exception);
- no partition stalled (committed offsets reached the end of events and control);
- every bad record is accounted for: a dead letter at its (topic, partition,
  offset) with the expected rule, or a counted duplicate;
- only the victims are quarantined, each at its last valid seq, its views
  equal to the offline fold of its valid prefix;
- every valid session equals the offline fold of its log (forged headers on
  its events changed nothing).
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)

from processor.client.views_reader import (
    materialize_views,
    offline_equivalent,
    session_fold_equivalent,
)
from processor.codec import View, default_codec
from processor.core.builder import LogBuilder
from processor.core.events import Event, parse_event
from processor.engine.dead_letters import MAX_COPIED_VALUE
from processor.kafka import clients
from processor.kafka.client_errors import KafkaFatal
from processor.kafka.reads import read_partitions
from processor.offline import fold_events, session_output
from processor.protocol import CONTROL_HEADER
from processor.service.loop.control import partition_of, redrive
from processor.service.loop.runner import Processor
from processor.service.ops.http import serve
from processor.telemetry.metrics import Metrics
from tests.service.conftest import Stack, as_json, sessions
from tests.service.running import RunningProcessor

pytestmark = pytest.mark.kafka

CORPUS = Path(__file__).parents[1] / "corpus" / "invalid"
codec = default_codec()


@dataclass
class Bad:
    kind: str
    topic: str
    key: bytes | None
    value: bytes | None
    rule: str | None  # expected DLQ rule; None: a counted exact duplicate
    headers: list[tuple[str, str | bytes | None]] | None = None
    where: tuple[int, int] | None = None  # (partition, offset) once delivered
    partition: int | None = None  # produce here instead of the key's partition


@dataclass
class Plan:
    bad: list[Bad] = field(default_factory=list)
    #: victim session -> its valid prefix (quarantined at the prefix's last seq)
    victims: dict[str, list[Event]] = field(default_factory=dict)
    #: follow-up records of victims, dead-lettered as QUARANTINED: (key, value)
    follow_ups: list[Bad] = field(default_factory=list)


def prefix_of(sid: str) -> list[Event]:
    b = LogBuilder()
    b.system("You are careful.")
    b.turn_start()
    b.user(f"hello from {sid}")
    return list(b.events)


def follow_up(seq: int) -> dict[str, Any]:
    return {"type": "custom/note", "seq": seq, "time": 1, "data": {"n": seq}, "ignorable": True}


def deep_but_valid() -> list[Event]:
    """A session whose tool arguments nest just under the bound: folded, not refused."""
    b = LogBuilder()
    b.system("You are careful.")
    b.turn_start()
    b.step_start()
    b.user("go deep")
    args: Any = {"leaf": True}
    for _ in range(120):
        args = {"k": [args]} if len(str(args)) % 2 else [args]
    call = b.tool_call("c1", "read", {"path": "a", "deep": args})
    b.tool_result("c1", "ok", call_seq=call.seq)
    return list(b.events)


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def encode(sid: str, envelope: dict[str, Any], data_text: str | None = None) -> bytes:
    return codec.encode_event(sid, envelope, data_text=data_text, trusted=True)


def _valid_without_a_header(lines: list[dict[str, Any]]) -> bool:
    try:
        fold_events([parse_event(raw) for raw in lines])
    except Exception:
        return False
    return True


def build_plan(events_topic: str, control_topic: str, good: dict[str, list[Event]]) -> Plan:
    plan = Plan()

    def victim(
        kind: str,
        rule: str,
        bad_value: bytes | None = None,
        *,
        envelope: dict[str, Any] | None = None,
        data_text: str | None = None,
        key: bytes | None = None,
        headers: list[tuple[str, str | bytes | None]] | None = None,
        prefix: list[Event] | None = None,
    ) -> None:
        sid = f"v-{kind}"
        events = prefix if prefix is not None else prefix_of(sid)
        plan.victims[sid] = events
        if bad_value is None and envelope is not None:
            bad_value = encode(sid, envelope, data_text)
        plan.bad.append(
            Bad(
                kind,
                events_topic,
                key if key is not None else sid.encode(),
                bad_value,
                rule,
                headers,
            )
        )
        plan.follow_ups.append(
            Bad(
                f"{kind}/follow-up",
                events_topic,
                sid.encode(),
                encode(sid, follow_up(len(events))),
                "QUARANTINED",
            )
        )

    nxt = 3  # the seq after a victim prefix

    def env(etype: str, data: Any, seq: int = nxt, **extra: Any) -> dict[str, Any]:
        return {"type": etype, "seq": seq, "time": 5, "data": data, **extra}

    valid = encode("x", env("turn/end", {"turn": 1}))
    # -- undecodable (CODEC)
    victim("garbage", "CODEC", b"\x00garbage")
    victim("empty-value", "CODEC", b"")
    victim("tombstone", "CODEC", None, key=b"v-tombstone")
    plan.bad[-1].value = None
    victim("old-control-record", "CODEC", None, headers=[(CONTROL_HEADER, b"redrive")])
    plan.bad[-1].value = None
    victim("unknown-fingerprint", "CODEC", valid[:2] + b"\x01" * 8 + valid[10:])
    victim("truncated-avro", "CODEC", valid[: len(valid) // 2])
    victim("trailing-bytes", "CODEC", valid + b"xx")
    victim("confluent-framing", "CODEC", b"\x00\x00\x00\x03\xe7" + valid[10:])
    victim("view-record", "CODEC", codec.encode_view(View.of("v-view-record", "x", 0, 0, {})))
    victim("oversized-undecodable", "CODEC", b"\x01" * 1_040_000)
    victim("data-not-json", "CODEC", envelope=env("turn/end", {}), data_text="{not json")
    victim("data-nan", "CODEC", envelope=env("turn/end", {}), data_text="NaN")
    victim("data-truncated-json", "CODEC", envelope=env("turn/end", {}), data_text='{"turn": [1, 2')
    # -- bounds before interpretation (E-3)
    victim(
        "nesting-1000", "E-3", envelope=env("custom/x", {}, ignorable=True), data_text=deep(1000)
    )
    victim("nesting-200", "E-3", envelope=env("custom/x", {}, ignorable=True), data_text=deep(200))
    victim(
        "nesting-in-object",
        "E-3",
        envelope=env("turn/end", {}),
        data_text='{"a":' * 300 + "1" + "}" * 300,
    )
    # -- envelope fields
    victim("negative-seq", "E-2", envelope=env("turn/end", {"turn": 1}, seq=-1))
    victim("empty-type", "E-4", envelope=env("", {"turn": 1}))  # the runtime: an unknown type
    victim("unknown-required-type", "E-4", envelope=env("custom/required", {"x": 1}))
    # -- seq gate
    victim("gap", "S-1", envelope=env("turn/end", {"turn": 1}, seq=7))
    victim("seq-beyond-2^62", "*", envelope=env("turn/end", {"turn": 1}, seq=2**62))
    conflict_prefix = prefix_of("v-conflict")
    changed = conflict_prefix[2].to_json()
    changed["data"] = {**changed["data"], "id": "changed"}
    victim("conflict", "SEQ-GATE", envelope=changed, prefix=conflict_prefix)
    victim(
        "seq-restart-at-0",
        "SEQ-GATE",
        envelope=env(
            "system/message", prefix_of("x")[0].to_json()["data"], seq=0, surfaceOp="append"
        ),
    )
    # -- keys: the record names no session (KEY, nothing quarantined) or the wrong one
    victim("key-mismatch", "KEY", encode("someone-else", env("turn/end", {"turn": 1})))
    first_good = next(iter(good))
    ahead = encode(first_good, env("turn/end", {"turn": 1}, seq=10_000))
    plan.bad += [
        Bad("null-key", events_topic, None, ahead, "KEY"),
        Bad("non-utf8-key", events_topic, b"\xff\xfe\xfd", ahead, "KEY"),
        Bad("oversized-key", events_topic, b"k" * 5000, ahead, "KEY"),
    ]
    # -- every invalid-event case of the corpus (the rule is the file name's prefix)
    for path in sorted(CORPUS.glob("*.jsonl")):
        if path.name.startswith("P"):
            continue  # checkpoint cases: not a property of the events
        lines = [orjson.loads(line) for line in path.read_bytes().splitlines() if line]
        lines = [raw for raw in lines if raw.get("type") != "session"]
        name = path.stem
        rule = f"{name[0]}-{name[1]}"
        sid = f"v-{name}"
        try:
            bad_value = codec.encode_event(sid, lines[-1])
        except Exception:  # not representable in Avro (E-1 unknown key, E-2 time type)
            continue
        if _valid_without_a_header(lines):
            continue  # a rule of the file's format version; a record has no header
        victim(name, rule, bad_value, prefix=[parse_event(raw) for raw in lines[:-1]])
    # -- forged control: headers on events are never commands
    victim("forged-redrive-header-after-gap", "S-1", envelope=env("turn/end", {"turn": 1}, seq=9))
    plan.follow_ups[-1].headers = [(CONTROL_HEADER, b"redrive")]
    # -- control topic: malformed, unknown and misaddressed commands (CONTROL)
    gap_victim = "v-gap"

    def command(kind: str, key: bytes | None, value: bytes | None) -> None:
        plan.bad.append(Bad(kind, control_topic, key, value, "CONTROL"))

    command(
        "control-unknown-command",
        gap_victim.encode(),
        orjson.dumps({"v": 1, "command": "nuke", "sessionId": gap_victim, "seq": 2}),
    )
    command("control-not-json", gap_victim.encode(), b"redrive please")
    command("control-null-value", gap_victim.encode(), None)
    command(
        "control-wrong-version",
        gap_victim.encode(),
        orjson.dumps({"v": 9, "command": "redrive", "sessionId": gap_victim, "seq": 2}),
    )
    command(
        "control-extra-field",
        gap_victim.encode(),
        orjson.dumps(
            {"v": 1, "command": "redrive", "sessionId": gap_victim, "seq": 2, "all": True}
        ),
    )
    command(
        "control-negative-seq",
        gap_victim.encode(),
        orjson.dumps({"v": 1, "command": "redrive", "sessionId": gap_victim, "seq": -1}),
    )
    command(
        "control-seq-not-safe",
        gap_victim.encode(),
        orjson.dumps({"v": 1, "command": "redrive", "sessionId": gap_victim, "seq": 2**60}),
    )
    command("control-key-mismatch", b"v-garbage", redrive(gap_victim, 2).encode())
    command("control-wrong-partition", gap_victim.encode(), redrive(gap_victim, 2).encode())
    plan.bad[-1].partition = (partition_of(gap_victim.encode(), 3) + 1) % 3
    command("control-oversized", gap_victim.encode(), b" " * 10_000)
    command("control-array", gap_victim.encode(), b"[]")
    return plan


def produce_all(stack: Stack, plan: Plan, good: dict[str, list[Event]]) -> None:
    cfg = stack.config
    producer: Producer = clients.event_producer(
        cfg.with_overrides(kafka={**cfg.kafka, "message.max.bytes": "2000000"})
    )
    pending: dict[int, Bad] = {}

    def deliver(record: Bad) -> None:
        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            assert err is None, f"{record.kind}: {err}"
            record.where = (msg.partition() or 0, msg.offset() or 0)

        extra: dict[str, Any] = {} if record.partition is None else {"partition": record.partition}
        producer.produce(
            record.topic,
            key=record.key,
            value=record.value,
            headers=record.headers,
            on_delivery=on_delivery,
            **extra,
        )
        pending[id(record)] = record
        producer.poll(0)

    half = {sid: len(ev) // 2 for sid, ev in good.items()}
    for sid, events in good.items():  # the first half of every valid session
        stack.produce(sid, events[: half[sid]], producer)
    for sid, events in plan.victims.items():
        stack.produce(sid, events, producer)
    assert producer.flush(60) == 0
    for record in plan.bad:
        if record.topic == cfg.topics.events:
            deliver(record)
    for record in plan.follow_ups:
        deliver(record)
    # valid events carrying forged control headers, and an exact duplicate
    for i, (sid, events) in enumerate(good.items()):
        forged: list[tuple[str, str | bytes | None]] = [
            (CONTROL_HEADER, b"redrive" if i % 2 else b"nuke"),
            *((f"h{j}", b"x" * 1000) for j in range(50)),
        ]
        for ev in events[half[sid] :]:
            producer.produce(
                cfg.topics.events,
                key=sid.encode(),
                value=codec.encode_parsed_event(sid, ev),
                headers=forged,
            )
        stack.logs[sid].extend(events[half[sid] :])
    dup_sid = next(iter(good))
    plan.bad.append(
        Bad(
            "exact-duplicate",
            cfg.topics.events,
            dup_sid.encode(),
            codec.encode_parsed_event(dup_sid, good[dup_sid][1]),
            None,
        )
    )
    deliver(plan.bad[-1])
    assert producer.flush(60) == 0
    # commands last: the sessions they name must exist in their partition by then
    for record in plan.bad:
        if record.topic == cfg.topics.control:
            deliver(record)
    assert producer.flush(60) == 0
    assert all(r.where is not None for r in pending.values())


def committed_to_end(stack: Stack) -> bool:
    cfg = stack.config
    consumer = clients.plain_consumer(cfg, "hostile-check")
    try:
        for topic in (cfg.topics.events, cfg.topics.control):
            tps = [TopicPartition(topic, p) for p in range(cfg.partitions)]
            group = clients.group_consumer(cfg, "hostile-offsets")
            try:
                committed = {tp.partition: tp.offset for tp in group.committed(tps, timeout=30)}
            finally:
                group.close()
            for p in range(cfg.partitions):
                high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                if high > 0 and committed[p] < high:
                    return False
        return True
    finally:
        consumer.close()


def dead_letters(stack: Stack) -> list[Any]:
    consumer = clients.plain_consumer(stack.config, "hostile-dlq")
    try:
        parts = read_partitions(
            consumer,
            stack.config.topics.dlq,
            {p: OFFSET_BEGINNING for p in range(stack.config.partitions)},
        )
    finally:
        consumer.close()
    return [codec.decode_dead_letter(m.value() or b"") for p in sorted(parts) for m in parts[p]]


def test_hostile_producer_two_processors_nothing_stops_nothing_lies(stack: Stack) -> None:
    cfg = stack.config
    good = sessions(4, 60, seed=91)
    good["deep-but-valid"] = deep_but_valid()
    plan = build_plan(cfg.topics.events, cfg.topics.control, good)
    kinds = {b.kind for b in plan.bad}
    assert len(kinds) >= 40, sorted(kinds)
    assert cfg.partitions == 3  # control-wrong-partition is computed for 3

    procs = [Processor(cfg.with_overrides(instance_id=f"h{i}")) for i in range(2)]
    members = [RunningProcessor(p) for p in procs]
    try:
        produce_all(stack, plan, good)
        deadline = time.monotonic() + 180
        while not committed_to_end(stack):
            errors = [e for m in members for e in m.errors]
            assert not errors, f"a processor died: {errors[0]!r}"
            assert time.monotonic() < deadline, "a partition stalled"
            time.sleep(1.0)
        assert all(m.thread.is_alive() for m in members), "a processor stopped"
    finally:
        for m in members:
            m.proc.stop()
        for m in members:
            m.thread.join(60)
    errors = [e for m in members for e in m.errors]
    assert not errors, f"a processor died: {errors[0]!r}"

    # every bad record accounted for, at its own (topic, partition, offset)
    letters = {(d.topic, d.partition, d.offset): d for d in dead_letters(stack)}
    unaccounted = []
    for record in [*plan.bad, *plan.follow_ups]:
        assert record.where is not None
        letter = letters.get((record.topic, *record.where))
        if record.rule is None:
            assert letter is None, f"{record.kind}: dead-lettered {letter}"
            continue
        if letter is None or record.rule not in ("*", letter.rule):
            unaccounted.append(
                (record.kind, record.rule, letter and letter.rule, letter and letter.reason)
            )
    assert not unaccounted, unaccounted
    duplicates = sum(p.metrics.events.labels("duplicate")._value.get() for p in procs)
    assert duplicates >= 1
    assert sum(p.metrics.control.labels("rejected")._value.get() for p in procs) == sum(
        1 for b in plan.bad if b.topic == cfg.topics.control
    )

    # the oversized record is referenced, not copied, and its letter fit
    big = next(b for b in plan.bad if b.kind == "oversized-undecodable")
    assert big.where is not None
    letter = letters[(cfg.topics.events, *big.where)]
    assert letter.value is None and "1040000 bytes, sha256 " in letter.reason
    assert all(d.value is None or len(d.value) <= MAX_COPIED_VALUE for d in letters.values())

    # only the victims are quarantined; valid sessions equal the offline fold
    views = materialize_views(cfg)
    for sid in good:
        assert views[sid]["status"].value["state"] == "ok", views[sid]["status"].value
        assert as_json(session_fold_equivalent(views[sid])) == stack.expected(sid), sid
    for sid, prefix in plan.victims.items():
        status = views[sid]["status"].value
        assert status["state"] == "quarantined", (sid, status)
        assert status["lastSeq"] == prefix[-1].seq, (sid, status)
        fold = as_json(offline_equivalent(session_output(fold_events(prefix))))
        fold["status"] = "quarantined"
        assert as_json(session_fold_equivalent(views[sid])) == fold, sid
    quarantined = {sid for sid, v in views.items() if v["status"].value["state"] != "ok"}
    assert quarantined == set(plan.victims)


def test_a_repeating_transaction_failure_is_reported_on_readyz_then_recovers(stack: Stack) -> None:
    """A careless operator shrinks the DLQ's max.message.bytes: dead letters cannot be
    written, every transaction aborts.  The processor backs off, /readyz turns 503
    naming the cause, ``processor_degraded`` is 1; once the topic is fixed it commits
    again and /readyz is 200."""
    cfg = stack.config
    admin = clients.admin(cfg)

    def set_max_bytes(value: str) -> None:
        entry = ConfigEntry("max.message.bytes", value, incremental_operation=AlterConfigOpType.SET)
        dlq = ConfigResource(ConfigResource.Type.TOPIC, cfg.topics.dlq, incremental_configs=[entry])
        for future in admin.incremental_alter_configs([dlq]).values():
            future.result()

    set_max_bytes("200")
    good = sessions(1, 20, seed=5)
    for sid, events in good.items():
        stack.produce(sid, events)
    stack.produce_raw("victim", b"\x00" + b"x" * 400)  # its dead letter > 200 bytes
    metrics = Metrics()
    server = serve(metrics, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.server_port}/readyz"
    proc = Processor(cfg, metrics=metrics)
    thread = threading.Thread(target=proc.run, daemon=True)
    thread.start()
    try:
        body = wait_readyz(url, 503, "transactions failed in a row")
        assert "MESSAGE_TOO_LARGE" in body or "MSG_SIZE_TOO_LARGE" in body, body
        assert cfg.topics.dlq in body, body
        assert b"processor_degraded 1.0" in metrics.exposition()
        assert metrics.txn_failures.labels("abortable")._value.get() >= 5
        set_max_bytes("1048588")
        wait_readyz(url, 200, "ready")
        assert b"processor_degraded 0.0" in metrics.exposition()
        letters = [d for d in dead_letters(stack) if d.session_id == "victim"]
        assert [d.rule for d in letters] == ["CODEC"]
        views = materialize_views(cfg)
        for sid in good:
            assert as_json(session_fold_equivalent(views[sid])) == stack.expected(sid)
        assert thread.is_alive()
    finally:
        proc.stop()
        thread.join(60)
        server.shutdown()


def wait_readyz(url: str, code: int, needle: str, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url) as resp:
                status, last = resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            status, last = exc.code, exc.read().decode()
        if status == code and needle in last:
            return last
        time.sleep(0.3)
    raise AssertionError(f"/readyz never answered {code} with {needle!r}; last: {last!r}")


def test_CONTROL_a_redrive_read_before_its_quarantine_lifts_it_when_it_happens(
    stack: Stack,
) -> None:
    """Commands name a seq, so their order against the events does not matter: a
    redrive at seq 1 read while the session is still healthy waits in its checkpoint
    (across a restart) and lifts the quarantine the gap at seq 3 causes."""
    b = LogBuilder()
    b.system("p")
    b.user("u")  # seq 0, 1
    fixed = LogBuilder(start_seq=2)
    third = fixed.user("third")
    fourth = fixed.user("fourth")
    stack.produce("early", b.events)
    stack.run_processor(max_idle_s=2)
    stack.produce_control("early", redrive("early", 1).encode())
    first = stack.run_processor(max_idle_s=2)
    assert first.metrics.control.labels("applied")._value.get() == 1
    stack.produce("early", [fourth])  # gap: quarantined at 1, lifted by the redrive
    stack.produce("early", [third, fourth])
    stack.logs["early"] = [*b.events, third, fourth]
    stack.run_processor(max_idle_s=3)
    views = materialize_views(stack.config)
    assert as_json(session_fold_equivalent(views["early"])) == stack.expected("early")
    assert [(d.rule, d.seq) for d in dead_letters(stack)] == [("S-1", 3)]


def test_CONTROL_headers_on_event_records_are_never_commands(stack: Stack) -> None:
    """A forged ``processor-control: redrive`` header neither lifts a quarantine
    nor makes its event vanish; an unknown command header changes nothing."""
    b = LogBuilder()
    b.system("p")
    b.user("u")
    later = LogBuilder(start_seq=2)
    third = later.user("third")
    stack.produce("q", b.events)
    stack.produce("q", [LogBuilder(start_seq=5).user("gap")])  # quarantined at 1
    producer = stack.producer()
    for name in (b"redrive", b"nuke"):
        producer.produce(
            stack.config.topics.events,
            key=b"q",
            value=codec.encode_parsed_event("q", third),
            headers=[(CONTROL_HEADER, name)],
        )
    assert producer.flush(30) == 0
    # Run until everything is committed, not until 2 s without records: on a
    # loaded box (load 20) the first fetch after the assignment came later than
    # that and the run ended having folded nothing (KeyError 'q', stop 28's CI)
    running = RunningProcessor(Processor(stack.config))
    try:
        wait_until(lambda: committed_to_end(stack))
    finally:
        running.stop()
    assert not running.errors, running.errors
    views = materialize_views(stack.config)
    assert views["q"]["status"].value["state"] == "quarantined"
    assert [d.rule for d in dead_letters(stack)] == ["S-1", "QUARANTINED", "QUARANTINED"]


def test_a_fenced_member_ends_with_one_fatal_line_and_the_other_takes_over(stack: Stack) -> None:
    """A careless operator starts two members with the same instance id: the newer
    one fences the older (its transactional id), whose next transaction fails with a
    fatal error — it ends with one line instead of aborting in a loop, and the newer
    member folds everything."""
    logs = sessions(3, 40, seed=7)
    for sid, events in logs.items():
        stack.produce(sid, events[:20])
    running = RunningProcessor(Processor(stack.config.with_overrides(instance_id="same")))
    old, thread, errors = running.proc, running.thread, running.errors
    wait_until(lambda: old.metrics.commits._value.get() >= 1)
    new, new_thread = stack.start_thread(instance_id="same")
    try:
        for sid, events in logs.items():
            stack.produce(sid, events[20:])
        thread.join(90)
        assert not thread.is_alive(), "the fenced member kept running"
        assert len(errors) == 1 and isinstance(errors[0], KafkaFatal), errors
        assert "fatal Kafka error" in str(errors[0]) and "\n" not in str(errors[0])
        assert old.metrics.txn_failures.labels("fatal")._value.get() == 1
        deadline = time.monotonic() + 90
        while True:
            views = materialize_views(stack.config)
            got = {
                sid: as_json(session_fold_equivalent(views[sid])) for sid in logs if sid in views
            }
            if got == {sid: stack.expected(sid) for sid in logs}:
                break
            assert time.monotonic() < deadline, "the new member did not take over"
            time.sleep(0.5)
    finally:
        new.stop()
        new_thread.join(60)


def wait_until(check: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.2)


def test_a_missing_control_topic_ends_run_with_one_line(stack: Stack) -> None:
    """A deployment made before the control topic existed is told what to run."""
    admin = clients.admin(stack.config)
    for future in admin.delete_topics([stack.config.topics.control]).values():
        future.result()
    wait_until(lambda: stack.config.topics.control not in admin.list_topics(timeout=10).topics)
    with pytest.raises(
        KafkaFatal,
        match=r"control' does not exist \(run `processor topics "
        r"create`\)",
    ):
        Processor(stack.config).run(max_idle_s=2)
