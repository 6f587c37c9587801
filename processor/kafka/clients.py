"""Thin factories for the confluent-kafka clients the service uses.

The settings that exactly-once and the seq gate rely on are applied after
the user's ``-X`` overrides, so a pass-through setting cannot silently turn
them off.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient

from processor.config import ServiceConfig
from processor.engine.record_bounds import PRODUCER_MAX_MESSAGE_BYTES
from processor.kafka import client_count
from processor.kafka.client_errors import LIBRDKAFKA_LOGGER, ClientProblems
from processor.kafka.owners import member_client_id
from processor.kafka.rejoin import RejoiningConsumer


class Producing(Protocol):
    """What :func:`produce` needs: confluent's ``Producer`` or the in-memory one."""

    def produce(
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int = -1,
        *,
        on_delivery: Any = None,
        headers: Any = None,
    ) -> None: ...
    def poll(self, timeout: float = -1) -> int: ...


def produce(
    producer: Producing,
    topic: str,
    key: bytes | None,
    value: bytes | None,
    *,
    partition: int | None = None,
    headers: Any = None,
    on_delivery: Callable[[KafkaError | None, Message], None] | None = None,
) -> None:
    """Produce one record, waiting while librdkafka's local queue is full.

    ``BufferError`` means the queue (``queue.buffering.max.*``) is full:
    polling serves delivery reports, which frees it; every queued record is
    delivered or failed within ``message.timeout.ms``, so the wait ends.
    ``partition`` None and -1 both mean the partitioner's choice; ``headers``
    None, none; ``on_delivery`` None, the producer's own callback (as confluent's).
    """
    part = -1 if partition is None else partition
    while True:
        try:
            if on_delivery is None and headers is None:
                # most output records: positional, as confluent's produce parses
                # keywords into a dict per call (1.2 vs 0.6 us a call, figure 1)
                producer.produce(topic, value, key, part)
            else:
                producer.produce(
                    topic,
                    value=value,
                    key=key,
                    partition=part,
                    on_delivery=on_delivery,
                    headers=headers,
                )
            return
        except BufferError:
            producer.poll(0.05)


#: Before the user's settings (``-X`` overrides it).  librdkafka's default, 100 ms,
#: kept each consumer of a member reconnecting to a broker that was gone at ~1%
#: of a core (4-5% for a member); at 1 s, 0.1% each (docs/stopping.md), and a
#: broker back from a restart is reconnected to at most ~1.5 s later.  It also
#: delays a new client's first request by ~0.5 s (a fresh admin's ``list_topics``
#: 0.51 s against 0.06 s), which the long-lived clients pay once per start.
QUIET_RECONNECT: dict[str, Any] = {"reconnect.backoff.ms": 1000}
#: The admin clients, made per call (a permission check, a restore's stability
#: check, the group protocol's describe): their first request is most of their
#: life, and the 1 s back-off made each ~0.5 s slower, in every start and
#: restore of a failover (issue 37).  100 ms doubling to 1 s: a broker that
#: stays down is retried ~5x as often as at 1 s (measured: 300 against 60 failed
#: connects in 15 s), only while such a call lasts.
FAST_FIRST_REQUEST: dict[str, Any] = {"reconnect.backoff.ms": 100, "reconnect.backoff.max.ms": 1000}


def _observed(
    conf: dict[str, Any], problems: ClientProblems | None, operation: str = "READ"
) -> dict[str, Any]:
    """librdkafka logs through Python logging; global errors to ``problems``."""
    conf["logger"] = LIBRDKAFKA_LOGGER
    if problems is not None:
        conf.update(problems.client_settings(operation))
    return conf


#: The group consumer's default ``session.timeout.ms``: how long a member
#: that died stays in the group, and so the first part of every failover
#: (issue 37).  6 s is the broker's default ``group.min.session.timeout.ms``,
#: the shortest it accepts.  Safe because librdkafka heartbeats from its own
#: thread, not from the loop: a long fold, a restore or a GIL-bound stretch of
#: Python does not delay a heartbeat (the loop's liveness is
#: ``max.poll.interval.ms``'s); only a stopped process (SIGSTOP) or host does.
SESSION_TIMEOUT_MS = 6_000
#: ``heartbeat.interval.ms``: members learn that a rebalance began at their
#: next heartbeat, so every rebalance waits up to this for each member.
HEARTBEAT_INTERVAL_MS = 500


#: Settings of the classic protocol that librdkafka refuses under KIP-848
#: (``group.protocol=consumer``): the broker's ``group.consumer.*`` decide.
CLASSIC_ONLY = ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy")


