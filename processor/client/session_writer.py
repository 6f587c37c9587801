"""``SessionWriter``: the validated append path for Python agents.

An agent that writes its session log to Kafka through this class gets the
same judgement the processor will apply, *before* anything leaves the
process:

1. **validate** — the event is built with the next seq and planned against
   the writer's own core :class:`~processor.core.session.Session`
   (``session.validate``: envelope E-*, data checks D-*, surface planning
   S-*).  A :class:`~processor.core.errors.SessionError` is raised here and
   nothing is produced;
2. **produce** — the event is encoded as an Avro ``SessionEvent`` and sent
   with an idempotent producer (``acks=all``), key = session id, partitioned
   with the Java client's murmur2 (``murmur2_random``) so producers in any
   language put one session on one partition;
3. **commit** — only when the broker acknowledged the record is the event
   appended to the local session (reusing the staged plan, S-9).

So the local session never runs ahead of the log: if delivery fails a
:class:`DeliveryError` carrying the exact event is raised and the session is
unchanged.  Retrying *that same event* (``append_event(sid, err.event)``) is
always safe — if the first attempt did reach the broker after all, the
processor's seq gate drops the second copy as an exact duplicate (same
digest).  Building a *new* event for the same seq instead would be a
conflicting duplicate and quarantine the session.

Appends are synchronous (one broker round trip each): the next event is
planned against a surface that includes the previous one, and the core
stages one plan at a time.  Bulk loading of existing logs goes through
``processor ingest``, which validates a whole file offline and then produces
it asynchronously.

The writer is a convenience, not a gate: agent sessions may be written by any
other producer (another language, ``processor ingest --raw``, a replayed
file).  The processor validates every event again and dead-letters what this
class would have refused.

One writer may be shared by threads: a lock serialises the
validate → produce → commit sequence.  A session the writer did not start
(e.g. resumed from its session file) is handed over with :meth:`attach`; the
writer then assumes its events up to ``last_seq`` are already in the topic.
"""

from __future__ import annotations

import threading
import time as _time
from collections.abc import Callable, Mapping
from importlib import metadata
from types import TracebackType
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from processor.codec import Codec, default_codec, session_key
from processor.config import ServiceConfig
from processor.core.defaults import new_session
from processor.core.errors import Unavailable
from processor.core.events import ABSENT, Event, make_event
from processor.core.session import Session, synthetic_header
from processor.kafka import clients
from processor.kafka.client_errors import ClientProblems
from processor.kafka.schema_registry import codec_for
from processor.service.loop.control import redrive

__all__ = ["DEFAULT_DELIVERY_TIMEOUT_MS", "DeliveryError", "SessionWriter", "producer_name"]

#: How long librdkafka may try to deliver one event before the writer gives
#: up (``message.timeout.ms``; an explicit ``-X message.timeout.ms`` wins).
DEFAULT_DELIVERY_TIMEOUT_MS = 30_000


def producer_name(component: str = "SessionWriter") -> str:
    """The ``producer`` field written into events (schema v2), e.g. for DLQ triage."""
    try:
        version = metadata.version("processor")
    except metadata.PackageNotFoundError:
        version = "0"
    return f"processor.{component}/{version}"


class DeliveryError(Unavailable, RuntimeError):
    """The broker did not acknowledge a record; the local session is unchanged.

    ``event`` is the exact event that was sent (``None`` for a control
    record): retry with ``append_event(session_id, err.event)``.
    """

    def __init__(self, session_id: str, event: Event | None, error: KafkaError | str) -> None:
        self.session_id = session_id
        self.event = event
        self.error = error
        what = f"seq {event.seq}" if event is not None else "control record"
        super().__init__(f"session {session_id}: {what} was not delivered: {error}")


def _default_session(session_id: str) -> Session:
    """A session folded with the processor's registries, so the writer's
    verdicts (and its projections, for the agent to read) match the service."""
    return new_session(synthetic_header(session_id))


