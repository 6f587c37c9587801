"""Retrying the Kafka calls of the restore and close paths through broker faults.

A broker restart, a leader election or a coordinator moving make admin and
consumer calls fail for seconds with errors that go away by themselves
(``_TRANSPORT``, ``_DESTROY_BROKER``, ``_TIMED_OUT``, leader not available,
coordinator loading, unstable offsets ...).  A member that died of one of
those would turn a broker's restart into the whole group's outage, so every
such call retries with backoff until a deadline; only a permanent error (or
the deadline) reaches the caller.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

from confluent_kafka import KafkaError, KafkaException

from processor.core.errors import Unavailable

log = logging.getLogger(__name__)
#: Set once the process is stopping (``processor run``'s signal handler,
#: service/loop/stopping.py): retries give up at once instead of riding out
#: their deadline for brokers that may never answer.
STOPPING = threading.Event()

T = TypeVar("T")

#: Error codes that a later attempt can succeed past (besides ``retriable()``).
TRANSIENT_CODES = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._DESTROY_BROKER,
        KafkaError._TIMED_OUT,
        KafkaError._TIMED_OUT_QUEUE,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._WAIT_COORD,
        KafkaError._MSG_TIMED_OUT,
        KafkaError._RESOLVE,
        KafkaError._NODE_UPDATE,
        KafkaError._WAIT_CACHE,
        KafkaError._RETRY,
        KafkaError._OUTDATED,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._PARTIAL,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.UNSTABLE_OFFSET_COMMIT,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.KAFKA_STORAGE_ERROR,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError.CONCURRENT_TRANSACTIONS,
    }
)

#: How long the restore and close paths ride out a broker fault by default.
DEFAULT_DEADLINE_S = 120.0


def kafka_error(exc: BaseException) -> KafkaError | None:
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return err if isinstance(err, KafkaError) else None


def is_transient(exc: BaseException) -> bool:
    """True for a Kafka error that may go away on its own (never for a fatal one)."""
    err = kafka_error(exc)
    if err is None:
        return False
    if err.fatal():
        return False
    return bool(err.retriable()) or err.code() in TRANSIENT_CODES


class GaveUp(Unavailable, KafkaException):
    """A transient error that outlasted the retry's deadline.

    A ``KafkaException`` carrying the last error (callers that classify it
    still can); ``what`` names the call (topic[partition]) for the one line
    that reports it."""

    what: str = ""
    waited_s: float = 0.0

    def line(self) -> str:
        err = kafka_error(self)
        cause = f"{err.name()}: {err.str()}" if err is not None else str(self)
        return f"{self.what}: {cause} for {self.waited_s:.0f} s"


class RetryWatch:
    """The retries and waits in progress of the threads that observe it (:func:`observing`).

    Each retried attempt is counted by call and error code (``count``, the
    metric) and the oldest call still failing is what ``/readyz`` names while
    it waits: a restore riding out a broker restart inside a rebalance callback
    blocks the loop, and without this nothing said what it waited for.  A wait
    that is no retry but blocks the loop the same way (:func:`waiting`: the
    restore's committed offsets behind its checkpoints) is named too, from its
    start (:meth:`waits`).
    """

    def __init__(
        self,
        count: Callable[[str, str], object] = lambda call, code: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._count = count
        self.clock = clock
        self._lock = threading.Lock()
        self._open: dict[int, tuple[float, str]] = {}  # token -> (since, line)
        self._waits: dict[int, tuple[float, str]] = {}  # token -> (since, line)

    def retried(
        self, token: int, since: float, what: str, err: KafkaError | None, attempt: int
    ) -> None:
        code = err.name() if err is not None else "unknown"
        self._count(call_label(what), code)
        detail = f"{code}: {err.str()}" if err is not None else code
        with self._lock:
            self._open[token] = (since, f"{what}: {detail} (attempt {attempt})")

    def began(self, token: int, since: float, line: str) -> None:
        """A wait of an observed thread began (:func:`waiting`)."""
        with self._lock:
            self._waits[token] = (since, line)

    def ended(self, token: int) -> None:
        with self._lock:
            self._open.pop(token, None)
            self._waits.pop(token, None)

    def waits(self) -> list[tuple[float, str]]:
        """``(seconds waited, line)`` of every wait in progress, the longest first."""
        with self._lock:
            started = sorted(self._waits.values())
        now = self.clock()
        return [(now - since, line) for since, line in started]

    def oldest(self) -> tuple[float, str] | None:
        """``(seconds failing, line)`` of the oldest call being retried, or None."""
        with self._lock:
            if not self._open:
                return None
            since, line = min(self._open.values())
        return self.clock() - since, line


_local = threading.local()
_tokens = itertools.count(1)


@contextlib.contextmanager
def observing(watch: RetryWatch, deadline_s: float | None = None) -> Iterator[None]:
    """Report the retries of this thread to ``watch`` while the block runs.

    ``deadline_s``: the deadline of the block's retries that name none (the
    service's ``restore_deadline_s``: the restore's calls, however deep, ride
    out a broker fault that long before the restore is put off)."""
    before = getattr(_local, "watch", None), getattr(_local, "deadline_s", None)
    _local.watch = watch
    if deadline_s is not None:
        _local.deadline_s = deadline_s
    try:
        yield
    finally:
        _local.watch, _local.deadline_s = before


def default_deadline() -> float:
    """The deadline of a retry that names none: the observing block's, else the default."""
    deadline_s: float | None = getattr(_local, "deadline_s", None)
    return DEFAULT_DEADLINE_S if deadline_s is None else deadline_s


