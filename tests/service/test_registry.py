"""``schema_registry`` switches the service to the Confluent wire format (issue 11).

No registry server: the registry here is ``InMemorySchemaRegistry`` behind
the two REST calls the client makes (register under a subject, fetch by
id), served by the standard library on a local port; the processor runs on
the in-memory transport.  What is proven: with a registry configured every
record the loop writes is ``00`` + a schema id the registry gave, readers
configured the same way decode them (and single-object records too), a
restart restores from Confluent-framed checkpoints, a registry that
does not answer ends the start with one line, and a lookup of an unseen
schema id tells an unknown id (a CODEC dead letter) from an outage (ridden
out up to a bound, then the run ends; no dead letter, nothing lost).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from processor.client.views_reader import (
    _Materializer,
    offline_equivalent,
    session_fold_equivalent,
)
from processor.codec import InMemorySchemaRegistry, default_codec
from processor.codec.names import CONFLUENT_MAGIC, SINGLE_OBJECT_MARKER, CodecError
from processor.config import ServiceConfig
from processor.kafka import schema_registry as registry_module
from processor.kafka.retry import observing
from processor.kafka.schema_registry import RegistryError, codec_for
from processor.offline import fold_events, session_output
from processor.service.loop.runner import Processor
from processor.telemetry.metrics import Metrics
from processor.testing.memory import MemoryBroker
from tests.engine.kit import session_log
from tests.service.conftest import as_json
from tests.service.test_memory_transport import Loop, _committed, _wait

LOG = session_log(16, seed=11)


class _Handler(BaseHTTPRequestHandler):
    registry: InMemorySchemaRegistry
    calls: list[str]

    def _reply(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # POST /subjects/<subject>/versions {"schema": "<json>"}
        parts = self.path.strip("/").split("/")
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.calls.append(f"POST {parts[1]}")
        schema_id = self.registry.id_for_schema(parts[1], json.loads(body["schema"]))
        self._reply(200, {"id": schema_id})

    def do_GET(self) -> None:  # GET /schemas/ids/<id>
        schema_id = int(self.path.rsplit("/", 1)[1])
        self.calls.append(f"GET {schema_id}")
        try:
            self._reply(200, {"schema": self.registry.schema_for_id(schema_id)})
        except KeyError:
            self._reply(404, {"error_code": 40403, "message": "Schema not found"})

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def registry() -> Iterator[tuple[str, type[_Handler]]]:
    handler = type("Handler", (_Handler,), {"registry": InMemorySchemaRegistry(100), "calls": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def _config(url: str) -> ServiceConfig:
    return ServiceConfig(partitions=2, topic_prefix="reg", schema_registry=url)


def _produce(broker: MemoryBroker, config: ServiceConfig, start: int, end: int) -> None:
    """Events as a configured writer frames them: even seqs Confluent, odd ones single-object."""
    confluent, single = codec_for(config, writer=True), default_codec()
    for event in LOG[start:end]:
        codec = confluent if event.seq % 2 == 0 else single
        broker.produce(config.topics.events, b"s", codec.encode_parsed_event("s", event))


def test_without_a_registry_records_are_single_object() -> None:
    assert codec_for(ServiceConfig()) is default_codec()
    assert Processor(ServiceConfig()).codec.framing == "single-object"


def test_a_configured_registry_frames_every_output_record(
    registry: tuple[str, type[_Handler]],
) -> None:
    url, handler = registry
    config = _config(url)
    broker = MemoryBroker()
    broker.create_topics(config)
    _produce(broker, config, 0, 8)
    first = Loop(broker, config)
    assert first.proc.codec.framing == "confluent"
    _wait(lambda: _committed(broker, config), first, "first run commits")
    first.stop()
    _produce(broker, config, 8, 16)
    second = Loop(broker, config)  # restores from Confluent-framed checkpoints
    _wait(lambda: _committed(broker, config), second, "second run commits")
    second.stop()
    assert second.sample("processor_restored_checkpoints_total") == 1
    assert second.sample("processor_records_consumed_total") == 8

    ids = {i for versions in handler.registry.subjects.values() for i in versions}
    assert set(handler.registry.subjects) == {
        "processor.v1.SessionEvent",
        "processor.v1.View",
        "processor.v1.Checkpoint",
        "processor.v1.CheckpointHead",
        "processor.v1.CheckpointPart",
        "processor.v1.DeadLetter",
    }
    t = config.topics
    for topic in (t.views, t.checkpoints):
        # tombstones (parts nothing refers to any more) carry no value
        values = [v for _, m in broker.committed_records(topic) if (v := m.value()) is not None]
        assert values
        for value in values:
            assert value[:1] == CONFLUENT_MAGIC
            assert int.from_bytes(value[1:5], "big") in ids

    # a reader configured the same way: a fresh client, ids looked up once each
    reader = _Materializer(codec_for(config), None, None)
    for _, msg in broker.committed_records(t.views):
        reader.apply(msg.key(), msg.value())
    expected = as_json(offline_equivalent(session_output(fold_events(LOG))))
    assert as_json(session_fold_equivalent(reader.views["s"])) == expected
    assert sum(c.startswith("GET") for c in handler.calls) <= len(ids)


def test_a_configured_reader_also_reads_single_object_records(
    registry: tuple[str, type[_Handler]],
) -> None:
    url, _ = registry
    single = default_codec().encode_parsed_event("s", LOG[0])
    assert single[:2] == SINGLE_OBJECT_MARKER
    assert codec_for(_config(url)).decode_event(single) == default_codec().decode_event(single)


def test_an_unreachable_registry_ends_the_start_with_one_line() -> None:
    with pytest.raises(RegistryError) as raised:
        Processor(_config("http://127.0.0.1:1"))
    assert "schema registry" in str(raised.value) and "\n" not in str(raised.value)
    with pytest.raises(RegistryError, match="not http"):
        codec_for(_config("registry.local:8081"))


def test_records_of_the_registered_schemas_are_read_while_the_registry_is_down(
    registry: tuple[str, type[_Handler]],
) -> None:
    """A member registers its schemas at start; a registry failing afterwards must
    not turn the events of those schemas into CODEC dead letters (each one a
    quarantined session): their ids are known from the registration, no GET."""
    url, handler = registry
    codec = codec_for(_config(url), writer=True)
    framed = codec.encode_parsed_event("s", LOG[0])
    assert framed[:1] == CONFLUENT_MAGIC

    def unavailable(self: _Handler) -> None:
        self.calls.append("GET failed")
        self._reply(500, {"error_code": 50001, "message": "backend down"})

    handler.do_GET = unavailable  # type: ignore[method-assign]
    assert codec.decode_event(framed) == default_codec().decode_event(
        default_codec().encode_parsed_event("s", LOG[0])
    )
    assert not [c for c in handler.calls if c.startswith("GET")], handler.calls


#: a schema id no member registered: an older writer's, say (its schema is the current one)
UNSEEN = 777


def _unseen(config: ServiceConfig, start: int, end: int) -> list[bytes]:
    """Events framed with :data:`UNSEEN` instead of the id the registry gave."""
    codec = codec_for(config, writer=True)
    out = []
    for event in LOG[start:end]:
        framed = codec.encode_parsed_event("s", event)
        out.append(framed[:1] + UNSEEN.to_bytes(4, "big") + framed[5:])
    return out


def _one_unseen(
    registry: tuple[str, type[_Handler]],
) -> tuple[type[_Handler], ServiceConfig, bytes]:
    """The registry's handler, a config using it, and one event framed with :data:`UNSEEN`."""
    url, handler = registry
    config = _config(url)
    return handler, config, _unseen(config, 0, 1)[0]


