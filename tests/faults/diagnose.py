"""Read a kept fault-suite cluster's node logs for the coordinator failovers that
break a transaction's atomicity.

Run with the DEBUG log4j file next to this module (``PROCESSOR_KAFKA_LOG4J``) and
``PROCESSOR_FAULTS_KEEP=<dir>`` (conftest), then::

    python3 -m tests.faults.diagnose <dir>

It prints, merged over the nodes' ``node.log*`` files:

- each election of a transaction coordinator (``txn``) and each load of the
  group coordinator (``group``) with its epoch; one at an epoch already held is
  a restarted broker acting on its old leadership (before the controller moves
  it: a restart within ``broker.session.timeout.ms``);
- transactions both committed and aborted: per (transactional id, producer id,
  start time) the PREPARE_COMMIT / PREPARE_ABORT each coordinator moved it to or
  sent markers for (a committed checkpoint beside aborted offsets);
- committed offsets of a partition that went back, and materializations the
  group coordinator skipped.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

STAMP = re.compile(r"\[\d{4}-\d\d-\d\dT(\d\d:\d\d:\d\d,\d+)\]")
ELECTED = re.compile(r"Elected as the txn coordinator for partition \d+ at epoch (\d+)")
LOADED = re.compile(r"Finished loading of metadata from __consumer_offsets-\d+ with epoch (\d+)")
STATE = re.compile(
    r"Updating (\S+)'s transaction state to TxnTransitMetadata\[producerId=(\d+), .*?"
    r"producerEpoch=(\d+), .*?txnState=(PREPARE_COMMIT|PREPARE_ABORT), "
    r"topicPartitions=\[([^\]]*)\], txnStartTimestamp=(-?\d+)"
)
MARKERS = re.compile(
    r"Sending (\S+)'s transaction markers for TransactionMetadata\(transactionalId=\S+, "
    r"producerId=(\d+), .*?producerEpoch=(\d+), .*?state=(PREPARE_COMMIT|PREPARE_ABORT), "
    r".*?topicPartitions=HashSet\(([^)]*)\), txnStartTimestamp=(-?\d+)"
)
COMMITTED = re.compile(
    r"Committed transactional offset commit OffsetAndMetadata\(offset=(\d+),.*?"
    r"recordOffset=(\d+)\) for producer id (\d+) in group \S+ with topic (\S+) and partition (\d+)"
)


def lines(root: Path) -> Iterator[tuple[str, str, str]]:
    """(time, node file, text) of every stamped line, sorted by time."""
    rows = []
    for path in sorted(root.glob("cluster/node*/node.log*")):
        node = f"{path.parent.name}{path.name.removeprefix('node.log')}"
        for line in path.read_text(errors="replace").splitlines():
            m = STAMP.match(line)
            if m:
                rows.append((m.group(1), node, line[m.end() :].strip()))
    return iter(sorted(rows, key=lambda row: row[0]))  # stable: a file keeps its order


def report(root: Path) -> list[str]:
    out: list[str] = []
    top = {"txn": -1, "group": -1}
    fates: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    seen: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    last: dict[tuple[str, str], int] = {}  # (node file, topic[partition]) -> committed
    for at, node, text in lines(root):
        for kind, pat in (("txn", ELECTED), ("group", LOADED)):
            m = pat.search(text)
            if m:
                elected = int(m.group(1))
                # at an epoch already held (by this node before it restarted, or a
                # newer one): it acts on leadership the controller is taking away
                stale = f"   <-- STALE: epoch {top[kind]} held" if elected <= top[kind] else ""
                top[kind] = max(top[kind], elected)
                out.append(f"{at} {node} {kind} coordinator epoch {elected}{stale}")
        m = STATE.search(text) or MARKERS.search(text)
        if m:
            tid, pid, epoch, state, parts, start = m.groups()
            how = "markers sent" if text.startswith("DEBUG [Transaction Marker") else "state"
            fates[(tid, pid, start)].add(state)
            seen[(tid, pid, start)].append(f"{at} {node} {how} {state} epoch {epoch} [{parts}]")
        if "Scheduling loading of metadata from __consumer_offsets" in text:
            # a load replays the partition from its start: compare live commits only
            last = {k: v for k, v in last.items() if k[0] != node}
        m = COMMITTED.search(text)
        if m:
            offset, record, pid, topic, partition = m.groups()
            where = (node, f"{topic}[{partition}]")
            if where in last and int(offset) < last[where]:
                out.append(
                    f"{at} {node} COMMITTED OFFSET BACK {where[1]}: {last[where]} -> {offset} "
                    f"(producer id {pid}, record {record})"
                )
            last[where] = int(offset)
        if "Skipped the materialization" in text:
            out.append(f"{at} {node} {text[:300]}")
    for key, states in fates.items():
        if len(states) > 1:
            out.append(f"SPLIT transaction {key[0]} producer id {key[1]} started {key[2]}:")
            out.extend(f"    {row}" for row in seen[key])
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python3 -m tests.faults.diagnose <PROCESSOR_FAULTS_KEEP dir>")
        return 2
    print("\n".join(report(Path(argv[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
