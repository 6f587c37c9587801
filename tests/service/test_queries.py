"""Queries by session without a broker (issue 13): request -> response, and the cache.

The cache is fed the records the real engine produces (tests/engine/kit.py)
and must answer exactly what ``views_reader`` assembles from the topic.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from processor.client.views_reader import ViewRecord, assemble_transcript
from processor.engine.dead_letters import MAX_KEY_BYTES
from processor.engine.records import Out
from processor.kafka.owners import advertised_url, member_client_id, session_partition
from processor.service.queries.queries import GivenUp, NotRestored, Queries
from processor.service.queries.query_cache import QueryCache
from processor.service.store import mirror_fill
from processor.testing.memory import MemoryBroker, MemoryConsumer, MemoryMessage
from tests.engine.kit import CODEC, CONFIG, Harness, materialize, session_log

VIEWS = CONFIG.topics.views


class Source:
    """A member's knowledge, scripted: owned sessions and their views."""

    def __init__(self, views: dict[str, dict[str, ViewRecord]], owned: bool | None = True) -> None:
        self.views = views
        self.owned = owned
        self.raise_: Exception | None = None
        self.gate: threading.Event | None = None

    def owns(self, session_id: str) -> bool | None:
        return self.owned

    def session_views(self, session_id: str) -> Mapping[str, ViewRecord] | None:
        if self.gate is not None:
            self.gate.wait(30)
        if self.raise_ is not None:
            raise self.raise_
        return self.views.get(session_id)


def _views() -> dict[str, dict[str, ViewRecord]]:
    h = Harness()
    h.fold_events("s/1", session_log(40))
    h.commit()
    return materialize(h.topic(VIEWS))


def _body(r: Any) -> Any:
    assert r.body.endswith(b"\n") and r.body.count(b"\n") == 1  # one line
    return orjson.loads(r.body)


def _queries(source: Source | None, **kw: Any) -> Queries:
    return Queries(source, registry=CollectorRegistry(), **kw)


def test_a_view_is_served_as_the_views_topic_assembles_it() -> None:
    views = _views()
    q = _queries(Source(views))
    r = q.handle("/sessions/s%2F1/views/surface")
    assert r.status == 200 and r.outcome == "served"
    rec = views["s/1"]["surface"]
    assert _body(r) == {
        "session": "s/1",
        "view": "surface",
        "asOfSeq": rec.as_of_seq,
        "stateVersion": rec.state_version,
        "value": orjson.loads(orjson.dumps(rec.value)),
    }
    assert _body(q.handle("/sessions/s%2F1/messages"))["value"] == views["s/1"]["messages"].value
    listing = _body(q.handle("/sessions/s%2F1"))
    assert listing["views"] == {n: r.as_of_seq for n, r in views["s/1"].items()}
    assert q.counter.labels("served")._value.get() == 3


def test_the_transcript_is_stitched_from_its_pages_and_can_be_sliced() -> None:
    views = _views()
    q = _queries(Source(views))
    whole = assemble_transcript(views["s/1"])
    doc = _body(q.handle("/sessions/s%2F1/transcript"))
    assert doc["entries"] == orjson.loads(orjson.dumps(whole)) and doc["total"] == len(whole)
    part = _body(q.handle("/sessions/s%2F1/transcript?offset=3&limit=2"))
    assert part["entries"] == orjson.loads(orjson.dumps(whole[3:5])) and part["offset"] == 3
    assert q.handle("/sessions/s%2F1/transcript?offset=x").status == 400


def test_unknown_views_sessions_and_routes_are_404_with_one_json_line() -> None:
    q = _queries(Source(_views()))
    for path, says in [
        ("/sessions/s%2F1/views/nope", "has no view 'nope'"),
        ("/sessions/other/views/surface", "no views of session 'other'"),
        ("/sessions/s%2F1/bogus", "no route"),
        ("/sessions/", "no route"),
    ]:
        r = q.handle(path)
        assert (r.status, r.outcome) == (404, "not_found"), path
        assert says in _body(r)["error"]


def test_bad_session_ids_are_refused_before_any_lookup() -> None:
    q = _queries(Source({}))
    r = q.handle("/sessions/" + "x" * (MAX_KEY_BYTES + 1))
    assert r.status == 400 and f"exceeds {MAX_KEY_BYTES}" in _body(r)["error"]
    r = q.handle("/sessions/%ff%fe")
    assert r.status == 400 and "UTF-8" in _body(r)["error"]


