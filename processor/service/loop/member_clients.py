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

from processor.config import ServiceConfig
from processor.kafka.client_errors import ClientProblems
from processor.kafka.fencing import ZombieFence
from processor.kafka.transport import GroupConsumer, Reader, Transport, TxnProducer
from processor.telemetry.metrics import Metrics


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
