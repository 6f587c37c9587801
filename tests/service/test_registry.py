"""``schema_registry`` switches the service to the Confluent wire format (issue 11).

No registry server: the registry here is ``InMemorySchemaRegistry`` behind
the two REST calls the client makes (register under a subject, fetch by
id), served by the standard library on a local port; the processor runs on
the in-memory transport.  What is proven: with a registry configured every
record the loop writes is ``00`` + a schema id the registry gave, readers
configured the same way decode them (and single-object records too), a
restart restores from Confluent-framed checkpoints, and a registry that
does not answer ends the start with one line.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from processor.codec import InMemorySchemaRegistry, default_codec
from processor.codec.names import CONFLUENT_MAGIC, SINGLE_OBJECT_MARKER
from processor.config import ServiceConfig
from processor.offline import fold_events, session_output
from processor.service.memory import MemoryBroker
from processor.service.registry import RegistryError, codec_for
from processor.service.runner import Processor
from processor.service.views_reader import (
    _Materializer,
    offline_equivalent,
    session_fold_equivalent,
)
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
