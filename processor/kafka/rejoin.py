"""A static member refused for an instance id still in use waits and rejoins.

Under KIP-848 a member joining with ``group.instance.id`` while the group
still holds a member of that id that never left (a process killed with -9,
its session not yet timed out) is refused with UNRELEASED_INSTANCE_ID, which
librdkafka makes a fatal error of the consumer: the process used to exit,
and under a supervisor came back only to be refused again until the old
session ended.  Here the member closes the dead consumer, waits a bounded
backoff and joins again with a new one, until the broker ends the old
session (its ``group.consumer.session.timeout.ms``, seconds) and takes it.
A member that left on SIGTERM (a static leave, epoch -2) is taken back at
once, with its partitions.  Each refusal is reported (``on_refused``: the
log line, a counter, ``/readyz``); refusals going on past
:data:`LOUD_AFTER_S` say another live process may run with this id.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError

log = logging.getLogger(__name__)

#: The broker's text of the error, inside librdkafka's fatal error's text
UNRELEASED_TEXT = KafkaError(KafkaError.UNRELEASED_INSTANCE_ID).str()
#: The waits between joins: short first (the old session may be ending), then
#: at most this, well under the broker's minimum session timeout range.
BACKOFF_S = (0.5, 1.0, 2.0)
#: Refused this long: likely not a dead process's session but a live process
#: with the same instance id; said once at ERROR (the member keeps trying).
LOUD_AFTER_S = 60.0


def unreleased(err: KafkaError) -> bool:
    """The fatal error librdkafka makes of UNRELEASED_INSTANCE_ID."""
    return err.code() == KafkaError._FATAL and UNRELEASED_TEXT in err.str()


class RejoiningConsumer:
    """A group consumer (``transport.GroupConsumer``) that replaces its
    librdkafka consumer when the broker refuses its static instance id.

    ``make``: a new, unsubscribed consumer; ``on_refused``: called with the
    ``/readyz`` line at each refusal.  Every other call goes to the current
    consumer."""

    def __init__(
        self, make: Callable[[], Any], group: str, on_refused: Callable[[str], None]
    ) -> None:
        self._make = make
        self._group = group
        self._on_refused = on_refused
        self._inner = make()
        self._subscription: tuple[list[str], dict[str, Any]] | None = None
        #: monotonic time of the next join while refused (None: joined or joining)
        self._rejoin_at: float | None = None
        self._refused_since: float | None = None
        self._refusals = 0
        self._loud = False

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        self._subscription = (list(topics), callbacks)
        self._inner.subscribe(topics, **callbacks)

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        if self._rejoin_at is not None:
            wait = self._rejoin_at - time.monotonic()
            if wait > 0:  # (a negative timeout: block, here until the next join)
                time.sleep(wait if timeout < 0 else min(wait, timeout))
                return []
            self._join_again()
        msgs: list[Any] = self._inner.consume(num_messages=num_messages, timeout=timeout)
        if msgs and any(m.error() is not None and unreleased(m.error()) for m in msgs):
            self._refused()
            return [m for m in msgs if m.error() is None or not unreleased(m.error())]
        if self._refused_since is not None and self._inner.assignment():
            log.info(
                "group %r took this member back after %d refusals",
                self._group,
                self._refusals,
            )
            self._refused_since, self._refusals, self._loud = None, 0, False
        return msgs

    def _refused(self) -> None:
        now = time.monotonic()
        if self._refused_since is None:
            self._refused_since = now
        self._refusals += 1
        wait = BACKOFF_S[min(self._refusals, len(BACKOFF_S)) - 1]
        line = (
            f"group {self._group!r} refuses this member: UNRELEASED_INSTANCE_ID (a member "
            f"with this instance id has not left; its session must time out); joining "
            f"again in {wait:.1f} s (refusal {self._refusals})"
        )
        if not self._loud and now - self._refused_since >= LOUD_AFTER_S:
            self._loud = True
            log.error(
                "%s; refused for %.0f s: another live process may run with this instance id",
                line,
                now - self._refused_since,
            )
        elif self._refusals == 1:
            log.warning("%s", line)
        self._on_refused(line)
        # the fatal consumer is closed at once; a new one answers the calls
        # made while waiting (metadata probes, close)
        old, self._inner = self._inner, self._make()
        old.close()
        self._rejoin_at = now + wait

    def _join_again(self) -> None:
        self._rejoin_at = None
        if self._subscription is not None:
            topics, callbacks = self._subscription
            self._inner.subscribe(topics, **callbacks)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