def _serving_unseen(handler: type[_Handler], answers: list[int]) -> None:
    """GET :data:`UNSEEN` answers each status of ``answers`` in turn, then the schema."""

    def do_get(self: _Handler) -> None:
        schema_id = int(self.path.rsplit("/", 1)[1])
        self.calls.append(f"GET {schema_id}")
        if schema_id == UNSEEN and answers:
            code = answers.pop(0)
            self._reply(code, {"error_code": code * 100 + 1, "message": "backend down"})
        elif schema_id == UNSEEN:
            ours = min(self.registry.subjects["processor.v1.SessionEvent"])
            self._reply(200, {"schema": self.registry.schema_for_id(ours)})
        else:
            _Handler.do_GET(self)

    handler.do_GET = do_get  # type: ignore[method-assign]


def test_an_id_the_registry_does_not_know_is_bad_input(
    registry: tuple[str, type[_Handler]],
) -> None:
    """A 404 is the record's fault: a CodecError, which the engine dead-letters."""
    handler, config, framed = _one_unseen(registry)
    with pytest.raises(CodecError, match=f"unknown schema id {UNSEEN}"):
        codec_for(config).decode_event(framed)
    assert handler.calls.count(f"GET {UNSEEN}") == 1  # not retried


def test_a_registry_blip_at_an_unseen_id_is_ridden_out_and_named_on_readyz(
    registry: tuple[str, type[_Handler]],
) -> None:
    handler, config, framed = _one_unseen(registry)
    metrics = Metrics()
    metrics.health.ready = True
    seen: list[tuple[int, bytes]] = []
    answers = [503, 500, 429]

    def do_get(self: _Handler) -> None:
        seen.append(metrics.health.readiness())
        _serving(self)

    _serving_unseen(handler, answers)
    _serving = handler.do_GET
    handler.do_GET = do_get  # type: ignore[method-assign]
    with observing(metrics.retries):
        decoded = codec_for(config).decode_event(framed)
    assert decoded == default_codec().decode_event(default_codec().encode_parsed_event("s", LOG[0]))
    assert handler.calls.count(f"GET {UNSEEN}") == 4
    assert seen[0][0] == 200  # the first try is not a wait
    for status, body in seen[1:]:
        assert status == 503, body
        assert b"the schema registry to answer for schema id 777" in body, body
    assert metrics.health.readiness() == (200, b"ready\n")


