"""Kafka alone, no processor: transactional producers commit small transactions
over six partitions while the transaction coordinator's node is SIGKILLed and
restarted within the controller's broker session timeout (9 s), the window in
which a restarted broker acts as coordinator on its old leadership; the kept node
logs are then read by ``python3 -m tests.faults.diagnose <dir>`` for transactions
both committed and aborted.

    PROCESSOR_KAFKA_LOG4J=tests/faults/log4j2-debug.properties \\
        nice python3 -m tests.faults.txn_split <new dir> [kills] [down seconds]

Seen (40 kills, down 4-8 s): the restarted node elected at its old epoch 25
times, ~12,000 transactions, no split transaction.
"""

from __future__ import annotations

import random
import sys
import threading
import time
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from processor.devcluster import LocalCluster

TOPIC = "split"
PARTITIONS = 6


class Worker(threading.Thread):
    def __init__(self, number: int, bootstrap: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.number, self.bootstrap, self.stop = number, bootstrap, stop
        self.commits = self.failures = 0

    def producer(self) -> Producer:
        """A new producer fences the old one and aborts its open transaction."""
        p = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "transactional.id": f"split-{self.number}",
                "transaction.timeout.ms": 10_000,
                "linger.ms": 1,
            }
        )
        while not self.stop.is_set():
            try:
                p.init_transactions(10)
                break
            except KafkaException:
                time.sleep(0.5)
        return p

    def run(self) -> None:
        p = self.producer()
        n = 0
        while not self.stop.is_set():
            n += 1
            try:
                p.begin_transaction()
                for partition in range(PARTITIONS):
                    p.produce(TOPIC, value=f"{self.number}-{n}".encode(), partition=partition)
                p.commit_transaction(5)
                self.commits += 1
                continue
            except KafkaException as exc:
                self.failures += 1
                err: KafkaError = exc.args[0]
                if err.retriable() and not err.fatal():
                    try:  # a commit that timed out is resumed
                        p.commit_transaction(10)
                        self.commits += 1
                        continue
                    except KafkaException:
                        pass
            p = self.producer()


def main(argv: list[str]) -> int:
    root = Path(argv[0])
    kills = int(argv[1]) if len(argv) > 1 else 40
    down = float(argv[2]) if len(argv) > 2 else 6.0
    cluster = LocalCluster(3, keep=True)
    cluster.start(root / "cluster")
    stop = threading.Event()
    workers: list[Worker] = []
    try:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3)])[TOPIC].result(30)
        workers = [Worker(i, cluster.bootstrap, stop) for i in range(4)]
        for w in workers:
            w.start()
        time.sleep(8)
        for k in range(kills):
            md = admin.list_topics("__transaction_state", timeout=10)
            node = int(md.topics["__transaction_state"].partitions[0].leader)
            commits = sum(w.commits for w in workers)
            at = time.strftime("%H:%M:%S")
            print(f"{at} kill {k}: node {node}; {commits} commits", flush=True)
            cluster.kill(node)
            time.sleep(random.uniform(down - 2, down + 2))
            cluster.restart(node)
            time.sleep(random.uniform(3, 6))
    finally:
        stop.set()
        for w in workers:
            w.join(20)
        cluster.stop()
    print(f"{sum(w.commits for w in workers)} commits; node logs in {root}/cluster")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
