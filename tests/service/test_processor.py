"""The processor against a real Kafka broker: exactly-once views, restore, bad input.

Every comparison is against the offline fold of the same logs
(``processor.offline``), read back with ``read_committed``.
"""

from __future__ import annotations

import signal
import threading
import time
import urllib.request
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException

from processor.client.views_reader import (
    materialize_views,
    offline_equivalent,
    session_fold_equivalent,
)
from processor.codec import default_codec
from processor.core.builder import LogBuilder
from processor.kafka import clients
from processor.kafka.client_errors import ClientProblems
from processor.kafka.reads import read_partitions
from processor.kafka.topic_admin import create_topics, delete_topics
from processor.kafka.transport import KafkaTransport, TxnProducer
from processor.service.loop.control import redrive
from processor.service.loop.runner import Processor
from processor.service.ops.http import serve
from processor.telemetry.metrics import Metrics
from tests.service.conftest import Stack, as_json, sessions, wait_until

pytestmark = pytest.mark.kafka


def wait_for_views(
    stack: Stack, expected: dict[str, dict[str, Any]], timeout: float = 60
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    got: dict[str, Any] = {}
    while time.monotonic() < deadline:
        views = materialize_views(stack.config)
        got = {
            sid: as_json(session_fold_equivalent(views[sid])) for sid in expected if sid in views
        }
        if got == expected:
            return got
        time.sleep(0.5)
    missing = sorted(set(expected) - set(got))
    wrong = sorted(s for s in got if got[s] != expected[s])
    detail = ""
    if wrong:
        g, e = got[wrong[0]], expected[wrong[0]]
        keys = [k for k in e if g.get(k) != e[k]]
        detail = (
            f"; {wrong[0]} differs in {keys}: got {str(g.get(keys[0]))[:300]} expected "
            f"{str(e[keys[0]])[:300]}"
            if keys
            else ""
        )
    raise AssertionError(
        f"views did not converge: missing {missing[:5]}, differ {wrong[:5]}{detail}"
    )


def topic_records(stack: Stack, topic: str) -> list[Any]:
    """Every committed record of a topic, partition by partition."""
    consumer = clients.plain_consumer(stack.config, "test-reader")
    try:
        parts = read_partitions(
            consumer, topic, {p: OFFSET_BEGINNING for p in range(stack.config.partitions)}
        )
    finally:
        consumer.close()
    return [m for p in sorted(parts) for m in parts[p]]


def dead_letters(stack: Stack) -> list[Any]:
    codec = default_codec()
    return [
        codec.decode_dead_letter(m.value()) for m in topic_records(stack, stack.config.topics.dlq)
    ]


def test_single_processor_views_equal_offline_fold(stack: Stack) -> None:
    logs = sessions(8, 150, seed=11)
    for sid, events in logs.items():
        stack.produce(sid, events)
    stack.run_processor(max_idle_s=3)
    wait_for_views(stack, {sid: stack.expected(sid) for sid in logs}, timeout=20)


def test_a_batch_run_with_a_tiny_idle_window_folds_what_waits(stack: Stack) -> None:
    """Idle counts once every partition is fetched to its end (idle.py): a first
    fetch slower than the window used to end the run having folded nothing (at
    0.05 s it folded none of these records, 2 runs of 2)."""
    logs = sessions(6, 40, seed=7)
    for sid, events in logs.items():
        stack.produce(sid, events)
    proc = stack.run_processor(max_idle_s=0.05)
    assert proc.metrics.records_consumed._value.get() == sum(len(e) for e in logs.values())
    wait_for_views(stack, {sid: stack.expected(sid) for sid in logs}, timeout=20)


def test_two_processors_with_a_rebalance_in_the_middle(stack: Stack) -> None:
    logs = sessions(12, 200, seed=12)
    first = {sid: ev[:100] for sid, ev in logs.items()}
    for sid, events in first.items():
        stack.produce(sid, events)
    a, ta = stack.start_thread(instance_id="a")
    wait_until(lambda: a.metrics.commits._value.get() >= 1, "a's first commit")
    b, tb = stack.start_thread(instance_id="b")  # joins: cooperative rebalance
    for sid, events in logs.items():
        stack.produce(sid, events[100:])
    try:
        wait_for_views(stack, {sid: stack.expected(sid) for sid in logs})
        assert a.metrics.rebalances.labels("assign")._value.get() >= 1
        assert b.metrics.rebalances.labels("assign")._value.get() >= 1
    finally:
        a.stop()
        b.stop()
        ta.join(30)
        tb.join(30)


def _view_history(stack: Stack) -> dict[tuple[str, str], list[int]]:
    """asOfSeq per (session, view) in committed order, from the views topic."""
    codec = default_codec()
    history: dict[tuple[str, str], list[int]] = {}
    for m in topic_records(stack, stack.config.topics.views):
        if m.value() is not None:
            v = codec.decode_view(m.value())
            if v.part == 0:
                history.setdefault((v.session_id, v.view), []).append(v.as_of_seq)
    return history


def test_sigkill_mid_batch_then_restart_loses_and_duplicates_nothing(stack: Stack) -> None:
    logs = sessions(10, 400, seed=13)
    proc = stack.spawn("k1", "--commit-interval-ms", "50", "--max-batch-events", "200")
    try:
        producer = stack.producer()
        for i in range(0, 400, 50):
            for sid, events in logs.items():
                stack.produce(sid, events[i : i + 50], producer)
            producer.flush(30)
            if i == 200:
                time.sleep(1.0)
                proc.send_signal(signal.SIGKILL)  # in the middle of its batches
                proc.wait(10)
                proc = stack.spawn("k1", "--commit-interval-ms", "50")
        wait_for_views(stack, {sid: stack.expected(sid) for sid in logs}, timeout=90)
    finally:
        proc.kill()
        proc.wait(10)
    for (sid, view), seqs in _view_history(stack).items():
        assert seqs == sorted(seqs), f"asOfSeq went back for {sid}/{view}: {seqs}"


class _HeldCommit:
    """The real output producer; its first ``commit_transaction`` waits for the
    test and then fails abortably without committing (the transaction stays
    open on the broker until the processor's ``abort_transaction``)."""

    def __init__(self, inner: TxnProducer, entered: threading.Event, release: threading.Event):
        self._inner, self._entered, self._release = inner, entered, release

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def commit_transaction(self, timeout: float = -1) -> None:
        if self._entered.is_set():
            self._inner.commit_transaction(timeout)
            return
        self._entered.set()
        self._release.wait(60)
        raise KafkaException(
            KafkaError(KafkaError._TIMED_OUT, "commit lost (test)", txn_requires_abort=True)
        )


def test_a_commit_failing_while_the_next_batch_is_folded_loses_and_duplicates_nothing(
    stack: Stack,
) -> None:
    """commit_transaction runs while the loop folds the next batch: its failure
    aborts and rewinds both batches (the open one was folded on top of it)."""
    entered, release = threading.Event(), threading.Event()

    class Held(KafkaTransport):
        def output_producer(self, instance_id: str, problems: ClientProblems) -> TxnProducer:
            producer = super().output_producer(instance_id, problems)
            return _HeldCommit(producer, entered, release)

    logs = sessions(6, 120, seed=19)
    for sid, events in logs.items():
        stack.produce(sid, events[:40])
    # the held transaction must not reach the broker's timeout (that fences)
    config = stack.config.with_overrides(transaction_timeout_ms=180_000)
    proc = Processor(config, transport=Held(config))
    thread = threading.Thread(target=proc.run, daemon=True)
    thread.start()
    try:
        wait_until(entered.is_set, "the first commit is in flight")
        for sid, events in logs.items():
            stack.produce(sid, events[40:])
        wait_until(
            lambda: proc.metrics.records_consumed._value.get() > 6 * 40,
            "the next batch is folded while the commit is held",
        )
        assert proc.metrics.commits._value.get() == 0
        release.set()
        wait_for_views(stack, {sid: stack.expected(sid) for sid in logs})
        assert proc.metrics.aborts._value.get() == 1
        assert proc.metrics.records_consumed._value.get() > 6 * 120  # refolded
    finally:
        release.set()
        proc.stop()
        thread.join(60)
    assert not thread.is_alive()
    for (sid, view), seqs in _view_history(stack).items():
        assert seqs == sorted(set(seqs)), f"{sid}/{view} published twice or backwards: {seqs}"


def test_restart_rereads_only_the_tail_after_the_last_commit(stack: Stack) -> None:
    logs = sessions(6, 1200, seed=14)
    for sid, events in logs.items():
        stack.produce(sid, events[:1000])
    stack.run_processor(max_idle_s=3)
    tail = 0
    for sid, events in logs.items():
        stack.produce(sid, events[1000:])
        tail += len(events) - 1000
    proc = stack.run_processor(max_idle_s=3)
    consumed = proc.metrics.records_consumed._value.get()
    assert consumed == tail, f"re-read {consumed} records, tail was {tail}"
    assert proc.metrics.restored_checkpoints._value.get() == len(logs)
    wait_for_views(stack, {sid: stack.expected(sid) for sid in logs}, timeout=20)


def test_anchor_check_detects_a_recreated_events_topic(stack: Stack) -> None:
    logs = sessions(3, 60, seed=15)
    for sid, events in logs.items():
        stack.produce(sid, events)
    stack.run_processor(max_idle_s=3)
    admin = clients.admin(stack.config)
    delete_topics(admin, [stack.config.topics.events])
    wait_until(
        lambda: stack.config.topics.events not in admin.list_topics(timeout=10).topics,
        "the events topic to be gone",
    )
    create_topics(admin, stack.config)
    other = sessions(3, 30, seed=16)  # a different log under the same names
    stack.logs.clear()
    for sid, events in other.items():
        stack.produce(sid, events)
    with pytest.raises(Exception, match="anchor check failed|topic was truncated or recreated"):
        stack.run_processor(max_idle_s=3, anchor_policy="fail")
    stack.run_processor(max_idle_s=4, anchor_policy="rebuild")
    wait_for_views(stack, {sid: stack.expected(sid) for sid in other}, timeout=30)


def test_bad_input_goes_to_the_dlq_and_quarantines_only_its_session(stack: Stack) -> None:
    good = sessions(4, 80, seed=17)
    for sid, events in good.items():
        stack.produce(sid, events)
    codec = default_codec()
    # one session per kind of bad input, all in the same partitions as the good ones
    b = LogBuilder()
    b.system("p")
    b.user("u")
    stack.produce("bad-bytes", b.events)
    stack.produce_raw("bad-bytes", b"\x00garbage")
    stack.produce("bad-invalid", b.events)
    stack.produce_raw(
        "bad-invalid",
        codec.encode_event(
            "bad-invalid",
            {
                "type": "user/message",
                "seq": 2,
                "time": 1,
                "data": {"id": "x", "role": "user", "content": [], "source": {"kind": "user"}},
            },
        ),
    )
    # (no surfaceOp: S-2)
    stack.produce("bad-gap", b.events)
    stack.produce_raw(
        "bad-gap",
        codec.encode_event(
            "bad-gap", {"type": "turn/start", "seq": 5, "time": 1, "data": {"turn": 1}}
        ),
    )
    stack.produce("bad-conflict", b.events)
    stack.produce_raw(
        "bad-conflict",
        codec.encode_event(
            "bad-conflict", {"type": "turn/start", "seq": 1, "time": 1, "data": {"turn": 1}}
        ),
    )
    stack.produce("bad-unknown", b.events)
    stack.produce_raw(
        "bad-unknown",
        codec.encode_event(
            "bad-unknown", {"type": "vendor/required", "seq": 2, "time": 1, "data": {}}
        ),
    )
    stack.produce("dup", b.events)
    stack.produce("dup", b.events[1:])  # exact duplicate: dropped and counted
    stack.logs["dup"] = b.events
    proc = stack.run_processor(max_idle_s=3)
    expected = {sid: stack.expected(sid) for sid in good}
    expected["dup"] = stack.expected("dup")
    wait_for_views(stack, expected, timeout=20)
    letters = {d.session_id: d for d in dead_letters(stack)}
    assert letters["bad-bytes"].rule == "CODEC" and letters["bad-bytes"].value == b"\x00garbage"
    assert letters["bad-invalid"].rule == "S-2" and letters["bad-invalid"].seq == 2
    assert letters["bad-gap"].rule == "S-1" and "gap, expected 2" in letters["bad-gap"].reason
    assert letters["bad-conflict"].rule == "SEQ-GATE"
    assert letters["bad-unknown"].rule == "E-4"
    assert "dup" not in letters
    for d in letters.values():
        assert d.topic == stack.config.topics.events and d.offset >= 0
    assert proc.metrics.events.labels("duplicate")._value.get() == 1
    views = materialize_views(stack.config)
    for sid in ("bad-bytes", "bad-invalid", "bad-gap", "bad-conflict", "bad-unknown"):
        status = views[sid]["status"].value
        assert status["state"] == "quarantined" and status["lastSeq"] == 1, status
        assert views[sid]["surface"].value["nodes"] == [0, 1]


def test_quarantined_session_is_redriven_by_control_command(stack: Stack) -> None:
    b = LogBuilder()
    b.system("p")
    b.user("u")
    late = LogBuilder(start_seq=0)
    late.system("p")
    late.user("u")
    third = late.user("third")
    fourth = late.user("fourth")
    stack.produce("q", b.events)
    stack.produce("q", [fourth])  # gap: seq 3 before 2 -> quarantined
    stack.run_processor(max_idle_s=2)
    stack.produce_control("q", redrive("q", 1).encode())
    stack.produce("q", [third, fourth])
    stack.logs["q"] = late.events
    stack.run_processor(max_idle_s=3)
    wait_for_views(stack, {"q": stack.expected("q")}, timeout=20)


def test_metrics_endpoint_exposes_the_design_guide_metrics(stack: Stack) -> None:
    logs = sessions(3, 50, seed=18)
    for sid, events in logs.items():
        stack.produce(sid, events)
    metrics = Metrics()
    server = serve(metrics, "127.0.0.1", 0)
    proc = Processor(stack.config, metrics=metrics)
    import threading

    thread = threading.Thread(target=proc.run, kwargs={"max_idle_s": 6}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        deadline = time.monotonic() + 30
        body = ""
        while time.monotonic() < deadline:
            body = urllib.request.urlopen(f"{url}/metrics").read().decode()
            if 'processor_events_total{outcome="applied"} 150.0' in body:
                break
            time.sleep(0.3)
        for name in (
            "processor_events_total",
            "processor_fold_seconds_bucket",
            "processor_commit_seconds_bucket",
            "processor_batch_events_bucket",
            "processor_transaction_aborts_total",
            "processor_partition_lag",
            "processor_sessions_in_memory",
            "processor_restore_seconds_bucket",
            "processor_rebalances_total",
        ):
            assert name in body, name
        assert 'processor_events_total{outcome="applied"} 150.0' in body
        assert urllib.request.urlopen(f"{url}/healthz").status == 200
        assert urllib.request.urlopen(f"{url}/readyz").status == 200
    finally:
        proc.stop()
        thread.join(30)
        server.shutdown()


def _bumped_registry() -> Any:
    """The built-ins plus `userTurns` at stateVersion 2 with new semantics."""
    from processor.core.builtin import default_registry

    registry = default_registry()
    registry.register(_user_turns(2))
    return registry


def _user_turns(version: int) -> Any:
    from processor.core.projections import ProjectionDefinition, WireView

    def apply(state: Any, event: Any) -> Any:
        counted = ("user/message",) if version == 1 else ("user/message", "assistant/message")
        return {"count": state["count"] + 1} if event.type in counted else state

    def check(value: Any) -> None:
        if not isinstance(value, dict) or not isinstance(value.get("count"), int):
            raise ValueError("count must be an int")

    return ProjectionDefinition(
        key="userTurns",
        state_version=version,
        init=lambda header, inherited: {"count": 0},
        apply=apply,
        validate_state=check,
        wire=WireView(view=lambda s: s, validate_view=check),
    )


def _registry_v1() -> Any:
    from processor.core.builtin import default_registry

    registry = default_registry()
    registry.register(_user_turns(1))
    return registry


def test_replay_after_a_state_version_bump_rebuilds_the_offline_views(stack: Stack) -> None:
    from processor.client.replayer import replay
    from processor.core.defaults import default_message_projections
    from processor.core.session import Session
    from processor.offline import session_output

    logs = sessions(5, 120, seed=19)
    for sid, events in logs.items():
        stack.produce(sid, events)
    Processor(stack.config, registry_factory=_registry_v1).run(max_idle_s=3)
    views = materialize_views(stack.config)
    assert all(views[sid]["userTurns"].state_version == 1 for sid in logs)
    with pytest.raises(Exception, match="userTurns.*stateVersion 1.*processor replay"):
        Processor(stack.config, registry_factory=_bumped_registry).run(max_idle_s=3)
    result = replay(stack.config, registry_factory=_bumped_registry)
    assert result.events == sum(len(e) for e in logs.values())
    expected = {
        sid: as_json(
            offline_equivalent(
                session_output(
                    Session.fold(
                        events,
                        None,
                        message_projections=default_message_projections(),
                        projections=_bumped_registry(),
                    )
                )
            )
        )
        for sid, events in logs.items()
    }
    wait_for_views(stack, expected, timeout=20)
    views = materialize_views(stack.config)
    assert all(views[sid]["userTurns"].state_version == 2 for sid in logs)


def test_replay_into_fresh_topics_leaves_the_old_ones(stack: Stack) -> None:
    from processor.client.replayer import replay

    logs = sessions(3, 80, seed=20)
    for sid, events in logs.items():
        stack.produce(sid, events)
    stack.run_processor(max_idle_s=3)
    result = replay(stack.config, into_prefix=stack.config.topic_prefix + "-green")
    green = result.config
    assert green.topics.events == stack.config.topics.events
    views = materialize_views(green)
    assert {sid: as_json(session_fold_equivalent(views[sid])) for sid in logs} == {
        sid: stack.expected(sid) for sid in logs
    }


def test_compaction_keeps_only_the_last_view_and_checkpoint(stack: Stack) -> None:
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
    )

    logs = sessions(2, 200, seed=21)
    for step in range(4):  # several committed versions of every view and checkpoint
        for sid, events in logs.items():
            stack.produce(sid, events[step * 50 : (step + 1) * 50])
        stack.run_processor(max_idle_s=1.5)

    def versions(topic: str) -> dict[bytes, int]:
        counts: dict[bytes, int] = {}
        for m in topic_records(stack, topic):
            counts[m.key()] = counts.get(m.key(), 0) + 1
        return counts

    key = b"s000"
    assert versions(stack.config.topics.checkpoints)[key] >= 3  # one per committed batch
    # now let the cleaner loose: small segments, eager cleaning
    admin = clients.admin(stack.config)
    fast = {
        "segment.ms": "1000",
        "min.cleanable.dirty.ratio": "0.01",
        "delete.retention.ms": "1000",
        "min.compaction.lag.ms": "0",
    }
    resources = []
    for topic in (stack.config.topics.views, stack.config.topics.checkpoints):
        r = ConfigResource(
            ConfigResource.Type.TOPIC,
            topic,
            incremental_configs=[
                ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                for k, v in fast.items()
            ],
        )
        resources.append(r)
    for f in admin.incremental_alter_configs(resources).values():
        f.result()
    deadline = time.monotonic() + 150  # the cleaner's pace under load (CI: 2 cores)
    while time.monotonic() < deadline:
        time.sleep(2)
        roller = LogBuilder()  # new writes after segment.ms roll the active segment
        roller.system("roll")
        stack.produce(f"roller-{time.monotonic_ns()}", roller.events)
        stack.run_processor(max_idle_s=1)
        cps = versions(stack.config.topics.checkpoints)
        vws = versions(stack.config.topics.views)
        if cps[key] == 1 and vws[b"s000/~h"] == 1:
            break
    else:
        raise AssertionError(f"not compacted: checkpoints {cps[key]}, views {vws[b's000/~h']}")
    wait_for_views(stack, {sid: stack.expected(sid) for sid in logs}, timeout=20)
