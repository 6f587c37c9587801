"""What a Kafka error means for the processor, in one line an operator can act on.

confluent-kafka's transaction error model: an error that is ``retriable()``
is retried, one that ``txn_requires_abort()`` aborts the transaction (the
batch is rewound and refolded), anything else is fatal.  On top of that,
authorization and authentication failures are never worth retrying: the
process exits at once with one line naming the missing permission or the
failed handshake, instead of aborting transactions in a loop (or idling
with a green ``/readyz``) until someone reads a raw librdkafka log line.

:class:`ClientProblems` is installed as every client's ``error_cb`` and
``logger``: librdkafka's log lines go through Python logging (logger
``processor.librdkafka``, quiet by default) and its global errors (SASL
failures, TLS handshakes, brokers down) are recorded where the run loop
looks for them.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from processor.core.errors import Unavailable, library_text
from processor.kafka.rejoin import UNRELEASED_TEXT
from processor.kafka.retry import GaveUp

log = logging.getLogger(__name__)
#: librdkafka's own log lines (syslog levels mapped to Python's); off by default
#: (``--kafka-log-level``): what matters of them also arrives through
#: ``error_cb`` and becomes the one clear line the process ends with.
LIBRDKAFKA_LOGGER = logging.getLogger("processor.librdkafka")
OFF = logging.CRITICAL + 10
LIBRDKAFKA_LOGGER.setLevel(OFF)

#: librdkafka error codes of a failed handshake (credentials, TLS, mechanism).
AUTHENTICATION_CODES = frozenset(
    {
        KafkaError._AUTHENTICATION,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError.ILLEGAL_SASL_STATE,
        KafkaError.UNSUPPORTED_SASL_MECHANISM,
        KafkaError._SSL,
    }
)
#: broker error code -> the resource kind whose ACL is missing.
AUTHORIZATION_CODES = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "Topic",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "Group",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "Cluster",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "TransactionalId",
}


class KafkaFatal(Unavailable, RuntimeError):
    """The process cannot go on; ``str()`` is the one line to print before exiting."""


class Kind(enum.Enum):
    RETRY = "retriable"
    ABORT = "abortable"
    FATAL = "fatal"
    DENIED = "denied"  # authorization or authentication: exit, retrying cannot help


@dataclass(frozen=True)
class Verdict:
    kind: Kind
    line: str
    code: int | None


def error_of(exc: BaseException) -> KafkaError | None:
    arg = exc.args[0] if exc.args else None
    return arg if isinstance(arg, KafkaError) else None


def is_denied(err: KafkaError) -> bool:
    return err.code() in AUTHORIZATION_CODES or err.code() in AUTHENTICATION_CODES


def denied_line(err: KafkaError, *, operation: str = "", resource: str = "") -> str:
    """One line naming the missing permission or the failed handshake."""
    code = err.code()
    if code == KafkaError._SSL:
        return (
            f"TLS handshake with the broker failed ({err.name()}): {err.str()}; check "
            "ssl.ca.location (the CA that signed the broker's certificate)"
        )
    if code in AUTHENTICATION_CODES:
        return (
            f"authentication with the broker failed ({err.name()}): {err.str()}; check "
            "the SASL credentials (--kafka-secret-file, PROCESSOR_X_SASL_PASSWORD)"
        )
    kind = AUTHORIZATION_CODES.get(code, "resource")
    what = f"{operation or 'access'} on {kind}" + (f" {resource!r}" if resource else "")
    detail = "" if resource else f": {err.str()}"
    return (
        f"not authorized: {what} is denied to this principal ({err.name()}{detail}); "
        "grant the ACLs listed in the README (Security)"
    )


def classify(exc: BaseException, *, operation: str = "", resource: str = "") -> Verdict:
    """Sort a transaction error by confluent-kafka's model (plus ``DENIED``)."""
    err = error_of(exc)
    if err is None:
        return Verdict(Kind.FATAL, library_text(exc), None)
    if is_denied(err):
        return Verdict(
            Kind.DENIED, denied_line(err, operation=operation, resource=resource), err.code()
        )
    text = f"{err.name()}: {err.str()}"
    if err.fatal():
        return Verdict(Kind.FATAL, f"fatal Kafka error {text}", err.code())
    if err.txn_requires_abort():
        return Verdict(Kind.ABORT, text, err.code())
    if err.retriable():
        return Verdict(Kind.RETRY, text, err.code())
    # Neither retriable nor abortable nor fatal (e.g. a timeout outside a
    # transaction, a produce error): abort the batch and refold it, which is
    # always safe; the failure tracker stops it from becoming a silent loop.
    return Verdict(Kind.ABORT, text, err.code())


#: Errors of a transaction's offsets that say the group changed under them
#: (the offsets named an older generation or member epoch).
GROUP_CHANGED = frozenset(
    {
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError.STALE_MEMBER_EPOCH,
        KafkaError.FENCED_MEMBER_EPOCH,
    }
)

#: How librdkafka names a producer's transaction coordinator connection in its
#: errors: ``TxnCoordinator: host:port: what failed``.
TXN_COORDINATOR = "TxnCoordinator"
#: Transaction coordinator errors this far apart are two troubles, not one.
TXN_TROUBLE_GAP_S = 20.0

#: Errors that say a broker is unreachable or went away.
BROKER_TROUBLE = frozenset(
    {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE}
)


