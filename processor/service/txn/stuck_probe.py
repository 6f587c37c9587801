"""Judging a ``send_offsets_to_transaction`` stuck before its timeout.

The producer finds the group coordinator through its own cache; once that
names a broker that went away, librdkafka 2.16 waits for some broker's state
to change before it asks again (issue 5511) and never checks the call's
timeout (5456), so a call can hang for as long as the brokers stay as they
are.  ``txn_helper.py`` gives such a call up 2 s past its 10 s timeout; a
failover run had one hang 12 s, 7 s after the coordinator had moved.

The consumer finds its group coordinator on its own: when that answers
twice in a row (an offset fetch of an owned partition, which fails at once
while the consumer has no coordinator) the coordinator has moved and is
serving, and a new producer gets it at once.  :class:`StuckProbe` says so,
asked by :meth:`HelperThread.await_watched` from 1 s into the call:

- only after a broker fault in the last minute, and only while the stuck
  budget has a spare (each replacement leaves a thread and a client behind),
  so a slow call on a healthy cluster is never replaced on a guess;
- never while the producer's transaction coordinator is away (its connection
  failed within 10 s before the call, and no init or commit has answered
  since): the call's first half waits for it until the controller moves it,
  and a new producer's ``init_transactions`` would wait just the same.  It
  is away no longer once the cluster's metadata names another broker for it
  (``kafka/coordinators.py``; librdkafka looks it up again every 0.5 s), or
  ``TXN_MOVED_S`` after its trouble began (the controller moves a broker's
  leaderships after ``broker.session.timeout.ms``, 9 s by default).  When one
  broker held both coordinators the call then waits on the group coordinator
  it cached: the runs before this rule held such calls to their timeout,
  12 s, and views to 14-24 s.

librdkafka hands a client's errors to ``error_cb`` only when the client is
polled, and the loop polls nothing while it waits for this call: the probe
polls the producer first, or a transaction coordinator killed during the
call goes unseen.  A failover run replaced every member's producer 3.5 s
after their transaction coordinator's broker died, the group coordinator
answering all along; the new producers' ``init_transactions`` then waited
14 s, and the views 21.6 s, where the old calls would have ended ~10 s in.
"""

from __future__ import annotations

import contextlib
import time

from confluent_kafka import KafkaException, TopicPartition

from processor.config import ServiceConfig
from processor.engine import Engine
from processor.kafka.clients import transactional_id
from processor.kafka.coordinators import TXN_STATE_TOPIC, coordinator_address
from processor.kafka.retry import ReplacementBudget
from processor.service.loop.member_clients import MemberClients

#: A broker fault this recent lets a long call be judged stuck early.
TROUBLE_RECENT_S = 60.0
#: A transaction coordinator's transport error this long before a call began
#: (or since) means the call may be waiting for it: not judged stuck early.
TXN_TROUBLE_BEFORE_S = 10.0
#: Offset fetches in a row the consumer's coordinator must answer.
ANSWERS = 2
#: A transaction coordinator's trouble this old is over: the controller has
#: moved it (or its broker is back), whatever the metadata said.
TXN_MOVED_S = 10.0


class StuckProbe:
    """Why a long ``send_offsets_to_transaction`` is stuck already (see module doc)."""

    def __init__(
        self,
        config: ServiceConfig,
        clients: MemberClients,
        engine: Engine,
        budget: ReplacementBudget,
    ) -> None:
        self.topic = config.topics.events
        self.txn_id = transactional_id(config, clients.instance_id)
        self.problems = clients.problems
        self._clients = clients
        self._engine = engine
        self._budget = budget
        #: monotonic time the transaction coordinator last answered (an init,
        #: a commit): its trouble before that is over
        self.answered_at = 0.0
        #: the call being judged (its start) and the offset fetches in a row the
        #: consumer's coordinator answered during it
        self._call = 0.0
        self._answers = 0

    def txn_answered(self) -> None:
        """The transaction coordinator answered (an init or a commit ended well)."""
        self.answered_at = time.monotonic()

    def __call__(self, began: float) -> str | None:
        """Why the call that began at ``began`` (monotonic) is stuck, or None."""
        if began != self._call:  # another call (a retried step): judged afresh
            self._call, self._answers = began, 0
        producer = self._clients.producer
        if producer is not None:  # its errors so far (a transaction coordinator gone?)
            with contextlib.suppress(KafkaException):
                producer.poll(0)
        if not self._may_judge(began):
            return None
        consumer, owned = self._clients.consumer, min(self._engine.partitions, default=None)
        if consumer is None or owned is None:
            return None
        try:
            got = consumer.committed([TopicPartition(self.topic, owned)], timeout=1.0)
        except KafkaException:
            got = None
        if not got or any(t.error is not None for t in got):
            self._answers = 0
            return None
        self._answers += 1
        if self._answers < ANSWERS:
            return None
        return (
            "the consumer's group coordinator answers, the producer still waits for "
            "the one it had (librdkafka issue 5511)"
        )

    def _may_judge(self, began: float) -> bool:
        trouble = self.problems.broker_trouble_at
        if trouble is None or time.monotonic() - trouble > TROUBLE_RECENT_S:
            return False
        return not self._txn_coordinator_away(began) and self._budget.spare()

    def _txn_coordinator_away(self, began: float) -> bool:
        problems = self.problems
        last = problems.txn_coordinator_trouble_at
        if last is None or last < began - TXN_TROUBLE_BEFORE_S or last <= self.answered_at:
            return False
        if time.monotonic() - problems.txn_coordinator_trouble_since >= TXN_MOVED_S:
            return False
        consumer = self._clients.consumer
        if consumer is None:
            return True
        try:
            metadata = consumer.list_topics(TXN_STATE_TOPIC, timeout=0.5)
        except KafkaException:
            return True
        now_at = coordinator_address(metadata, TXN_STATE_TOPIC, self.txn_id)
        return now_at is None or now_at == problems.txn_coordinator_lost
