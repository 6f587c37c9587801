"""Queries by session on a real broker (issue 13): two members of one group.

A query to either member answers, directly or through the 307 to the owner,
the value a ``read_committed`` reader of the views topic assembles for the
session; ``processor views --session`` asks a member and prints the same.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import quote

import orjson
import pytest

from processor.client.views_reader import (
    SessionViews,
    assemble_transcript,
    materialize_views,
)
from processor.service.loop.runner import Processor
from processor.service.queries.queries import Queries
from processor.service.queries.query_setup import query_endpoint
from processor.telemetry.metrics import Metrics
from tests.cli.test_service_cli import invoke
from tests.local_http import free_port
from tests.service.conftest import Stack, as_json, sessions, wait_until
from tests.service.test_processor import wait_for_views

pytestmark = pytest.mark.kafka


@dataclass
class Member:
    processor: Processor
    thread: threading.Thread
    server: ThreadingHTTPServer
    queries: Queries

    @property
    def url(self) -> str:
        return self.queries.self_url or ""

    def stop(self) -> None:
        self.processor.stop()
        self.thread.join(60)
        self.server.shutdown()
        self.server.server_close()


def _member(stack: Stack, name: str) -> Member:
    metrics = Metrics()
    config = stack.config.with_overrides(instance_id=name, metrics_port=0)
    server, queries, config = query_endpoint(config, metrics)
    processor = Processor(config, metrics=metrics, queries=queries)
    thread = threading.Thread(target=processor.run, daemon=True)
    thread.start()
    return Member(processor, thread, server, queries)


def _get(url: str) -> tuple[int, Any, str]:
    """(status, JSON body, the URL that answered: a 307 is followed)."""
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status, orjson.loads(resp.read()), resp.geturl()
    except urllib.error.HTTPError as exc:
        return exc.code, orjson.loads(exc.read()), url


def _answer(member: Member, sid: str, route: str, expected: Any) -> str:
    return _answer_url(member.url, sid, expected, route)


def _answer_url(base: str, sid: str, expected: Any, route: str = "/views") -> str:
    """Wait for the member's answer to equal ``expected``; the URL that served it.

    Waits out 503s (restoring, assignment moving) and the cache's writer
    thread, which applies a commit a moment after it (query_cache.py).
    """
    deadline = time.monotonic() + 90
    while True:
        try:
            status, doc, served_by = _get(f"{base}/sessions/{quote(sid, safe='')}{route}")
        except urllib.error.URLError:  # a process still starting its server
            status, doc, served_by = 503, None, base
        assert status in (200, 503), (status, doc)
        if status == 200 and doc == expected:
            return served_by
        assert time.monotonic() < deadline, f"{base} kept answering {str(doc)[:500]}"
        time.sleep(0.2)


def _topic_json(views: SessionViews) -> Any:
    return as_json(
        {
            n: {"asOfSeq": r.as_of_seq, "stateVersion": r.state_version, "value": r.value}
            for n, r in sorted(views.items())
        }
    )


def _settled(a: Member, b: Member, partitions: int) -> bool:
    pa, pb = set(a.processor.engine.partitions), set(b.processor.engine.partitions)
    return bool(pa) and bool(pb) and not pa & pb and len(pa | pb) == partitions


def test_either_member_answers_what_the_views_topic_assembles(stack: Stack) -> None:
    logs = sessions(8, 60, seed=13)
    logs["a/b"] = logs.pop("s000")  # an id holding "/" travels percent-encoded
    for sid, events in logs.items():
        stack.produce(sid, events)
    a = _member(stack, "qa")
    b: Member | None = None
    try:
        wait_until(lambda: a.processor.metrics.commits._value.get() >= 1, "a's first commit")
        b = _member(stack, "qb")
        member_b = b
        wait_until(lambda: _settled(a, member_b, stack.config.partitions), "the rebalance")
        wait_for_views(stack, {sid: stack.expected(sid) for sid in logs})
        topic = materialize_views(stack.config)
        served_by: dict[str, set[str]] = {a.url: set(), b.url: set()}
        for sid in logs:
            views = topic[sid]
            entries = as_json(assemble_transcript(views))
            surface = views["surface"]
            for member in (a, b):
                url = _answer(member, sid, "/views", _topic_json(views))
                served_by[url.split("/sessions/")[0]].add(sid)
                _answer(
                    member,
                    sid,
                    "/views/surface",
                    as_json(
                        {
                            "session": sid,
                            "view": "surface",
                            "asOfSeq": surface.as_of_seq,
                            "stateVersion": surface.state_version,
                            "value": surface.value,
                        }
                    ),
                )
                transcript = views["transcript"].as_of_seq
                _answer(
                    member,
                    sid,
                    "/transcript",
                    {
                        "session": sid,
                        "asOfSeq": transcript,
                        "total": len(entries),
                        "offset": 0,
                        "entries": entries,
                    },
                )
        # every session was served by its owner only, and both members own some
        assert served_by[a.url] and served_by[b.url]
        assert not served_by[a.url] & served_by[b.url]
        for member in (a, b):
            assert member.queries.counter.labels("redirected")._value.get() >= 1
            assert member.queries.counter.labels("served")._value.get() >= 1
        status, doc, _ = _get(f"{a.url}/sessions/s001/views/nope")
        assert status == 404 and "no view 'nope'" in doc["error"]

        # processor views --session: through a member (given, or the group's owner)
        sid = "a/b"
        expected = {sid: _topic_json(topic[sid])}
        for extra in (["--member", a.url], ["--member", b.url], []):
            result = invoke(stack.config, "views", "--session", sid, *extra)
            assert result.exit_code == 0, result.stderr
            assert "served by http://" in result.stderr
            assert orjson.loads(result.stdout) == expected
        # an unreachable member: the views topic answers the same
        result = invoke(stack.config, "views", "--session", sid, "--member", "http://127.0.0.1:9")
        assert result.exit_code == 0 and "reading the views topic" in result.stderr
        assert orjson.loads(result.stdout) == expected
    finally:
        a.stop()
        if b is not None:
            b.stop()


def test_processor_run_with_queries_serves_and_views_finds_it(stack: Stack) -> None:
    """The CLI wiring: ``processor run --queries`` advertises its port in the group
    and ``processor views --session`` finds it there without being told."""
    logs = sessions(4, 30, seed=14)
    for sid, events in logs.items():
        stack.produce(sid, events)
    port = free_port()
    proc = stack.spawn("qrun", "--metrics-port", str(port), "--queries")
    try:
        wait_for_views(stack, {sid: stack.expected(sid) for sid in logs})
        topic = materialize_views(stack.config)
        for sid in logs:
            url = _answer_url(f"http://127.0.0.1:{port}", sid, _topic_json(topic[sid]))
            assert url.startswith(f"http://127.0.0.1:{port}/")
        deadline = time.monotonic() + 60
        while True:  # the group may still be describing the member as joining
            result = invoke(stack.config, "views", "--session", "s001")
            if f"served by http://127.0.0.1:{port}" in result.stderr:
                break
            assert time.monotonic() < deadline, result.stderr
            time.sleep(0.5)
        assert result.exit_code == 0
        assert orjson.loads(result.stdout) == {"s001": _topic_json(topic["s001"])}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
