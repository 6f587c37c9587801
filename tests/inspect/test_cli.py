"""``processor inspect``, ``processor run --inspect`` and ``processor demo --inspect``
as real OS processes on a real broker."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from processor.children import popen_tied
from processor.config import ServiceConfig
from processor.kafka import clients
from processor.kafka.topic_admin import create_topics
from tests.inspect.conftest import wait_for
from tests.local_http import free_port

pytestmark = pytest.mark.kafka

REPO = Path(__file__).parents[2]
URL = re.compile(r"(http://127\.0\.0\.1:\d+/(?:inspect/)?)")


def spawn(*args: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = Path(tempfile.mkstemp(prefix="inspect-cli-", suffix=".log")[1])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with log.open("wb") as sink:  # a file, not a pipe: a chatty child never blocks
        proc = popen_tied(
            [sys.executable, "-m", "processor", *args], env=env, stdout=sink, stderr=sink
        )
    return proc, log


def url_in(log: Path, marker: str) -> str | None:
    text = log.read_text(errors="replace")
    for line in text.splitlines():
        if marker in line:
            m = URL.search(line)
            if m:
                return m.group(1)
    return None


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as res:
            return res.status, res.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(10)


@pytest.fixture
def topics(kafka_bootstrap: str) -> Iterator[ServiceConfig]:
    prefix = f"icli{os.getpid()}x{int(time.time() * 1000) % 100000}"
    config = ServiceConfig(
        bootstrap_servers=kafka_bootstrap, topic_prefix=prefix, group_id=f"{prefix}-g", partitions=2
    )
    create_topics(clients.admin(config), config)
    yield config


def _service_args(config: ServiceConfig) -> list[str]:
    return [
        "-b",
        config.bootstrap_servers,
        "--topic-prefix",
        config.topic_prefix,
        "--group-id",
        config.group_id,
    ]


def test_inspect_command_serves_and_says_when_the_port_is_taken(topics: ServiceConfig) -> None:
    proc, log = spawn("inspect", *_service_args(topics), "--port", "0", "--token", "tk-1")
    try:
        url = wait_for(
            "the address",
            lambda: url_in(log, "inspector on"),
            on_timeout=lambda: print(log.read_text()),
        )
        health: Any = wait_for(
            "loaded",
            lambda: (lambda doc: doc if doc["loaded"] else None)(
                orjson.loads(get(url + "api/health")[1])
            ),
        )
        assert health["redrive"] is True and health["error"] is None
        assert b"tk-1" not in get(url + "api/health")[1]
        status, page = get(url)
        assert status == 200 and b'<script type="module" src="static/app.js">' in page
        port = int(url.rsplit(":", 1)[1].strip("/"))
        busy, busy_log = spawn("inspect", *_service_args(topics), "--port", str(port))
        assert busy.wait(60) == 1
        lines = busy_log.read_text().strip().splitlines()
        assert lines[-1].startswith("processor inspect: cannot listen on 127.0.0.1:")
        assert "Traceback" not in busy_log.read_text()
    finally:
        assert stop(proc, signal.SIGTERM) == 0, log.read_text()


def test_run_mounts_the_inspector_only_when_enabled(topics: ServiceConfig) -> None:
    plain, plain_log = spawn(
        "run",
        *_service_args(topics),
        "--instance-id",
        "plain",
        "--metrics-port",
        "0",
        "--log-level",
        "WARNING",
    )
    proc, log = spawn(
        "run",
        *_service_args(topics),
        "--instance-id",
        "insp",
        "--metrics-port",
        "0",
        "--inspect",
        "--inspect-token",
        "tk-2",
        "--log-level",
        "WARNING",
    )
    try:
        metrics_url = wait_for(
            "the metrics address",
            lambda: (lambda m: m.group(1) if m else None)(
                re.search(r"metrics on (http://127\.0\.0\.1:\d+/)", plain_log.read_text())
            ),
        )
        assert get(metrics_url + "inspect/")[0] == 404  # off by default
        url = wait_for(
            "the inspector address",
            lambda: url_in(log, "inspector on"),
            on_timeout=lambda: print(log.read_text()),
        )
        assert url.endswith("/inspect/")
        base = url[: -len("inspect/")]
        status, body = get(base + "metrics")
        assert status == 200 and b"processor_events_total" in body
        wait_for("healthz", lambda: get(base + "healthz")[0] == 200)
        wait_for("readyz", lambda: get(base + "readyz")[0] == 200)
        health = wait_for(
            "the inspector loaded",
            lambda: (lambda doc: doc if doc["loaded"] else None)(
                orjson.loads(get(url + "api/health")[1])
            ),
        )
        assert health["redrive"] is True
        assert get(base + "inspect")[0] == 200  # redirected to inspect/
        status, page = get(url)
        assert status == 200 and b'src="static/app.js"' in page  # relative: works mounted
        assert get(url + "static/app.js")[0] == 200
    finally:
        assert stop(proc) == 0, log.read_text()
        assert stop(plain) == 0, plain_log.read_text()


def test_demo_prints_the_inspector_and_keeps_it_open(kafka_bootstrap: str) -> None:
    proc, log = spawn(
        "demo",
        "-b",
        kafka_bootstrap,
        "--sessions",
        "2",
        "--inspect",
        "--inspect-port",
        str(free_port()),
    )
    try:
        wait_for(
            "the demo to finish its check",
            lambda: "open it in a browser" in log.read_text(),
            timeout=240,
            on_timeout=lambda: print(log.read_text()),
        )
        text = log.read_text()
        assert "all 2 sessions match the offline fold exactly" in text
        url = url_in(log, "inspector:")
        assert url is not None, text
        rows = orjson.loads(get(url + "api/sessions?sort=id&dir=asc")[1])["rows"]
        assert [r["id"] for r in rows] == ["demo-session-00", "demo-session-01"]
        assert all(r["status"] == "ok" for r in rows)
        assert proc.poll() is None  # kept open
    finally:
        code = stop(proc, signal.SIGTERM)
    assert code == 0, log.read_text()