@contextlib.contextmanager
def waiting(line: str) -> Iterator[None]:
    """Name this thread's wait (``line``: what it waits for) on the :class:`RetryWatch`
    observing it, if one does, while the block runs."""
    watch: RetryWatch | None = getattr(_local, "watch", None)
    if watch is None:
        yield
        return
    token = next(_tokens)
    watch.began(token, watch.clock(), line)
    try:
        yield
    finally:
        watch.ended(token)


def call_label(what: str) -> str:
    """``what`` without its partitions and offsets: a bounded metric label."""
    # a number standing alone (offsets, "start..end"), never one inside a topic name
    bare = re.sub(r"\[[^\]]*\]|(?<![\w.-])\d+(\.\.\d+)?(?![\w.-])", "", what)
    return re.sub(r"\s+", " ", bare).strip()


def retry(
    call: Callable[[], T],
    what: str,
    *,
    deadline_s: float | None = None,
    first_delay: float = 0.1,
    max_delay: float = 2.0,
) -> T:
    """``call()`` until it succeeds, retrying transient Kafka errors until ``deadline_s``
    (None: :func:`default_deadline`).

    Raises a permanent error as it is, a transient one that outlasted the
    deadline as :class:`GaveUp`.  Each retry is reported to the thread's
    :class:`RetryWatch`, if one observes it.
    """
    watch: RetryWatch | None = getattr(_local, "watch", None)
    clock = watch.clock if watch is not None else time.monotonic
    started = clock()
    deadline = started + (default_deadline() if deadline_s is None else deadline_s)
    delay = first_delay
    attempt = 0
    token = next(_tokens)
    try:
        while True:
            try:
                return call()
            except KafkaException as exc:
                attempt += 1
                if not is_transient(exc):
                    raise
                if clock() + delay > deadline or STOPPING.is_set():  # a stop waits for no broker
                    if isinstance(exc, GaveUp):
                        raise  # an inner retry's: it names the call already
                    gave_up = GaveUp(*exc.args)
                    gave_up.what, gave_up.waited_s = what, clock() - started
                    raise gave_up from exc
                if watch is not None:
                    watch.retried(token, started, what, kafka_error(exc), attempt)
                level = logging.INFO if attempt < 3 else logging.WARNING
                log.log(level, "%s: %s; retrying (attempt %d)", what, exc, attempt)
                time.sleep(delay)
                delay = min(delay * 2, max_delay)
    finally:
        if watch is not None and attempt:
            watch.ended(token)


def run_all(steps: Sequence[tuple[str, Callable[[], Any] | None]]) -> None:
    """Run every step whatever the ones before raised (a close path: a broker
    restarting makes ``close()`` fail with ``_TIMED_OUT``, which must not turn
    a clean shutdown into a crash or leave the other clients open)."""
    for what, step in steps:
        if step is None:
            continue
        try:
            step()
        except Exception as exc:
            log.warning("%s: %s", what, exc)


#: Fatal errors that a new client cannot fix: the process must end with them.
PERMANENT_FATAL = frozenset(
    {
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError._AUTHENTICATION,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError.UNSUPPORTED_VERSION,
        KafkaError._UNSUPPORTED_FEATURE,
    }
)


#: A fenced producer: a newer producer took its transactional id.  That is
#: another live member with the same instance id — replacing the producer
#: would fence it back, and the two would take turns until both budgets are
#: spent — unless the transaction was open longer than the transaction
#: timeout, when the coordinator's own abort explains the fence (a member
#: paused past the timeout) and a new producer is the cure.
FENCED = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED})


class ReplacementBudget(Protocol):
    """Whether a fatal client error may be answered by a new client."""

    def allow(self, err: KafkaError) -> bool:
        """This replacement may happen (and is counted)."""
        ...

    def spare(self) -> bool:
        """Room for a replacement on a guess, keeping one for a certain cause."""
        ...


class FatalBudget:
    """How often a fatal client error may be answered by a new client.

    At most ``limit`` replacements within ``window_s`` without a transaction
    committing in between (:meth:`succeeded`): enough to ride out a broker
    restart, never a loop around a cause that stays.
    """

    def __init__(self, limit: int = 3, window_s: float = 300.0) -> None:
        self.limit = limit
        self.window_s = window_s
        self._used: list[float] = []

    def allow(self, err: KafkaError) -> bool:
        if err.code() in PERMANENT_FATAL:
            return False
        now = time.monotonic()
        self._used = [t for t in self._used if now - t < self.window_s]
        if len(self._used) >= self.limit:
            return False
        self._used.append(now)
        return True

    def spare(self) -> bool:
        """Room for a replacement beyond the last one (:meth:`allow` keeps that
        for a cause that leaves no choice; a guess may take only the spare)."""
        now = time.monotonic()
        return sum(1 for t in self._used if now - t < self.window_s) < self.limit - 1

    def succeeded(self) -> None:
        """A transaction committed: the cause did not stay, what was spent is back.

        Without it a coordinator failover storm (its broker killed every ~20 s
        for minutes, each failover breaking the transaction in flight) ended
        every member on its fourth replacement, though each committed between.
        """
        self._used.clear()
