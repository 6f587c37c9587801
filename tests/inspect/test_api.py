"""The inspector's HTTP API on a real broker: redrive guard, host check, bad input."""

from __future__ import annotations

import http.client
import os
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from processor.client.session_writer import SessionWriter
from processor.codec import default_codec
from processor.config import ServiceConfig
from processor.examples.make_example import EXAMPLE_PATH
from processor.files import read_session_file
from processor.inspect.server import InspectorServer
from processor.kafka import clients
from processor.kafka.topic_admin import create_topics
from processor.service.loop.runner import Processor
from tests.inspect.conftest import wait_for

pytestmark = pytest.mark.kafka


@pytest.fixture
def config(kafka_bootstrap: str) -> Iterator[ServiceConfig]:
    prefix = f"iapi{os.getpid()}x{int(time.time() * 1000) % 100000}"
    cfg = ServiceConfig(
        bootstrap_servers=kafka_bootstrap, topic_prefix=prefix, group_id=f"{prefix}-g", partitions=2
    )
    create_topics(clients.admin(cfg), cfg)
    yield cfg


def call(
    server: InspectorServer, method: str, path: str, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request(method, path, headers=headers or {})
        res = conn.getresponse()
        body = res.read()
        try:
            return res.status, orjson.loads(body)
        except orjson.JSONDecodeError:
            return res.status, body
    finally:
        conn.close()


def test_redrive_needs_the_configured_token(config: ServiceConfig) -> None:
    redriven: list[tuple[str, int]] = []
    with (
        InspectorServer(
            config,
            port=0,
            token="right-token",
            redrive=lambda sid, seq: redriven.append((sid, seq)),
        ) as server,
        InspectorServer(config, port=0) as no_token,
    ):
        # the sessions are known from status views written as the processor writes them
        producer = clients.event_producer(config)
        status = {
            "state": "quarantined",
            "lastSeq": 3,
            "quarantine": {"seq": 3, "rule": "S-1", "reason": "gap", "offset": 9},
        }
        for sid, doc in (("q1", status), ("fine", {"state": "ok", "lastSeq": 1})):
            for key, value in default_codec().encode_view_records(sid, "status", 3, -1, doc):
                producer.produce(config.topics.views, key=key, value=value, partition=0)
        assert producer.flush(30) == 0
        wait_for(
            "both sessions",
            lambda: (
                server.state.counts()["sessions"] == 2 and no_token.state.counts()["sessions"] == 2
            ),
        )

        path = "/api/session/redrive?id=q1"
        assert call(server, "POST", path)[0] == 403
        code, body = call(server, "POST", path, {"X-Inspector-Token": "right-toke"})
        assert code == 403 and "token" in body["error"]
        assert call(server, "GET", path, {"X-Inspector-Token": "right-token"})[0] == 405
        assert redriven == []
        code, body = call(no_token, "POST", path, {"X-Inspector-Token": ""})
        assert code == 403 and "--token" in body["error"]
        code, body = call(
            server, "POST", "/api/session/redrive?id=fine", {"X-Inspector-Token": "right-token"}
        )
        assert code == 409 and "not quarantined" in body["error"]
        assert (
            call(
                server, "POST", "/api/session/redrive?id=nope", {"X-Inspector-Token": "right-token"}
            )[0]
            == 404
        )
        code, body = call(server, "POST", path, {"X-Inspector-Token": "right-token"})
        assert (code, body) == (200, {"requested": "q1"}) and redriven == [("q1", 3)]


def test_host_check_bad_parameters_and_headers(config: ServiceConfig) -> None:
    with InspectorServer(config, port=0) as server:
        assert server.state.wait_loaded(60)
        assert call(server, "GET", "/api/health", {"Host": "evil.example"})[0] == 400
        assert call(server, "GET", "/api/health", {"Host": f"localhost:{server.port}"})[0] == 200
        code, body = call(server, "GET", "/api/sessions?sort=password")
        assert code == 400 and "unknown sort key" in body["error"]
        code, body = call(server, "GET", "/api/sessions?limit=ten")
        assert code == 400 and "limit must be an integer" in body["error"]
        assert call(server, "GET", "/api/session")[0] == 400
        assert call(server, "GET", "/api/session?id=missing")[0] == 404
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.request("GET", "/")
        res = conn.getresponse()
        res.read()
        csp = res.getheader("content-security-policy") or ""
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert res.getheader("x-content-type-options") == "nosniff"
        conn.close()


def test_time_travel_rejects_a_seq_outside_the_session(config: ServiceConfig) -> None:
    events = read_session_file(EXAMPLE_PATH).events[:10]
    with SessionWriter(config) as writer:
        for ev in events:
            writer.append_event("tt", ev)
    Processor(config.with_overrides(commit_interval_ms=100)).run(max_idle_s=3)
    with InspectorServer(config, port=0) as server:
        wait_for(
            "the session",
            lambda: (s := server.state.session("tt")) is not None and s[0].as_of_seq == 9,
        )
        code, body = call(server, "GET", "/api/session/at?id=tt&seq=10")
        assert code == 400 and "outside 0..9" in body["error"]
        code, body = call(server, "GET", "/api/session/at?id=tt&seq=4")
        assert code == 200 and body["then"]["asOfSeq"] == 4
        assert {"path": "asOfSeq", "kind": "changed", "then": 4, "now": 9} in body["diff"]
        code, body = call(server, "GET", "/api/session/surface?id=tt")
        assert code == 200 and body["asOfSeq"] == 9 and body["skipped"] == []


def test_missing_topics_are_reported_then_recovered(kafka_bootstrap: str) -> None:
    prefix = f"iapimiss{os.getpid()}x{int(time.time() * 1000) % 100000}"
    cfg = ServiceConfig(
        bootstrap_servers=kafka_bootstrap, topic_prefix=prefix, group_id=f"{prefix}-g", partitions=1
    )
    with InspectorServer(cfg, port=0) as server:
        health = wait_for(
            "the error on /api/health",
            lambda: (lambda doc: doc if doc["error"] else None)(
                call(server, "GET", "/api/health")[1]
            ),
        )
        assert health["loaded"] is False
        assert f"{prefix}.views does not exist" in health["error"]
        create_topics(clients.admin(cfg), cfg)
        wait_for(
            "recovery",
            lambda: (lambda doc: doc["loaded"] and doc["error"] is None)(
                call(server, "GET", "/api/health")[1]
            ),
        )


def test_a_stream_opened_after_the_load_first_sends_a_resync(config: ServiceConfig) -> None:
    """The page fetches the list, then opens its stream; a stream that only
    announced later commits left the page "loading" when the load finished
    in between (the browser test's CI failure, stop 28)."""
    with InspectorServer(config, port=0) as server:
        assert server.state.wait_loaded(60)
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        try:
            conn.request("GET", "/api/stream")
            res = conn.getresponse()
            assert res.status == 200
            deadline = time.monotonic() + 10  # a keepalive comes after 15 s
            line = b""
            while time.monotonic() < deadline and not line.startswith(b"data: "):
                line = res.fp.readline()
            assert line.startswith(b"data: "), "no notice on a new stream"
            assert orjson.loads(line[len(b"data: ") :]) == {"sessions": [], "resync": True}
        finally:
            conn.close()