def test_another_members_session_is_redirected_to_its_owner() -> None:
    q = _queries(Source({}, owned=False), self_url="http://me:1")
    q.owner = lambda sid: (2, "http://owner:8080")
    r = q.handle("/sessions/s%2F1/views/surface?x=1")
    assert (r.status, r.outcome) == (307, "redirected")
    assert r.headers["Location"] == "http://owner:8080/sessions/s%2F1/views/surface?x=1&hops=1"
    assert _body(r)["owner"] == "http://owner:8080" and _body(r)["partition"] == 2
    r = q.handle("/sessions/s%2F1/views/surface?hops=2&x=1")
    assert r.headers["Location"] == "http://owner:8080/sessions/s%2F1/views/surface?x=1&hops=3"
    r = q.handle("/sessions/s%2F1/views/surface?hops=3")  # members disagree: no loop
    assert r.status == 503 and "ownership is moving" in _body(r)["error"]
    # while the group still names this member (or nobody), retry instead of looping
    for owner in ("http://me:1", None):
        q.owner = lambda sid, o=owner: (2, o)
        r = q.handle("/sessions/s%2F1")
        assert r.status == 503 and r.headers["Retry-After"] == "1"


def test_restoring_and_unknown_assignment_are_503_with_retry_after() -> None:
    source = Source({}, owned=None)
    q = _queries(source)
    r = q.handle("/sessions/a")
    assert (r.status, r.headers["Retry-After"]) == (503, "1")
    source.owned = True
    source.raise_ = NotRestored("partition 0 loading")
    r = q.handle("/sessions/a")
    assert r.status == 503 and "Retry-After" in r.headers and "restoring" in _body(r)["error"]
    source.raise_ = GivenUp("over the budget of 10 bytes")
    r = q.handle("/sessions/a")
    assert r.status == 503 and "Retry-After" not in r.headers
    assert _body(r)["error"] == "over the budget of 10 bytes"
    assert _queries(None).handle("/sessions/a").status == 503


def test_a_response_over_the_size_bound_is_refused_naming_the_bound() -> None:
    q = _queries(Source(_views()), max_response_bytes=200)
    r = q.handle("/sessions/s%2F1/transcript")
    assert (r.status, r.outcome) == (400, "too_large")
    assert "exceeds the bound of 200" in _body(r)["error"]
    assert q.handle("/sessions/s%2F1/transcript?limit=0").status == 200


def test_queries_beyond_the_concurrency_bound_get_429() -> None:
    source = Source(_views())
    source.gate = threading.Event()
    q = _queries(source, max_concurrent=1)
    held = threading.Thread(target=q.handle, args=("/sessions/s%2F1",))
    held.start()
    deadline = time.monotonic() + 30
    while q._slots._value != 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    r = q.handle("/sessions/s%2F1")
    assert (r.status, r.outcome, r.headers["Retry-After"]) == (429, "busy", "1")
    source.gate.set()
    held.join(30)
    assert q.handle("/sessions/s%2F1").status == 200


