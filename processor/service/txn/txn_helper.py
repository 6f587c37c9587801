"""The commit's helper thread: one daemon thread running submitted steps in order.

Not a ``ThreadPoolExecutor``: its workers are joined at interpreter exit, so
a step stuck inside librdkafka for good (``send_offsets_to_transaction``
waiting for a group coordinator that went away, ``commit.py``) would keep the
process from ever exiting after it was given up.  A given-up helper is left
to its step; a new one takes the next.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, wait

from confluent_kafka import KafkaError, KafkaException

from processor.core.errors import Unavailable
from processor.kafka.retry import PERMANENT_FATAL

log = logging.getLogger(__name__)

_Item = tuple[Future[None], Callable[[], None]] | None


class Helper:
    """Runs steps one at a time on a daemon thread; each gets a ``Future``."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        #: when its step was given up (monotonic), and what it was: logged if it returns
        self.given_up: tuple[float, str] | None = None
        self._thread.start()

    def alive(self) -> bool:
        """Its thread still runs (a given-up helper: its step has not returned)."""
        return self._thread.is_alive()

    def submit(self, step: Callable[[], None]) -> Future[None]:
        future: Future[None] = Future()
        self._queue.put((future, step))
        return future

    def shutdown(self, *, wait: bool) -> None:
        """End after the steps already submitted (``wait``: until then)."""
        self._queue.put(None)
        if wait:
            self._thread.join()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            future, step = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                step()
            except BaseException as exc:  # handed to whoever waits for it
                future.set_exception(exc)
            else:
                future.set_result(None)
            if self.given_up is not None:
                at, what = self.given_up
                log.info("a given-up %s returned %.1f s later", what, time.monotonic() - at)


#: ``send_offsets_to_transaction``'s timeout.  It waits for the group
#: coordinator, which a killed broker holds until the controller notices it
#: (``broker.session.timeout.ms``, 9 s by default) and another broker loads
#: the group; a call that has not returned by then is stuck on the coordinator
#: that went away (librdkafka issues 5456, 5511) and a new producer gets the
#: new one at once.  At 30 s (+15 s grace), views of every partition of a
#: member stood still ~45 s after the group or transaction coordinator's
#: broker was killed (issue 37, tests/faults/test_failover.py).
OFFSETS_TIMEOUT_S = 10.0

#: How far past its own timeout a watched call (``send_offsets_to_transaction``)
#: is taken as stuck for good (:meth:`HelperThread.await_watched`): a call
#: that honours its timeout has returned by then.
HANG_GRACE_S = 2.0

#: How long a watched call runs before the caller's probe may judge it stuck
#: early (:meth:`HelperThread.await_watched`): a healthy
#: ``send_offsets_to_transaction`` takes two round trips, well under a second
#: on a loaded box (p99 20 ms in the failover runs' steady windows).  Every
#: second here is a second of every broker fault's worst wait: where one
#: broker held both coordinators, the retried call stuck on the group
#: coordinator it cached was judged 2.5-4.1 s in (at 2 s) and those windows'
#: max was 15.4-16.2 s.
EARLY_AFTER_S = 1.0

#: How often the probe is asked once ``EARLY_AFTER_S`` has passed (it wants
#: two answers of the consumer's coordinator in a row).
PROBE_EVERY_S = 0.25


class StuckCall(Unavailable, KafkaException):
    """A transaction call given up past its timeout (:meth:`HelperThread.await_watched`).

    A ``KafkaException`` so the commit's error handling classifies it as the
    fatal client error it carries; ``Unavailable`` so it keeps the one error root."""


class HelperThread:
    """The commit's helper, made on first use; given up (and replaced by the
    next use) when a watched call is stuck for good."""

    def __init__(self, name: str = "txn-helper") -> None:
        self.name = name
        self.hang_grace_s = HANG_GRACE_S
        self.early_after_s = EARLY_AFTER_S
        self._helper: Helper | None = None
        #: when the watched call running now should have returned by (None: none runs)
        self._due: float | None = None
        #: when the watched call running now began
        self._began = 0.0
        #: given-up helpers, until their step returns (:meth:`hanging`)
        self._given_up: list[Helper] = []

    def submit(self, step: Callable[[], None]) -> Future[None]:
        if self._helper is None:  # made on first use, ended by shutdown() with the loop
            self._helper = Helper(self.name)
        return self._helper.submit(step)

    def watch(self, timeout_s: float) -> None:
        """The call about to run on the helper should return within ``timeout_s``."""
        self._began = time.monotonic()
        self._due = self._began + timeout_s

    def unwatch(self) -> None:
        self._due = None

    def await_watched(
        self,
        sent: Future[None],
        what: str,
        stuck: Callable[[float], str | None] | None = None,
    ) -> None:
        """Wait for ``sent``; raise a fatal error if its watched call runs
        ``hang_grace_s`` past its own timeout, or ``early_after_s`` and
        ``stuck`` (given the call's start, asked every ``PROBE_EVERY_S`` from then on)
        says why it is stuck already (the helper is left to it)."""
        early = self.early_after_s
        while not sent.done():
            wait((sent,), timeout=min(1.0 if stuck is None else PROBE_EVERY_S, self.hang_grace_s))
            due, now = self._due, time.monotonic()
            if sent.done() or due is None:
                continue
            if now >= due + self.hang_grace_s:
                why = (
                    f"{self.hang_grace_s:.0f} s past its timeout (the group coordinator went away)"
                )
            elif (
                stuck is not None and now - self._began >= early and (reason := stuck(self._began))
            ):
                why = f"after {now - self._began:.1f} s: {reason}"
            else:
                continue
            helper, self._helper = self._helper, None
            if helper is not None:
                helper.given_up = (now, what)
                helper.shutdown(wait=False)
                # a new list (the ended ones pruned): a metrics scrape may be reading the old
                self._given_up = [h for h in self._given_up if h.alive()] + [helper]
            raise StuckCall(
                KafkaError(KafkaError._TIMED_OUT, f"{what} did not return {why}", fatal=True)
            )

    def hanging(self) -> int:
        """Given-up calls that have not returned yet (each holds a thread and
        the producer it was called on).  Read-only: the metrics thread asks too."""
        return sum(1 for h in self._given_up if h.alive())

    def shutdown(self) -> None:
        if self._helper is not None:
            self._helper.shutdown(wait=True)
            self._helper = None


class HangingBudget:
    """How many given-up calls may hang at once before the process ends.

    Each stuck call replaced leaves its thread and its producer behind until
    librdkafka lets it return (when the brokers' states change again: the
    killed broker back, ~10-20 s later).  Bounding what hangs, not how many
    were replaced, bounds what they hold and lets a member ride out a broker
    fault every 30 s: a bound of three replacements per five minutes, never
    given back, ended all three members of a lab run on the fourth such
    fault.  ``limit`` hanging at once are allowed; one more ends the process
    (a cause that stays, not a broker fault)."""

    def __init__(self, helper: HelperThread, limit: int = 3) -> None:
        self.helper = helper
        self.limit = limit

    def allow(self, err: KafkaError) -> bool:
        """A replacement for the call just given up (counted among the hanging)."""
        return err.code() not in PERMANENT_FATAL and self.helper.hanging() <= self.limit

    def spare(self) -> bool:
        """Room for a call given up on a guess and still one given up for good."""
        return self.helper.hanging() < self.limit - 1
