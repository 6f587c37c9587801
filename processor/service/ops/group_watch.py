"""``/readyz`` names another application's consumers holding events partitions.

A consumer of another application that joins the processor's group with an
assignor the processor speaks too (``cooperative-sticky``) is given events
partitions like any member.  Nothing refuses it (``join_refusal.py`` covers the
assignors that are refused), so every member reports ready, while the
partitions it holds are not folded; if it commits offsets, their events are
skipped for good (the seq gate then quarantines the sessions at the gap).

Members of the processor name themselves ``processor-<instance>`` in their
``client.id`` (``owners.py``).  The watch describes the group every
``every_s`` in a thread of its own (an admin call must not block the loop),
and while a member with another client id holds events partitions,
``/readyz`` names it (client id and partitions, a bounded list) and
``processor_group_foreign_members`` counts such members.  A description
that fails changes nothing: a broker that does not answer is
``broker_watch.py``'s to report.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from processor.kafka.owners import MEMBER_PREFIX

log = logging.getLogger(__name__)

#: How often the group is described (one admin call to the group coordinator).
WATCH_EVERY_S = 30.0
#: Members the /readyz line names; the rest are counted.
NAMED_AT_MOST = 5
#: Seconds after a broker's transport error in which the group is not described.
#: A request to the group coordinator whose broker goes away mid-request can
#: abort the process (librdkafka's admin coordinator request, ``eonce->refcnt >
#: 0`` failing; a member died so seconds after the group coordinator's broker
#: was SIGKILLed, issue 37); a broker fault's failover is over well within it.
QUIET_AFTER_TROUBLE_S = 30.0


class BrokerTrouble(Protocol):
    """What :func:`in_trouble` reads (``client_errors.ClientProblems``)."""

    brokers_down_at: float | None
    broker_trouble_at: float | None


def in_trouble(problems: BrokerTrouble, now: float | None = None) -> bool:
    """No broker answers, or one failed less than :data:`QUIET_AFTER_TROUBLE_S` ago."""
    at = problems.broker_trouble_at
    now = time.monotonic() if now is None else now
    return problems.brokers_down_at is not None or (
        at is not None and now - at < QUIET_AFTER_TROUBLE_S
    )


#: (client id, events partitions held) of one group member
Member = tuple[str, tuple[int, ...]]


def foreign_members(group: str, members: Sequence[Member]) -> tuple[int, str | None]:
    """How many members are not processors and hold events partitions, and the
    ``/readyz`` line naming them (None: none)."""
    foreign = [(cid, held) for cid, held in members if held and not cid.startswith(MEMBER_PREFIX)]
    if not foreign:
        return 0, None
    named = "; ".join(
        f"{cid or '(no client.id)'} holds events partitions {list(held)}"
        for cid, held in foreign[:NAMED_AT_MOST]
    )
    more = f"; and {len(foreign) - NAMED_AT_MOST} more" if len(foreign) > NAMED_AT_MOST else ""
    return len(foreign), (
        f"group {group!r} has {len(foreign)} member(s) of another application "
        f"({named}{more}): their partitions are not folded (give that application "
        "a group id of its own)"
    )


class GroupWatch:
    """Describes the group every ``every_s`` and reports foreign members."""

    def __init__(
        self,
        group: str,
        describe: Callable[[], Sequence[Member]],
        report: Callable[[int, str | None], None],
        every_s: float | None = None,
        paused: Callable[[], bool] = lambda: False,
    ) -> None:
        """``paused``: true while no broker answers or soon after a broker fault
        (:func:`in_trouble`); the watch then describes nothing (a description
        could not be answered, and a coordinator request failing as its
        connection drops is what aborts librdkafka)."""
        self.group = group
        self.describe = describe
        self.report = report
        self.every_s = WATCH_EVERY_S if every_s is None else every_s
        self.paused = paused
        self.line: str | None = None
        self._failed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="group-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ends the thread; a description in flight (at most its 15 s timeout) is not
        waited for past a moment, and reports nothing once it returns."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            if not self.paused():
                self.check()

    def check(self) -> None:
        """One description, and its report."""
        try:
            members = self.describe()
        except Exception as exc:  # the watch thread must outlive a broker fault
            if not self._failed:
                log.warning("describing group %r failed: %s (tried again)", self.group, exc)
            self._failed = True
            return
        self._failed = False
        if self._stop.is_set():
            return
        count, line = foreign_members(self.group, members)
        if line != self.line:
            if line is not None:
                log.error("%s", line)
            else:
                log.info("group %r: no member of another application holds partitions", self.group)
        self.line = line
        self.report(count, line)
