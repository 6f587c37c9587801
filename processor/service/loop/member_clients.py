"""The member's Kafka clients, one object the loop, the committer and the rebalance share.

Made before them and handed to their constructors; :meth:`MemberClients.open`
creates the clients when a run starts and :meth:`release` forgets them when
it ends, so nothing is wired into another object after it was built.  Two
clients are replaced during a run, always here: the output producer after a
fatal error a broker fault explains (``commit.py``), and the restore
consumer after a restore put off (``rebalance.py``: one whose metadata went
stale in a broker restart kept failing).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace

from confluent_kafka import KafkaException

from processor.config import ServiceConfig
from processor.kafka import clients, group_protocol
from processor.kafka.client_errors import ClientProblems
from processor.kafka.fencing import ZombieFence
from processor.kafka.retry import RetryWatch, observing
from processor.kafka.transport import (
    GroupConsumer,
    KafkaTransport,
    Reader,
    Transport,
    TxnProducer,
)
from processor.telemetry.health import Health
from processor.telemetry.metrics import Metrics

log = logging.getLogger(__name__)


class MemberClients:
    """The group consumer, the output producer, the restore consumer and the fence."""

    def __init__(
        self,
        config: ServiceConfig,
        transport: Transport,
        problems: ClientProblems,
        metrics: Metrics,
        *,
        instance_id: str,
    ) -> None:
        self.config = config
        self.transport = transport
        #: what the clients report (errors, brokers down), read by /readyz and the loop
        self.problems = problems
        self.metrics = metrics
        self.instance_id = instance_id
        self.consumer: GroupConsumer | None = None
        self.producer: TxnProducer | None = None
        #: the restore's consumer (no group: it assigns partitions itself)
        self.reader: Reader | None = None
        #: fences a dead member's open transaction on an assigned partition (fencing.py)
        self.fence: ZombieFence | None = None
        report_join_refusals(problems, metrics.health, metrics)

    def open(self) -> GroupConsumer:
        """Create the run's clients; the group consumer."""
        cfg, transport, problems = self.config, self.transport, self.problems
        self.consumer = consumer = transport.group_consumer(self.instance_id, problems)
        self.producer = transport.output_producer(self.instance_id, problems)
        self.reader = self.plain("restore")
        # only a transport that can fence has the fence (else the broker's timeout)
        fence = getattr(transport, "zombie_fence", None)
        if fence is not None and cfg.exactly_once and cfg.fence_zombies:
            self.fence = fence(self.instance_id, self.metrics)
        return consumer

    def start(self, init: Callable[[], object]) -> None:
        """The output producer's ``init`` (the committer's start) beside the
        permission check and the restore consumer's first request, before the
        join; /readyz names a broker nobody answers for while either waits."""

        def beside() -> None:
            self.transport.require_permissions(self.problems, self.metrics)
            self._warm_reader()

        side_by_side(lambda: run_observed(self.metrics.retries, init), beside)

    def _warm_reader(self) -> None:
        """The restore consumer's first request, made now: a new client's first
        request waits ~0.5 s (its reconnect back-off, ``clients.QUIET_RECONNECT``),
        and a restarted member's first restore asked it on the loop thread while
        its partitions waited (0.34-0.51 s in a rolling restart, issue 37).
        A failure is the restore's to meet (and retry) later."""
        reader = self.reader
        if reader is None:
            return
        try:
            reader.list_topics(self.config.topics.checkpoints, timeout=2)
        except KafkaException as exc:
            log.info("restore consumer's first request failed (%s); the restore asks again", exc)

    def plain(self, purpose: str) -> Reader:
        """A consumer without a group (covered by the group's READ ACL)."""
        return self.transport.plain_consumer(purpose, self.problems, self.config.group_id)

    def new_producer(self) -> TxnProducer:
        """A new output producer in the old one's place (it fences the old one)."""
        self.producer = self.transport.output_producer(self.instance_id, self.problems)
        return self.producer

    def new_reader(self) -> Reader | None:
        """A new restore consumer in the old one's place; the old one (to close)."""
        old, self.reader = self.reader, self.plain("restore")
        return old

    def release(self) -> None:
        """The run ended (the clients are closed): forget them."""
        self.consumer = self.producer = self.reader = None
        self.fence = None


def with_group_protocol(
    config: ServiceConfig, transport: Transport | None, metrics: Metrics
) -> tuple[ServiceConfig, Transport]:
    """The config with ``group_protocol = "auto"`` resolved (the broker asked
    once: group_protocol.py), and the transport made with it.  A transport
    that is not Kafka's (the in-memory one) runs the classic protocol."""
    if config.group_protocol == "auto":
        if transport is None or isinstance(transport, KafkaTransport):
            choice = group_protocol.resolve(config, clients.admin(config))
            config = replace(
                config,
                group_protocol=choice.protocol,
                group_session_timeout_ms=choice.session_timeout_ms,
            )
            if transport is not None:
                transport.config = config
        else:
            config = replace(config, group_protocol="classic")
    metrics.group_protocol.labels(config.group_protocol).set(1)
    return config, transport or KafkaTransport(config)


def report_join_refusals(problems: ClientProblems, health: Health, metrics: Metrics) -> None:
    """A refused static member's join (rejoin.py): counted, named on /readyz
    until the group assigns it (rebalance.py clears ``health.group``)."""

    def refused(line: str) -> None:
        metrics.join_refusals.inc()
        health.group = line

    problems.on_join_refused = refused


def side_by_side(main: Callable[[], object], beside: Callable[[], object]) -> None:
    """``beside`` in a thread while ``main`` runs: the start's independent round
    trips (the producer's ``init_transactions``, the permission check: ~0.5 s
    each, in every restart of a rollout).  ``beside``'s error is raised
    first: a missing ACL explains a refused init."""
    errors: list[BaseException] = []

    def run_beside() -> None:
        try:
            beside()
        except BaseException as exc:  # handed to the caller's thread
            # without tracebacks: their frames would keep the check's admin
            # client alive until a collection frees it in another thread (a
            # librdkafka abort, transport.py)
            seen: BaseException | None = exc
            while seen is not None:
                seen.__traceback__ = None
                seen = seen.__cause__ or seen.__context__
            errors.append(exc)

    thread = threading.Thread(target=run_beside, name="start-check", daemon=True)
    thread.start()
    try:
        main()
    finally:
        thread.join()
        if errors:
            raise errors[0]


def run_observed(watch: RetryWatch, call: Callable[[], object]) -> None:
    """``call`` with its retries reported to ``watch`` (this thread's: retry.py)."""
    with observing(watch):
        call()
