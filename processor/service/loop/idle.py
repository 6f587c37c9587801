"""When a ``--max-idle-s`` run may end: idle counts only once every partition is read.

A batch run (``processor run --max-idle-s N``) must not end before it has
folded what waits on the topic.  Counting idle time from the assignment did
exactly that on a loaded box: the first fetch after an assignment can take
longer than the window, and the run ended having folded nothing.  So the run
counts as idle only while every assigned partition has been fetched to its
end and nothing else is in flight (the loop decides the latter).

"Fetched to its end", from what the client already caches (no request per
loop turn): the partition's position has reached the high watermark of its
last fetch response (``get_watermark_offsets(cached=True)``).  Before a
partition's first fetch that watermark is unknown (negative): not at end.
librdkafka's position stays unknown until a record (or, for a
``read_committed`` member, a fetch of only control records) moves it; then
the member stands where it resumed — the group's committed offset, else the
low watermark (``auto.offset.reset=earliest``).  A committed transaction's
marker is stepped over by the position, so a partition that ends with one
counts as at end; a transaction still open on the topic holds the partition
short of its end (its records are waiting) until it ends.  The control
partitions (``control.py``) count too: their group-less reader reports each
end of partition, so a command waiting there is read before the run ends.

A partition the broker cannot serve (no leader, a stalled fetch) never
reaches its end, so the wait is bounded too: when nothing was consumed and
no lagging partition's position or watermark moved for ``max_wait_s``
(default ``max(10 x max_idle_s, 60 s)``), the run ends with one warning
naming the partitions that never reached their end.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from confluent_kafka import KafkaException, TopicPartition

from processor.engine import PartitionState
from processor.kafka.transport import Reader

log = logging.getLogger(__name__)

#: "topic[n]" -> (position, cached high watermark) of each partition short of its end
Behind = dict[str, tuple[int, int]]


def default_max_wait_s(max_idle_s: float) -> float:
    """How long partitions that never reach their end may hold an idle run."""
    return max(10 * max_idle_s, 60.0)


def behind_end(consumer: Reader, topic: str, partitions: Mapping[int, PartitionState]) -> Behind:
    """The assigned partitions not fetched to their end, from the client's cache."""
    behind: Behind = {}
    for number, part in partitions.items():
        tp = TopicPartition(topic, number)
        try:
            low, high = consumer.get_watermark_offsets(tp, cached=True)
            pos = consumer.position([tp])[0].offset
        except KafkaException:
            behind[f"{topic}[{number}]"] = (-1, -1)
            continue
        if pos < 0:  # nothing read since the assignment: where the member resumed
            pos = part.resumed_at if part.resumed_at is not None else low
        if high < 0 or pos < high:
            behind[f"{topic}[{number}]"] = (pos, high)
    return behind


class IdleClock:
    """Idle time of a run, counted once every partition is at its end."""

    def __init__(self, max_idle_s: float, max_wait_s: float | None, now: float) -> None:
        self.max_idle_s = max_idle_s
        self.max_wait_s = max_wait_s if max_wait_s is not None else default_max_wait_s(max_idle_s)
        self.idle_since = now  # when the run was last seen busy or short of an end
        self.waiting_since = now  # when a lagging partition last moved
        self._behind: Behind = {}

    def busy(self, now: float) -> None:
        """Records, commands, a batch or commit in flight: not idle."""
        self.idle_since = self.waiting_since = now
        self._behind = {}

    def over(self, now: float, behind: Behind) -> bool:
        """Whether the run may end: idle past ``max_idle_s`` with every partition
        at its end, or partitions stuck short of it past ``max_wait_s``."""
        if not behind:
            return now - self.idle_since > self.max_idle_s
        self.idle_since = now  # idle counts from the moment all are at their end
        if behind != self._behind:
            self._behind = behind
            self.waiting_since = now
            return False
        if now - self.waiting_since <= self.max_wait_s:
            return False
        log.warning(
            "max idle: ending the run although %s never reached its end "
            "(position/high watermark %s) in %.1f s without records",
            ", ".join(sorted(behind)),
            ", ".join(f"{p}/{h}" for _, (p, h) in sorted(behind.items())),
            now - self.waiting_since,
        )
        return True