def session_timeout_s(config: ServiceConfig) -> float:
    """How long a silent member stays in the group (a ``-X`` override counts).
    Under KIP-848 the broker's ``group.consumer.session.timeout.ms`` decides:
    as ``auto`` read it at start, else 0 (unknown)."""
    if config.group_protocol == "consumer":
        return config.group_session_timeout_ms / 1000
    return int(config.kafka.get("session.timeout.ms", SESSION_TIMEOUT_MS)) / 1000


def group_consumer(
    config: ServiceConfig, instance_id: str, problems: ClientProblems | None = None
) -> Consumer | RejoiningConsumer:
    """The member's group consumer; a static KIP-848 member's rejoins when
    refused for an instance id still in use (rejoin.py)."""
    conf = _observed(group_settings(config, instance_id), problems)

    def make() -> Consumer:
        client_count.created("group_consumer")
        return Consumer(conf)

    if config.group_protocol == "consumer" and config.static_membership:
        report = problems.join_refused if problems is not None else lambda line: None
        return RejoiningConsumer(make, config.group_id, report)
    return make()


def group_settings(config: ServiceConfig, instance_id: str) -> dict[str, Any]:
    """The group consumer's librdkafka settings (without the observers);
    ``auto`` not resolved yet (``group_protocol.resolve``) counts as classic."""
    conf: dict[str, Any] = {
        "auto.offset.reset": "earliest",
        "session.timeout.ms": SESSION_TIMEOUT_MS,
        "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
        "max.poll.interval.ms": 300_000,
        "fetch.max.bytes": 64 * 1024 * 1024,
        "queued.max.messages.kbytes": 256 * 1024,
        **QUIET_RECONNECT,
        **config.common(),
        "group.id": config.group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        "partition.assignment.strategy": "cooperative-sticky",
        # carries the member's query URL: other members redirect to it (owners.py)
        "client.id": member_client_id(instance_id, config.query_advertise or None),
    }
    if config.group_protocol == "consumer":
        # KIP-848: incremental by design, the broker assigns; a -X override of
        # one of these stays, and librdkafka refuses it in one line
        for key in CLASSIC_ONLY:
            if key not in config.kafka:
                conf.pop(key)
        conf["group.protocol"] = "consumer"
    if config.static_membership:
        conf["group.instance.id"] = instance_id
    return conf


def plain_consumer(
    config: ServiceConfig,
    purpose: str,
    problems: ClientProblems | None = None,
    *,
    group: str | None = None,
) -> Consumer:
    """A group-less consumer for restores, views and verification reads.

    It never joins or commits, but librdkafka still looks up the coordinator
    of its ``group.id`` (DESCRIBE on that group): the processor passes its
    own group (``group``), so its ACLs need no extra group; readers use
    ``<group>-<purpose>-unused``.
    """
    client_count.created("plain_consumer")
    return Consumer(_observed(plain_settings(config, purpose, group=group), problems))


#: plain consumers that stay assigned all run, waiting for records (the control
#: channel): a fetch answered by data returns at once whatever this wait, but an
#: empty one waits it out.  At 10 ms an idle member's control consumer sent ~100
#: fetches a second, 6.6% of a core on the broker against 2.3% at 100 ms
#: (figure 5): CPU the commit path lacked on a busy box
LONG_POLL = {"control": 100}
#: plain consumers made per job, whose first requests are most of their life:
#: the admin clients' reconnect back-off (``FAST_FIRST_REQUEST``).  At 1 s
#: librdkafka waits ``reconnect.backoff.ms / 2`` before it tries another
#: bootstrap broker (its sparse-connection interval): a fill consumer made
#: while one broker was down took 0.5-1.0 s to read the few records of a
#: rewind's fill after a broker fault, the biggest part of the rewind
SHORT_LIVED = frozenset({"fill"})


def plain_settings(
    config: ServiceConfig, purpose: str, *, group: str | None = None
) -> dict[str, Any]:
    """A plain consumer's librdkafka settings (without the observers)."""
    conf: dict[str, Any] = {
        "fetch.max.bytes": 64 * 1024 * 1024,
        # read-to-end jobs: do not long-poll 500 ms at every partition end
        "fetch.wait.max.ms": LONG_POLL.get(purpose, 10),
        **(FAST_FIRST_REQUEST if purpose in SHORT_LIVED else QUIET_RECONNECT),
        **config.common(),
        "group.id": group or f"{config.group_id}-{purpose}-unused",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "enable.partition.eof": True,
    }
    return conf


