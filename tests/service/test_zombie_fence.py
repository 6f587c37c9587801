"""A dead member's open transaction is fenced by the next owner (issue 37, item 2).

Real broker: a member SIGKILLed with a transaction open under an instance id
never used again no longer holds ``read_committed`` readers until the broker
expires the transaction (here two minutes); and a member still in the group
is never fenced.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Callable
from concurrent.futures import wait
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

from processor.kafka import clients
from processor.kafka.fencing import ZombieFence, member_instances, writer_metadata, writer_of
from processor.kafka.retry import is_transient
from processor.service.partitions import restore
from tests.service.conftest import Stack, sessions
from tests.service.test_processor import wait_for_views

#: the dead member's transaction timeout: the broker would abort its open
#: transaction only after this; the takeover must not wait for it
ZOMBIE_TIMEOUT_MS = 120_000
#: well under ZOMBIE_TIMEOUT_MS: the session timeout, a join and a restore
TAKEOVER_BOUND_S = 60


def _answers(futures: dict[Any, Any]) -> dict[Any, Any] | None:
    """The admin futures' results once every one has ended; ``None`` when the
    broker asked to be asked again (a coordinator still loading on a broker
    started seconds before).  The caller's admin client is released in its
    own thread when it returns: a failed call's client collected later, by
    the cyclic GC in another client's callback, can abort the process."""
    done, _ = wait(list(futures.values()), timeout=30)
    assert len(done) == len(futures), "an admin request unanswered after 30 s"
    try:
        return {key: f.result() for key, f in futures.items()}
    except KafkaException as exc:
        if not is_transient(exc):
            raise
    return None


def _committed(stack: Stack) -> dict[int, int]:
    """The group's committed events offsets ({} while its coordinator loads)."""
    admin = clients.admin(stack.config)
    group = stack.config.group_id
    got = _answers(admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)]))
    if got is None:
        return {}
    topic = stack.config.topics.events
    return {tp.partition: tp.offset for tp in got[group].topic_partitions if tp.topic == topic}


def _ends(stack: Stack, topic: str, level: IsolationLevel) -> dict[int, int]:
    latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    spec = {TopicPartition(topic, p): latest for p in range(stack.config.partitions)}
    for _ in range(50):
        admin = clients.admin(stack.config)  # a new client per attempt (see _answers)
        got = _answers(admin.list_offsets(spec, isolation_level=level))
        del admin
        if got is not None:
            return {tp.partition: info.offset for tp, info in got.items()}
        time.sleep(0.2)
    raise AssertionError(f"the ends of {topic} unknown after 50 attempts")


def _open(stack: Stack, topic: str) -> bool:
    """A transaction is open on ``topic``: its stable end is below its high watermark."""
    lso = _ends(stack, topic, IsolationLevel.READ_COMMITTED)
    hwm = _ends(stack, topic, IsolationLevel.READ_UNCOMMITTED)
    return any(lso[p] < hwm[p] for p in hwm)


def _wait(check: Any, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        time.sleep(0.2)


@pytest.mark.kafka
def test_a_killed_members_transaction_is_fenced_by_its_new_owner(
    stack: Stack, tmp_path: Path
) -> None:
    logs = sessions(4, 60, seed=37)
    producer = stack.producer()
    for sid, events in logs.items():
        stack.produce(sid, events[:20], producer)
    producer.flush(30)
    arm = tmp_path / "arm"
    dead = f"dead-{uuid.uuid4().hex[:6]}"
    a_log, b_log = tmp_path / "a.log", tmp_path / "b.log"
    a = stack.spawn(
        dead,
        "--transaction-timeout-ms",
        str(ZOMBIE_TIMEOUT_MS),
        env={"PROCESSOR_FAULTPOINT": "before-send-offsets", "PROCESSOR_FAULTPOINT_ARM": str(arm)},
        log=a_log,
    )
    b = None
    try:
        ends = _ends(stack, stack.config.topics.events, IsolationLevel.READ_UNCOMMITTED)
        ends = {p: end for p, end in ends.items() if end > 0}
        _wait(
            lambda: {p: _committed(stack).get(p) for p in ends} == ends,
            "the first member to commit",
            120,
        )
        arm.touch()  # its next transaction is killed with its records produced
        for sid, events in logs.items():
            stack.produce(sid, events[20:40], producer)
        producer.flush(30)
        a.wait(60)
        assert a.returncode == -signal.SIGKILL, a_log.read_text()[-2000:]
        assert _open(stack, stack.config.topics.views), "the scenario: a transaction left open"
        b = stack.spawn(f"new-{uuid.uuid4().hex[:6]}", log=b_log)
        for sid, events in logs.items():
            stack.produce(sid, events[40:], producer)
        producer.flush(30)
        # a read_committed reader of the views sees everything long before the
        # dead member's transaction would time out
        wait_for_views(stack, {sid: stack.expected(sid) for sid in logs}, TAKEOVER_BOUND_S)
        assert "fenced dead member" in b_log.read_text(), b_log.read_text()[-3000:]
        assert not _open(stack, stack.config.topics.checkpoints)
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)


def _txn_producer(stack: Stack, instance: str) -> Producer:
    txn_id = clients.transactional_id(stack.config, instance)
    p = Producer(
        {
            "bootstrap.servers": stack.config.bootstrap_servers,
            "transactional.id": txn_id,
            "transaction.timeout.ms": ZOMBIE_TIMEOUT_MS,
        }
    )
    p.init_transactions(30)
    return p