def _named_broker(text: str) -> str:
    """``host:port`` of ``TxnCoordinator: host:port: what failed`` ("" if not there)."""
    parts = text.split(": ", 2)
    return parts[1] if len(parts) == 3 else ""


class ClientProblems:
    """Collects librdkafka's global errors for the run loop (``error_cb``/``logger``).

    A failed handshake is recorded as ``fatal`` at once; other global errors
    (brokers down, transport) are kept as ``last_error`` for ``/readyz``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.fatal: str | None = None
        self.last_error: str | None = None
        #: (topic, error) of the last record the producer failed to deliver
        self.delivery_failure: tuple[str, KafkaError] | None = None
        #: monotonic time librdkafka first said all brokers are down (cleared
        #: by ``BrokerWatch`` when one answers again)
        self.brokers_down_at: float | None = None
        #: monotonic time of the last transport-level error (a broker gone or
        #: restarting): a transactional fence soon after it is the cluster's,
        #: not another member's (runner._replace_producer)
        self.broker_trouble_at: float | None = None
        #: monotonic time of the last transport error of a producer's transaction
        #: coordinator connection: a transaction call waits for it legitimately
        #: until the controller moves it (stuck_probe.py's early judgement of a stuck call)
        self.txn_coordinator_trouble_at: float | None = None
        #: when that trouble began (its first error after a quiet spell), and
        #: the broker (``host:port``) its last error named
        self.txn_coordinator_trouble_since = 0.0
        self.txn_coordinator_lost = ""
        #: told each refusal of a static member's join (rejoin.py): the loop's report
        self.on_join_refused: Callable[[str], None] | None = None

    def join_refused(self, line: str) -> None:
        if self.on_join_refused is not None:
            self.on_join_refused(line)

    def error_cb(self, err: KafkaError, operation: str = "") -> None:
        with self._lock:
            if err.code() in AUTHENTICATION_CODES or err.code() in AUTHORIZATION_CODES:
                self.fatal = self.fatal or denied_line(err, operation=operation)
                log.debug("kafka: %s: %s", err.name(), err.str())
                return  # it becomes the one line the process ends with
            if err.fatal() and UNRELEASED_TEXT not in err.str():  # that one: rejoin.py
                self.fatal = self.fatal or f"fatal Kafka error {err.name()}: {err.str()}"
                return
            if err.code() == KafkaError._ALL_BROKERS_DOWN and self.brokers_down_at is None:
                self.brokers_down_at = time.monotonic()
            if err.code() in BROKER_TROUBLE:
                now = self.broker_trouble_at = time.monotonic()
                if err.str().startswith(TXN_COORDINATOR):
                    last = self.txn_coordinator_trouble_at
                    if last is None or now - last > TXN_TROUBLE_GAP_S:
                        self.txn_coordinator_trouble_since = now
                    self.txn_coordinator_trouble_at = now
                    self.txn_coordinator_lost = _named_broker(err.str())
            line = f"{err.name()}: {err.str()}"
            if line == self.last_error:
                return  # a broker that stays down reports every few seconds
            self.last_error = line
        log.warning("kafka: %s: %s", err.name(), err.str())

    def on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.delivery_failure = (msg.topic() or "?", err)

    def client_settings(self, operation: str = "") -> dict[str, Any]:
        """``operation``: what this client does (READ, WRITE), to name a denial."""

        def error_cb(err: KafkaError) -> None:
            self.error_cb(err, operation)

        return {"error_cb": error_cb, "logger": LIBRDKAFKA_LOGGER}

    def producer_settings(self) -> dict[str, Any]:
        """Delivery reports for failures only: which topic refused a record, at no
        cost per successful record."""
        return {
            **self.client_settings("WRITE"),
            "on_delivery": self.on_delivery,
            "delivery.report.only.error": True,
        }

    def take_delivery_failure(self) -> tuple[str, KafkaError] | None:
        failure, self.delivery_failure = self.delivery_failure, None
        return failure

    def raise_if_fatal(self) -> None:
        if self.fatal is not None:
            raise KafkaFatal(self.fatal)


def message_error(err: KafkaError, topic: str | None, group: str) -> KafkaFatal | None:
    """A consume error that stops the process (missing READ), else None."""
    if err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
        return KafkaFatal(denied_line(err, operation="READ", resource=group))
    if is_denied(err):
        return KafkaFatal(denied_line(err, operation="READ", resource=topic or ""))
    if err.fatal():
        return KafkaFatal(f"fatal Kafka error {err.name()}: {err.str()}")
    return None


def one_line(exc: BaseException) -> str:
    """The line ``processor run`` prints for an exception that ends it."""
    if isinstance(exc, KafkaFatal):
        return str(exc)
    if isinstance(exc, GaveUp):  # names the call and its topic[partition]
        return f"broker did not answer: {exc.line()}"
    if isinstance(exc, KafkaException):
        return classify(exc).line
    return library_text(exc).splitlines()[0]


def configure_librdkafka_logging(level: str | int = OFF) -> None:
    """librdkafka lines at ``level`` and above reach the handlers (``"OFF"``: none)."""
    LIBRDKAFKA_LOGGER.setLevel(OFF if level == "OFF" else level)


__all__ = [
    "AUTHENTICATION_CODES",
    "AUTHORIZATION_CODES",
    "ClientProblems",
    "KafkaFatal",
    "Kind",
    "Verdict",
    "classify",
    "configure_librdkafka_logging",
    "denied_line",
    "error_of",
    "message_error",
    "one_line",
]