def test_a_registry_outage_at_an_unseen_id_ends_the_run_and_loses_nothing(
    registry: tuple[str, type[_Handler]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dead-lettering a record whose schema the registry cannot serve right now
    would quarantine its session for a transient fault.  The run ends with one
    line instead; nothing of the batch is committed, and a member started once
    the registry answers folds every event: no dead letter, the offline fold."""
    monkeypatch.setattr(registry_module, "LOOKUP_BOUND_S", 0.5)
    url, handler = registry
    config = _config(url)
    broker = MemoryBroker()
    broker.create_topics(config)
    _produce(broker, config, 0, 8)
    for value in _unseen(config, 8, 16):
        broker.produce(config.topics.events, b"s", value)
    _serving_unseen(handler, [503] * 1000)
    first = Loop(broker, config)
    first.thread.join(60)  # the run ends by itself
    assert not first.thread.is_alive()
    (error,) = first.errors
    assert isinstance(error, RegistryError), error
    assert f"/schemas/ids/{UNSEEN} -> 503" in str(error) and "\n" not in str(error)
    assert "tried" in str(error)
    assert not list(broker.committed_records(config.topics.dlq))
    events = config.topics.events
    p = next(p for p in range(config.partitions) if broker.log(events, p).high)
    assert broker.group_offsets.get((config.group_id, events, p), 0) <= 8

    _serving_unseen(handler, [])  # the registry is back
    second = Loop(broker, config)
    _wait(lambda: _committed(broker, config), second, "the second run commits")
    second.stop()
    assert not second.errors
    assert not list(broker.committed_records(config.topics.dlq))
    reader = _Materializer(codec_for(config), None, None)
    for _, msg in broker.committed_records(config.topics.views):
        reader.apply(msg.key(), msg.value())
    expected = as_json(offline_equivalent(session_output(fold_events(LOG))))
    assert as_json(session_fold_equivalent(reader.views["s"])) == expected
