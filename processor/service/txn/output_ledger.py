"""The batch's output records into the producer, and the checkpoint ledger.

Every output record of a batch goes out through :meth:`OutputLedger.produce`.
Views and dead letters ask for a delivery report only for the first record
per partition and transaction (which topic refused: a denial fails them
all); the others cost no callback.  Checkpoint records go through the local
store's ledger: each partition's last one is held back and produced last
(:meth:`OutputLedger.release`) with the one delivery report the store
derives the partition's offsets from.  Reports are served on whichever
thread flushes the producer and only kept; the loop thread applies them
(:meth:`OutputLedger.apply_reports`).
"""

from __future__ import annotations

from confluent_kafka import KafkaError, Message

from processor.config import ServiceConfig
from processor.kafka import clients
from processor.kafka.client_errors import ClientProblems
from processor.kafka.transport import TxnProducer
from processor.service.store.checkpoint_store import CheckpointStore


class OutputLedger:
    """What of the open transaction was produced, and its delivery reports."""

    def __init__(
        self, config: ServiceConfig, store: CheckpointStore, problems: ClientProblems
    ) -> None:
        self.config = config
        self.store = store
        self.problems = problems
        #: per checkpoints partition, its last record of the open transaction (held
        #: back: produced last, with the delivery report, by ``release``)
        self._held: dict[int, tuple[bytes | None, bytes | None]] = {}
        #: (topic, partition) pairs whose first record of the transaction is out
        self._reported: set[tuple[str, int]] = set()
        #: delivery reports of checkpoint records, appended on whichever thread
        #: served them, applied to the store on the loop thread (apply_reports)
        self._reports: list[tuple[KafkaError | None, Message]] = []

    def produce(
        self,
        producer: TxnProducer,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
    ) -> None:
        """Produce one output record; checkpoint records go through the store's
        ledger and only the last one per partition asks for a delivery report."""
        if topic != self.config.topics.checkpoints:
            # the first record per topic and transaction reports its failure (which
            # topic refused: a denial fails them all); the others cost no callback
            # without transactions nothing else notices a failed record: all report
            first = (topic, partition) not in self._reported or not self.config.exactly_once
            if first:
                self._reported.add((topic, partition))
            clients.produce(
                producer,
                topic,
                key,
                value,
                partition=partition,
                on_delivery=self.problems.on_delivery if first else None,
            )
            return
        held = self._held.get(partition)
        if held is not None:  # not the partition's last: its offset is derived
            clients.produce(producer, topic, *held, partition=partition)
        self._held[partition] = (key, value)
        self.store.produced(partition, key, value)

    def release(self, producer: TxnProducer) -> None:
        """Produce each partition's held-back last checkpoint record, with the one
        delivery report the store derives that partition's offsets from."""
        topic = self.config.topics.checkpoints
        for partition, (key, value) in self._held.items():
            clients.produce(
                producer, topic, key, value, partition=partition, on_delivery=self._delivered
            )
        self._held.clear()
        self._reported.clear()

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        """The last checkpoint record's delivery report: the store's offsets.

        Served on the loop thread or on the helper (inside its flush and
        ``commit_transaction``): only kept here (list.append is atomic), applied
        on the loop thread by :meth:`apply_reports`."""
        self._reports.append((err, msg))

    def apply_reports(self) -> None:
        reports, self._reports = self._reports, []
        for err, msg in reports:
            self.store.delivered(err, msg)
            if err is not None:  # this callback replaces the producer's: pass failures on
                self.problems.on_delivery(err, msg)

    def forget(self) -> None:
        """Nothing of an unfinished transaction may ride along into the next."""
        self._held.clear()
        self._reported.clear()
        self._reports.clear()
        self.store.aborted()
