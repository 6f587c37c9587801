"""The runner's per-record loop on the Kafka consumer's own message objects
(history/2-peer.md): ``Processor._fold_batch`` over
``confluent_kafka.Message`` objects, the engine's output drained per batch
with the heap settle's collect + freeze, and a SHA-256 of every output record.

``bench.lab.svc_ab mem`` hands the loop ``memory.py``'s messages, whose accessors
are interpreted frames whatever calls them; the real consumer's are C objects.
Instructions per event, compiled (run next to ``bench/``, the compiled wheel
installed)::

    PYTHONHASHSEED=0 valgrind --tool=cachegrind --cache-sim=no \\
        python -m bench.lab.svc_loop /tmp/svc2-ev-small.bin R
    # (Ir(R=2) - Ir(R=1)) / events
"""

from __future__ import annotations

import gc
import hashlib
import sys
import time

from confluent_kafka import Message

from bench.lab.svc_ab import _events, in_partition_order
from bench.workload import PARTITIONS

BATCH = 1000


def run(path: str, runs: int) -> None:
    from processor.config import ServiceConfig
    from processor.engine import Batch, PartitionState
    from processor.service.loop.runner import Processor
    from processor.testing.memory import MemoryBroker, MemoryTransport

    data = _events(path, 200, 60)
    for i in range(runs):
        config = ServiceConfig(partitions=PARTITIONS)
        proc = Processor(config, transport=MemoryTransport(MemoryBroker(), config))
        engine = proc.engine
        for p in range(PARTITIONS):
            engine.partitions[p] = PartitionState(p)
        msgs = [
            Message(
                topic=config.topics.events,
                partition=p,
                offset=offset,
                key=key,
                value=value,
                timestamp=(1, 1000),
            )
            for p, offset, key, value in in_partition_order(data)
        ]
        sha = hashlib.sha256()
        gc.set_threshold(50_000, 20, 100)
        gc.collect()
        gc.freeze()
        t0 = time.process_time()
        for start in range(0, len(msgs), BATCH):
            proc._fold_batch(msgs[start : start + BATCH], 0.0)
            outs = list(engine.output())
            engine.batch = Batch()
            gc.collect()
            gc.freeze()
            for o in outs:
                sha.update(f"{o.topic}/{o.partition}/".encode())
                sha.update(o.key or b"-")
                sha.update(b"=" + o.value if o.value is not None else b"!")
        cpu = (time.process_time() - t0) / len(msgs) * 1e6
        print(
            f"run {i}: {len(msgs)} msgs, {cpu:.1f} us/event, sha256 {sha.hexdigest()[:16]}",
            flush=True,
        )
        gc.unfreeze()


if __name__ == "__main__":
    run(sys.argv[1], int(sys.argv[2]))