def _commit_then_open(stack: Stack, p: Producer, instance: str, partition: int, group: Any) -> None:
    """A committed transaction naming ``instance`` on ``partition``, then an open one."""
    topics = stack.config.topics
    offsets = [TopicPartition(topics.events, partition, 1, metadata=writer_metadata(instance))]
    p.begin_transaction()
    p.send_offsets_to_transaction(offsets, group, 30)
    p.commit_transaction(30)
    p.begin_transaction()
    p.produce(topics.checkpoints, b"open", b"k", partition)
    assert p.flush(30) == 0


@pytest.mark.kafka
def test_a_member_of_the_group_is_never_fenced(stack: Stack) -> None:
    cfg = stack.config
    member = Consumer(
        {
            "bootstrap.servers": cfg.bootstrap_servers,
            "group.id": cfg.group_id,
            "client.id": "processor-live1@http://127.0.0.1:1",
            "enable.auto.commit": False,
        }
    )
    member.subscribe([cfg.topics.events])
    _wait(lambda: member.poll(0.2) is None and bool(member.assignment()), "the member to join", 60)
    group = member.consumer_group_metadata()
    live, gone = _txn_producer(stack, "live1"), _txn_producer(stack, "dead1")
    try:
        _commit_then_open(stack, live, "live1", 0, group)
        _commit_then_open(stack, gone, "dead1", 1, group)
        fence = ZombieFence(cfg, "me")
        assert fence.writers(clients.admin(cfg)) == {"live1", "dead1"}
        assert fence.fence([0, 1], lambda: True) == ["dead1"]
        live.commit_transaction(30)  # still its own: not fenced
        with pytest.raises(KafkaException):
            gone.commit_transaction(30)
        assert not _open(stack, cfg.topics.checkpoints)
    finally:
        member.close()


def test_offsets_name_their_writer() -> None:
    assert writer_of(writer_metadata("m-1")) == "m-1"
    assert writer_of("") is None and writer_of(None) is None and writer_of("other") is None


def test_members_are_named_by_client_id_and_static_id() -> None:
    class M:
        def __init__(self, client_id: str, static: str | None = None) -> None:
            self.client_id, self.group_instance_id = client_id, static

    members = [M("processor-a@http://h:1"), M("processor-b"), M("x", "c"), M("other")]
    assert member_instances(SimpleNamespace(members=members)) == {"a", "b", "c"}


def test_wait_stable_fences_once_then_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    states = iter([{0: False}] * 6 + [{0: True}])
    monkeypatch.setattr(restore, "_stable_offsets", lambda *a: next(states))
    monkeypatch.setattr(restore, "FENCE_AFTER_S", 0.0)
    calls: list[list[int]] = []

    def on_open(parts: list[int], still: Callable[[], bool]) -> None:
        calls.append(list(parts))
        assert still()

    left = restore.wait_stable(
        lambda: None,  # type: ignore[arg-type,return-value]
        "t",
        [0],
        30,
        poll_s=0.0,
        on_open=on_open,
    )
    assert left == [] and calls == [[0]]


def test_a_fence_after_the_session_timeout_is_a_new_owners_not_a_second_member() -> None:
    """Paused past the session timeout (not yet the transaction timeout), a member
    may have been fenced as dead by its partitions' new owner: it goes on."""
    from processor.config import ServiceConfig
    from processor.service.txn.transactions import fenced_by_another_member

    cfg = ServiceConfig()
    fenced = KafkaError(KafkaError._FENCED)

    def verdict(open_s: float) -> bool:
        return fenced_by_another_member(
            fenced, open_s, cfg, explained_at=(), replaced_at=None, instance_id="m"
        )

    assert cfg.effective_transaction_timeout_ms > 11_000
    assert verdict(1.0)  # fenced while in the group: another member has our id
    assert not verdict(11.0)  # past the 10 s session timeout


class _Admin:
    """An admin client's answers: the offsets' metadata and the group's members."""

    def __init__(self, named: list[str | None], members: list[str]) -> None:
        self.named, self.member_ids = named, members

    def list_consumer_group_offsets(self, request: Any, **kw: Any) -> dict[str, Any]:
        assert kw["require_stable"] is False  # a dead member's pending offsets hide none
        tps = [
            SimpleNamespace(topic="processor.events", metadata=m and writer_metadata(m))
            for m in self.named
        ]
        return {"processor": _Done(SimpleNamespace(topic_partitions=tps))}

    def describe_consumer_groups(self, groups: list[str], **kw: Any) -> dict[str, Any]:
        members = [SimpleNamespace(client_id=f"processor-{m}") for m in self.member_ids]
        return {"processor": _Done(SimpleNamespace(members=members))}


class _Done:
    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self, timeout: float | None = None) -> Any:
        return self.value


def test_only_writers_gone_from_the_group_are_fenced_while_the_partition_is_open() -> None:
    from processor.config import ServiceConfig

    fenced: list[str] = []
    counts: list[str] = []
    fence = ZombieFence(
        ServiceConfig(),
        "me",
        admin=lambda: _Admin(["gone", "live", "me", None], ["live", "me"]),
        fencer=fenced.append,
        counted=counts.append,
    )
    assert fence.fence([0], lambda: True) == ["gone"]
    assert fenced == ["processor-gone"] and counts == ["fenced"]
    # ended meanwhile (a member restarted under that id fenced it itself): no fence
    assert fence.fence([0], lambda: False) == []
    assert fenced == ["processor-gone"]
