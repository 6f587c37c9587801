"""The progress watchdog: an assigned partition with lag whose position never moves.

Seen once in the fault suite (compiled build): after an aborted transaction's
rewind a member logged "resuming at committed offset 1926" for partition 0
and then fetched nothing for 300 s, while the partition had 435 events of
lag, the loop ticked (``/healthz`` 200) and ``/readyz`` said ready.  The
product rule: no fault may leave ``/readyz`` green while nothing moves.

The loop hands the watch, every ``GAUGE_EVERY_S``, the position and high
watermark of each partition it folds (restored, not filling: a filling
partition is paused on purpose).  A partition whose position has not moved
for ``stall_s`` while it has lag is stalled: counted, logged once, and sought
again at its position (a seek restarts the client's fetch of that partition
and can never refold what the open batch already holds).  Each seek gets
another ``stall_s``; when ``stall_reseeks`` of them did not help, ``/readyz``
names the partition (an orchestrator restarts the member, the group moves
the partition) until it moves again.

The stall seen had another cause, found at stop 28 (``commit.py``,
``Committer._await_offsets``): the loop itself was waiting on a
``send_offsets_to_transaction`` that librdkafka 2.16 left waiting for good
after the group coordinator's broker was killed (librdkafka issues 5456,
5511); the committed offset was the rewind's because the first transaction
after it hung.  This watch cannot see that (it runs in the loop's tick); it
stays for a fetch that stops while the loop runs (e.g. librdkafka issue 4492,
a partition left in ``validate-epoch-wait``), not seen so far.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from confluent_kafka import KafkaException

from processor.telemetry.metrics import Metrics

log = logging.getLogger(__name__)


@dataclass
class _Track:
    position: int
    seen_at: float  # the last look
    #: time with lag at this position, each gap between looks counted at most
    #: ``stall_s / 4``: a loop blocked elsewhere (a restore, a retry) could not
    #: have moved it, and its first look after must not call that a stall
    idle: float = 0.0
    reseeks: int = 0
    stalled: bool = False  # counted and logged (once per episode)
    reported: bool = False  # named on /readyz


class ProgressWatch:
    """Per watched partition: has its position moved while it had lag?"""

    def __init__(
        self,
        metrics: Metrics,
        seek: Callable[[int, int], None],
        *,
        stall_s: float,
        reseeks: int,
    ) -> None:
        self.metrics = metrics
        self.health = metrics.health
        self._seek = seek  # (partition, offset): the group consumer's seek
        self.stall_s = stall_s
        self.reseeks = reseeks
        self._tracks: dict[int, _Track] = {}

    def check(self, seen: Mapping[int, tuple[int, int]]) -> None:
        """``seen``: each watched partition's (position, high watermark); a partition
        left out (revoked, filling, position unknown) starts afresh when it returns."""
        now = time.monotonic()
        for number in [n for n in self._tracks if n not in seen]:
            self._end(number, "left the watch")
        for number, (position, high) in seen.items():
            track = self._tracks.get(number)
            if high <= position:  # nothing to read
                self._end(number, "caught up")
                continue
            if track is None or position != track.position:
                self._end(number, f"moves again at offset {position}")
                self._tracks[number] = _Track(position, now)
                continue
            track.idle += min(now - track.seen_at, self.stall_s / 4)
            track.seen_at = now
            if track.idle >= self.stall_s * (track.reseeks + 1):
                self._stalled(number, track, high - position)
        self._report()

    def _stalled(self, number: int, track: _Track, lag: int) -> None:
        """Count and log the episode, seek again within the bound, then report."""
        if not track.stalled:
            track.stalled = True
            self.metrics.partition_stalls.labels(str(number)).inc()
            log.warning(
                "partition %d stalled: position %d, lag %d, not moved for %.0f s",
                number,
                track.position,
                lag,
                track.idle,
            )
        if track.reseeks < self.reseeks:
            track.reseeks += 1
            self.metrics.stall_reseeks.inc()
            log.warning(
                "partition %d: seeking to offset %d again (%d of %d)",
                number,
                track.position,
                track.reseeks,
                self.reseeks,
            )
            try:
                self._seek(number, track.position)
            except KafkaException as exc:  # the next look tries again
                log.warning("partition %d: seek failed (%s)", number, exc)
        elif not track.reported:
            track.reported = True
            log.error(
                "partition %d stalled at offset %d (lag %d) for %.0f s after %d seeks: "
                "reported on /readyz",
                number,
                track.position,
                lag,
                track.idle,
                self.reseeks,
            )

    def _end(self, number: int, why: str) -> None:
        """The partition moved, lost its lag or left the watch."""
        track = self._tracks.pop(number, None)
        if track is not None and track.stalled:
            log.warning(
                "partition %d %s after %.0f s stalled at offset %d",
                number,
                why,
                track.idle,
                track.position,
            )

    def _report(self) -> None:
        stalled = {n: t for n, t in self._tracks.items() if t.stalled}
        self.metrics.partitions_stalled.set(len(stalled))
        reported = sorted(n for n, t in stalled.items() if t.reported)
        cause = None
        if reported:
            first = self._tracks[reported[0]]
            cause = (
                f"partition {reported[0]} stalled at offset {first.position} for {first.idle:.0f}s"
            )
            if len(reported) > 1:
                cause += f" (and {len(reported) - 1} more partitions)"
        self.health.stalled = cause
