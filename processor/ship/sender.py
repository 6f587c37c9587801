"""The producer side: events to ``<prefix>.events`` keyed by session id.

The same idempotent, murmur2-partitioned producer and Avro record as
``processor ingest``.  Records are delivered without a timeout
(``message.timeout.ms=0``): while the broker is away the in-flight bound
stops reading, and nothing is ever reported failed and then sent out of
order.  A delivery error (a record the broker refuses) is fatal: positions
stay at what was acknowledged, and a restart resumes there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from processor.client.session_writer import producer_name
from processor.codec import Codec, session_key
from processor.config import ServiceConfig
from processor.core.errors import InvalidInput
from processor.core.events import Event
from processor.kafka import clients
from processor.kafka.client_errors import ClientProblems
from processor.kafka.schema_registry import codec_for

#: called with None when acknowledged, else the error text
OnAck = Callable[[str | None], None]


class TooLarge(InvalidInput):
    """A record over message.max.bytes: refused before producing."""


class Sink(Protocol):
    inflight_bytes: int

    @property
    def fatal(self) -> str | None: ...

    def send(self, session_id: str, event: Event, on_ack: OnAck) -> int: ...

    def poll(self, timeout: float) -> None: ...

    def flush(self, timeout: float) -> int: ...


class KafkaSink:
    def __init__(self, config: ServiceConfig, client_id: str = "processor-ship") -> None:
        kafka = dict(config.kafka)
        kafka.setdefault("message.timeout.ms", "0")
        config = config.with_overrides(kafka=kafka)
        self.problems = ClientProblems()
        self.producer: Producer = clients.event_producer(config, client_id, self.problems)
        self.codec: Codec = codec_for(config, writer=True)
        self.topic = config.topics.events
        self.max_bytes = int(config.kafka.get("message.max.bytes", 1_000_000))
        self.name = producer_name("ship")
        self.inflight_bytes = 0
        self._fatal: str | None = None

    @property
    def fatal(self) -> str | None:
        return self._fatal or self.problems.fatal

    def send(self, session_id: str, event: Event, on_ack: OnAck) -> int:
        value = self.codec.encode_parsed_event(session_id, event, producer=self.name)
        size = len(value)
        if size > self.max_bytes:
            raise TooLarge(
                f"seq {event.seq}: record of {size:,} bytes exceeds message.max.bytes "
                f"({self.max_bytes:,})"
            )

        def delivered(err: KafkaError | None, _msg: Message) -> None:
            self.inflight_bytes -= size
            if err is not None and self._fatal is None:
                self._fatal = f"seq {event.seq} of session {session_id} not delivered: {err}"
            on_ack(None if err is None else str(err))

        while True:
            try:
                clients.produce(
                    self.producer, self.topic, session_key(session_id), value, on_delivery=delivered
                )
                break
            except BufferError:  # librdkafka's queue is full: serve reports, retry
                self.producer.poll(0.1)
            except KafkaException as exc:
                raise TooLarge(str(exc.args[0] if exc.args else exc)) from None
        self.inflight_bytes += size
        return size

    def poll(self, timeout: float) -> None:
        self.producer.poll(timeout)

    def flush(self, timeout: float) -> int:
        return int(self.producer.flush(timeout))


class MemorySink:
    """Acknowledges on :meth:`poll` (the pure tests); ``sent`` is (session, event)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Event]] = []
        self.inflight_bytes = 0
        self.fatal: str | None = None
        self._pending: list[OnAck] = []
        #: stop acknowledging (a broker away)
        self.hold = False

    def send(self, session_id: str, event: Event, on_ack: OnAck) -> int:
        self.sent.append((session_id, event))
        self._pending.append(on_ack)
        self.inflight_bytes += 1
        return 1

    def poll(self, timeout: float) -> None:
        if self.hold:
            return
        pending, self._pending = self._pending, []
        for ack in pending:
            self.inflight_bytes -= 1
            ack(None)

    def flush(self, timeout: float) -> int:
        self.poll(timeout)
        return len(self._pending)

    def drop_unacked(self) -> None:
        """Lose what is in flight (the process was killed)."""
        self._pending = []
        self.inflight_bytes = 0