def test_queries_beyond_the_rate_bound_get_429() -> None:
    q = _queries(Source(_views()), max_rate=3)
    statuses = [q.handle("/sessions/s%2F1").status for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    assert "per second" in _body(q.handle("/sessions/s%2F1"))["error"]


def test_a_failing_source_is_a_500_line_not_a_dead_thread() -> None:
    source = Source({})
    source.raise_ = KeyError("boom")
    r = _queries(source).handle("/sessions/a")
    assert (r.status, r.outcome) == (500, "failed") and "KeyError" in _body(r)["error"]


def test_owner_url_travels_in_the_client_id() -> None:
    cid = member_client_id("host-1@x", "http://10.0.0.1:9100")
    assert cid == "processor-host-1@x@http://10.0.0.1:9100"
    assert advertised_url(cid) == "http://10.0.0.1:9100"
    assert advertised_url(member_client_id("host-1@x", None)) is None
    # the producers' partitioner: toPositive(murmur2(key)) % n, Kafka's reference
    # value murmur2(b"21") == -973932308 (UtilsTest)
    assert session_partition("21", 2**31 - 1) == (-973932308 & 0x7FFFFFFF)


# ------------------------------------------------------------ the cache


def _writes(outs: list[Out], partition: int = 0) -> list[tuple[int, bytes, bytes | None]]:
    return [(partition, o.key, o.value) for o in outs if o.topic == VIEWS and o.key]


def _broker(records: list[tuple[bytes | None, bytes | None]] | None = None) -> MemoryBroker:
    """A broker whose views partition 0 holds ``records`` (committed)."""
    broker = MemoryBroker()
    broker.create_topics(CONFIG)
    for key, value in records or []:
        broker.append(VIEWS, 0, key, value, "committed")
    return broker


def _cache(
    broker: MemoryBroker,
    budget: int = 1 << 30,
    reader: Callable[[], MemoryConsumer] | None = None,
) -> QueryCache:
    return QueryCache(
        CODEC,
        topic=VIEWS,
        reader=reader or (lambda: MemoryConsumer(broker, "g", eof=True)),
        partition_count=lambda consumer: 1,
        budget_bytes=budget,
        registry=CollectorRegistry(),
    )


def _wait_ready(cache: QueryCache, sid: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            cache.session_views(sid)
            return
        except NotRestored:
            assert time.monotonic() < deadline, "the fill never finished"
            time.sleep(0.01)


def _batches() -> tuple[Harness, list[list[Out]], list[str]]:
    """Several sessions (two share a key prefix) committed in several batches."""
    h = Harness()
    sids = ["a", "a/b", "ab", "a0", "b", "long"]
    logs = {sid: session_log(300 if sid == "long" else 30, seed=i) for i, sid in enumerate(sids)}
    batches = []
    for start in range(0, 300, 25):
        for sid in sids:
            h.fold_events(sid, logs[sid][start : start + 25])
        batches.append(h.commit())
    return h, batches, sids


def test_the_cache_answers_what_the_views_topic_assembles() -> None:
    h, batches, sids = _batches()
    cache = _cache(_broker())
    assert cache.owns("a") is None  # partition count not read yet
    cache.assigned([0])
    _wait_ready(cache, "a")
    for batch in batches:
        cache.committed(_writes(batch))
    cache.sync()  # the writer thread applies them
    topic = materialize(h.topic(VIEWS))
    for sid in sids:
        assert cache.owns(sid) is True
        assert cache.session_views(sid) == topic[sid]
    assert len(topic["long"]) > 5  # transcript pages, units: a real session
    assert cache.session_views("nobody") is None
    cache.close()


def test_commits_during_the_fill_are_applied_after_it_even_when_they_overlap() -> None:
    h, batches, sids = _batches()
    topic_now = [(o.key, o.value) for b in batches[:8] for o in b if o.topic == VIEWS]
    release = threading.Event()
    broker = _broker(topic_now)  # the fill reads up to batch 8 ...

    class Held(MemoryConsumer):
        def consume(self, num_messages: int = 1, timeout: float = -1) -> list[MemoryMessage]:
            release.wait(30)
            return super().consume(num_messages, timeout)

    cache = _cache(broker, reader=lambda: Held(broker, "g", eof=True))
    cache.assigned([0])
    for batch in batches[5:]:  # ... while batches 6.. committed (6-8 seen twice)
        cache.committed(_writes(batch))
    cache.sync()
    with pytest.raises(NotRestored):
        cache.session_views("a")
    release.set()
    _wait_ready(cache, "a")
    topic = materialize(h.topic(VIEWS))
    for sid in sids:
        assert cache.session_views(sid) == topic[sid]
    cache.close()


def test_a_partition_over_the_budget_is_given_up_not_served_partially() -> None:
    _, batches, _ = _batches()
    cache = _cache(_broker(), budget=15_000)
    cache.assigned([0])
    _wait_ready(cache, "a")
    for batch in batches:
        cache.committed(_writes(batch))
    cache.sync()  # the writer thread applies them
    with pytest.raises(GivenUp, match="budget of 15000 bytes"):
        cache.session_views("a")
    assert cache.dropped._value.get() == 1
    assert cache.held_bytes._value.get() < 15_000  # its rows are gone
    cache.revoked([0])
    assert cache.owns("a") is False
    cache.close()


def test_the_inspector_port_passes_the_raw_path_to_the_queries() -> None:
    """With ``--inspect`` the port is uvicorn's; ``%2F`` must reach the handler encoded."""
    import asyncio

    from starlette.requests import Request

    from processor.inspect.mount import query_route

    views = _views()
    q = _queries(Source(views))
    route = query_route(q.http)
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/sessions/s/1/transcript",  # what the server decoded
        "raw_path": b"/sessions/s%2F1/transcript",
        "query_string": b"offset=1&limit=2",
        "headers": [],
    }
    response = asyncio.run(route.endpoint(Request(scope)))
    assert response.status_code == 200
    doc = orjson.loads(response.body)
    assert doc["offset"] == 1 and len(doc["entries"]) == 2
    assert response.headers["content-type"] == "application/json"


def test_a_fill_that_fails_is_retried_and_a_revoked_fill_is_discarded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The mirror's fill (store/mirror_fill.py): a read failing with a transient
    error is put off and tried again with a new consumer; what a read of an
    assignment revoked meanwhile returns is never applied."""
    from confluent_kafka import KafkaError, KafkaException

    monkeypatch.setattr(mirror_fill, "WAIT_FIRST_S", 0.05)
    h, batches, sids = _batches()
    broker = _broker([(o.key, o.value) for b in batches for o in b if o.topic == VIEWS])
    made: list[MemoryConsumer] = []
    reading = threading.Event()
    release = threading.Event()

    class Flaky(MemoryConsumer):
        """Consumer 1 reads the ends; 2 fails; 3 is held, then reads a stale record."""

        def consume(self, num_messages: int = 1, timeout: float = -1) -> list[MemoryMessage]:
            n = made.index(self) + 1
            if n == 2:
                raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker away"))
            if n == 3 and not release.is_set():
                reading.set()
                release.wait(30)  # revoked and reassigned while this read runs
                return [MemoryMessage(VIEWS, 0, 0, b"a/stale", b"not a view record")]
            return super().consume(num_messages, timeout)

    def reader() -> MemoryConsumer:
        made.append(Flaky(broker, "g", eof=True))
        return made[-1]

    cache = _cache(broker, reader=reader)
    cache.assigned([0])
    assert reading.wait(30)
    cache.revoked([0])
    cache.assigned([0])
    release.set()
    _wait_ready(cache, "a")
    assert cache.fill_failures._value.get() == 1
    expected = materialize(h.topic(VIEWS))
    for sid in sids:
        assert cache.session_views(sid) == expected[sid]  # the stale read left nothing
    cache.close()


def test_the_metrics_port_serves_the_routes_with_their_headers() -> None:
    import http.client

    from processor.service.ops.http import serve
    from processor.telemetry.metrics import Metrics

    metrics = Metrics()
    source = Source(_views(), owned=False)
    q = Queries(source, lambda sid: (1, "http://owner:1"), registry=metrics.registry)
    server = serve(metrics, "127.0.0.1", 0, queries=q.http)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=30)
        conn.request("GET", "/sessions/s%2F1/views/surface")
        r = conn.getresponse()
        assert r.status == 307 and r.getheader("Location") == (
            "http://owner:1/sessions/s%2F1/views/surface?hops=1"
        )
        assert r.getheader("Content-Type") == "application/json"
        assert orjson.loads(r.read())["owner"] == "http://owner:1"
        source.owned = None
        conn.request("GET", "/sessions/s%2F1")
        r = conn.getresponse()
        assert (r.status, r.getheader("Retry-After")) == (503, "1")
        r.read()
        conn.request("GET", "/metrics")
        r = conn.getresponse()
        assert r.status == 200
        assert b'processor_queries_total{outcome="redirected"} 1.0' in r.read()
    finally:
        server.shutdown()
        server.server_close()


def test_a_full_commit_queue_makes_the_loop_wait_and_is_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cache's write queue (MAX_QUEUED_COMMITS) reports when hit; the loop
    waits for room and no commit is lost."""
    from processor.service.queries import query_cache

    monkeypatch.setattr(query_cache, "MAX_QUEUED_COMMITS", 1)
    h, batches, sids = _batches()
    cache = _cache(_broker())
    held = threading.Event()
    real_apply = cache._apply_commits

    def slow(records: Any) -> None:
        held.wait(30)
        real_apply(records)

    cache._apply_commits = slow  # type: ignore[method-assign]
    cache.assigned([0])

    def commit_all() -> None:
        for b in batches:
            cache.committed(_writes(b))

    loop = threading.Thread(target=commit_all)
    loop.start()
    deadline = time.monotonic() + 30
    while cache.queue_full._value.get() == 0:
        assert time.monotonic() < deadline, "the queue never filled"
        time.sleep(0.01)
    assert loop.is_alive()  # waiting for room
    held.set()
    loop.join(30)
    cache.sync()
    _wait_ready(cache, "a")
    topic = materialize(h.topic(VIEWS))
    for sid in sids:
        assert cache.session_views(sid) == topic[sid]
    cache.close()


def test_a_write_failing_during_the_fill_gives_the_partition_up_and_the_thread_goes_on() -> None:
    """A full disk while a partition fills: given up (503 naming it), never served
    partially, and the fill thread lives on for the next assignment."""
    import sqlite3

    h, batches, _ = _batches()
    broker = _broker([(o.key, o.value) for b in batches for o in b if o.topic == VIEWS])
    cache = _cache(broker)
    real = cache._write

    def full(db: Any, p: int, records: Any) -> None:
        if db is not cache._db:  # the fill thread's connection
            raise sqlite3.OperationalError("database or disk is full")
        real(db, p, records)

    cache._write = full  # type: ignore[method-assign]
    cache.assigned([0])
    deadline = time.monotonic() + 30
    while True:
        try:
            cache.session_views("a")
        except NotRestored:
            assert time.monotonic() < deadline, "never given up"
            time.sleep(0.01)
            continue
        except GivenUp as exc:
            assert "disk is full" in str(exc)
            break
        raise AssertionError("served from a partial fill")
    assert cache.dropped._value.get() == 1
    cache._write = real  # type: ignore[method-assign]
    cache.revoked([0])
    cache.assigned([0])
    _wait_ready(cache, "a")
    expected = materialize(h.topic(VIEWS))
    assert cache.session_views("a") == expected["a"]
    cache.close()