def output_producer(
    config: ServiceConfig, instance_id: str, problems: ClientProblems | None = None
) -> Producer:
    client_count.created("output_producer")
    return Producer(output_settings(config, instance_id, problems))


def output_settings(
    config: ServiceConfig, instance_id: str, problems: ClientProblems | None = None
) -> dict[str, Any]:
    """The output producer's librdkafka settings."""
    conf: dict[str, Any] = {
        # A transaction's first AddPartitionsToTxn / AddOffsetsToTxn meets
        # CONCURRENT_TRANSACTIONS while the coordinator still writes the
        # previous commit's markers (its commit_transaction has returned; with
        # the overlapped commit the next batch begins ~I - C later).  Retried
        # after the default 100 ms (then 200, 400: exponential) it held ~10% of
        # the transactions 110-430 ms under load (figure 5); the
        # Java producer retries the first AddPartitionsToTxn of a transaction
        # after 20 ms for this reason (KAFKA-5477).
        "retry.backoff.ms": 20,
        "linger.ms": 5,
        "compression.type": "lz4",
        "batch.size": 1_000_000,
        # VF-7: up to the output topics' max.message.bytes; the engine refuses
        # a session whose record would exceed it (engine/record_bounds.py)
        "message.max.bytes": PRODUCER_MAX_MESSAGE_BYTES,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
        # Not QUIET_RECONNECT: a new producer's init_transactions took 0.51 s
        # at 1 s against 0.06-0.10 s here, paid by every member start and every
        # producer replaced in a failover; and librdkafka asks again for a
        # group coordinator it cached only when some broker comes UP (issue
        # 5511), which a restarted broker's connection does ~1 s after it is
        # back instead of up to 15 s (1 s doubling to 10 s, plus jitter).  One
        # client per member: a broker that stays away costs ~1 refused connect
        # a second.
        **FAST_FIRST_REQUEST,
        **config.common(),
        "enable.idempotence": True,
        "acks": "all",
        "client.id": f"processor-{instance_id}",
    }
    if config.exactly_once:
        # One transactional id per processor instance: a restarted instance
        # with the same id fences its predecessor and aborts its open
        # transaction at once instead of waiting for the transaction timeout.
        conf["transactional.id"] = transactional_id(config, instance_id)
        conf["transaction.timeout.ms"] = config.effective_transaction_timeout_ms
    conf = _observed(conf, problems, "WRITE")
    if problems is not None:
        conf.update(problems.producer_settings())
    # the local store is written from the offsets checkpoint records got, which
    # only a successful delivery report carries (checkpoint_store.py); the records that ask
    # for a report name their callback (commit.py): no Python call for the others
    conf["delivery.report.only.error"] = False
    conf.pop("on_delivery", None)
    return conf


def event_producer(
    config: ServiceConfig,
    client_id: str = "processor-writer",
    problems: ClientProblems | None = None,
) -> Producer:
    """Idempotent producer with the Java-compatible partitioner (murmur2)."""
    conf: dict[str, Any] = {
        "linger.ms": 5,
        "compression.type": "lz4",
        **QUIET_RECONNECT,
        **config.common(),
        "enable.idempotence": True,
        "acks": "all",
        "partitioner": "murmur2_random",
        "client.id": client_id,
    }
    client_count.created("event_producer")
    return Producer(_observed(conf, problems, "WRITE"))


def transactional_id(config: ServiceConfig, instance_id: str) -> str:
    """The output producer's ``transactional.id``: one per instance of the group."""
    return f"{config.group_id}-{instance_id}"


def fence_settings(config: ServiceConfig, txn_id: str) -> dict[str, Any]:
    """A short-lived producer whose ``init_transactions`` fences ``txn_id``
    (a dead member's, fencing.py): it never produces."""
    conf: dict[str, Any] = {
        **config.common(),
        "transactional.id": txn_id,
        "client.id": f"processor-fence-{txn_id}",
    }
    return _observed(conf, None, "WRITE")


def admin(config: ServiceConfig, problems: ClientProblems | None = None) -> AdminClient:
    """An admin client whose librdkafka lines go through Python logging too: without
    a ``logger`` librdkafka prints them raw on stderr (``%3|...|FAIL|...``)."""
    conf = {**FAST_FIRST_REQUEST, **config.common()}
    conf["logger"] = LIBRDKAFKA_LOGGER
    if problems is not None:  # an admin client forwards logs and errors only when polled
        conf.update(problems.client_settings())
    client_count.created("admin")
    return AdminClient(conf)