class SessionWriter:
    """Validated, acknowledged appends of agent sessions to the events topic.

    ``target`` is a :class:`ServiceConfig` (the writer creates and owns an
    :func:`~processor.kafka.clients.event_producer` for
    ``config.topics.events``) or a ready ``Producer`` — then ``topic`` is
    required, and the producer should be idempotent with the
    ``murmur2_random`` partitioner; the caller keeps ownership of it.
    ``session_factory`` makes the session of an id seen for the first time.
    """

    def __init__(
        self,
        target: ServiceConfig | Producer,
        codec: Codec | None = None,
        *,
        topic: str | None = None,
        session_factory: Callable[[str], Session] | None = None,
        sessions: Mapping[str, Session] | None = None,
        clock: Callable[[], int] | None = None,
        client_id: str = "processor-writer",
    ) -> None:
        #: a failed handshake or a denied WRITE, reported by librdkafka at once
        self.problems = ClientProblems()
        if isinstance(target, ServiceConfig):
            kafka = dict(target.kafka)
            kafka.setdefault("message.timeout.ms", str(DEFAULT_DELIVERY_TIMEOUT_MS))
            self._producer = clients.event_producer(
                target.with_overrides(kafka=kafka), client_id, self.problems
            )
            self._owns_producer = True
            self.topic = topic or target.topics.events
            self.control_topic = target.topics.control
        else:
            if topic is None:
                raise ValueError("SessionWriter(producer) needs topic= (the events topic)")
            self._producer = target
            self._owns_producer = False
            self.topic = topic
            prefix, dot, last = topic.rpartition(".")
            self.control_topic = f"{prefix}.control" if dot and last == "events" else ""
        self.codec = codec or (
            codec_for(target, writer=True) if isinstance(target, ServiceConfig) else default_codec()
        )
        self._factory = session_factory or _default_session
        self._sessions: dict[str, Session] = dict(sessions or {})
        self._clock = clock or (lambda: int(_time.time() * 1000))
        self._lock = threading.RLock()
        self._producer_name = producer_name()
        self._closed = False
        self._refused = False

    # ------------------------------------------------------------ sessions

    def session(self, session_id: str) -> Session:
        """The writer's session of ``session_id`` (created empty on first use).

        Read it freely (``derive_messages()``, ``projections``...) to build the
        agent's next request; write to it only through this writer.
        """
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                session = self._sessions[session_id] = self._factory(session_id)
            return session

    def attach(self, session_id: str, session: Session) -> None:
        """Continue ``session`` (events ``0..last_seq`` already in the topic)."""
        with self._lock:
            if session_id in self._sessions and self._sessions[session_id] is not session:
                raise ValueError(f"session {session_id} is already held by this writer")
            self._sessions[session_id] = session

    def forget(self, session_id: str) -> Session | None:
        """Release a finished session's memory; returns it (or None)."""
        with self._lock:
            return self._sessions.pop(session_id, None)

    @property
    def session_ids(self) -> list[str]:
        with self._lock:
            return list(self._sessions)

    # ------------------------------------------------------------ writing

    def append(
        self,
        session_id: str,
        etype: str,
        data: Any,
        *,
        surface_op: Any = ABSENT,
        source_event_seqs: Any = ABSENT,
        ignorable: bool | None = None,
        time: int | None = None,
    ) -> Event:
        """Build the next event of ``session_id`` (next seq, ``time`` or now) and
        append it; see :meth:`append_event`."""
        with self._lock:
            session = self.session(session_id)
            event = make_event(
                etype,
                session.next_seq,
                data,
                time=self._clock() if time is None else time,
                surface_op=surface_op,
                source_event_seqs=source_event_seqs,
                ignorable=ignorable,
            )
            return self.append_event(session_id, event)

    def append_event(self, session_id: str, event: Event) -> Event:
        """Validate, produce and — once acknowledged — commit a prebuilt event.

        Raises ``SessionError`` (nothing produced), ``CodecError`` (a value
        Avro cannot carry; nothing produced) or :class:`DeliveryError`
        (produced but not acknowledged; session unchanged).
        """
        with self._lock:
            self._check_open()
            session = self.session(session_id)
            session.validate(event)
            value = self.codec.encode_parsed_event(session_id, event, producer=self._producer_name)
            self._deliver(session_id, event, value, None)
            session.append(event)
            return event

    def redrive(self, session_id: str, seq: int) -> None:
        """Ask the processor to lift the quarantine ``session_id`` took at ``seq``.

        The command goes to the control topic (``control.py``), which only
        operators may write: this needs WRITE on ``<prefix>.control``.
        ``seq`` is the quarantine's seq (the ``status`` view's
        ``quarantine.seq``); the command is idempotent and independent of
        its order against the events.
        """
        if not self.control_topic:
            raise ValueError(f"no control topic known for events topic {self.topic!r}")
        with self._lock:
            self._check_open()
            self._deliver(
                session_id, None, redrive(session_id, seq).encode(), None, topic=self.control_topic
            )

    def _deliver(
        self,
        session_id: str,
        event: Event | None,
        value: bytes | None,
        headers: list[tuple[str, str | bytes | None]] | None,
        *,
        topic: str | None = None,
    ) -> None:
        """Produce one record and wait for its delivery report."""
        outcome: list[KafkaError | None] = []

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            outcome.append(err)

        producer = self._producer
        try:
            clients.produce(
                producer,
                topic or self.topic,
                session_key(session_id),
                value,
                headers=headers,
                on_delivery=on_delivery,
            )
        except KafkaException as exc:
            raise DeliveryError(session_id, event, exc.args[0] if exc.args else str(exc)) from exc
        # flush() sends at once (ignores linger.ms) and serves the callback;
        # librdkafka always reports by message.timeout.ms, so this ends.
        while not outcome:
            producer.flush(1.0)
            if not outcome and self.problems.fatal is not None:
                # a wrong password or untrusted CA: say so now, not at message.timeout.ms
                # (cleared: a retry after the cause is fixed must not fail on it)
                cause, self.problems.fatal = self.problems.fatal, None
                self._refused = True
                raise DeliveryError(session_id, event, cause)
        if outcome[0] is not None:
            raise DeliveryError(session_id, event, outcome[0])

    # ------------------------------------------------------------ lifecycle

    def flush(self, timeout: float = 30.0) -> int:
        """Wait for outstanding deliveries; returns how many are still queued."""
        return int(self._producer.flush(timeout))

    def close(self, timeout: float = 30.0) -> None:
        """Flush and stop accepting appends (the sessions stay readable)."""
        if self._closed:
            return
        self._closed = True
        # appends are synchronous: only a shared producer's records are queued,
        # or one a broker that refused the handshake will never take
        self.flush(0 if self._refused else timeout)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("SessionWriter is closed")

    def __enter__(self) -> SessionWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
