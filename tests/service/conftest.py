"""Shared helpers of the Kafka integration tests (a real broker, never a mock)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

from processor.children import popen_tied
from processor.client.views_reader import offline_equivalent
from processor.codec import default_codec
from processor.config import ServiceConfig
from processor.core.events import Event
from processor.kafka import clients
from processor.kafka.topic_admin import create_topics
from processor.offline import fold_events, session_output
from processor.service.loop.runner import Processor
from processor.workload import generate_session

REPO = Path(__file__).parents[2]


@dataclass
class Stack:
    config: ServiceConfig
    logs: dict[str, list[Event]] = field(default_factory=dict)

    def producer(self) -> Producer:
        return clients.event_producer(self.config)

    def produce(self, sid: str, events: list[Event], producer: Producer | None = None) -> None:
        own = producer is None
        producer = producer or self.producer()
        codec = default_codec()
        for ev in events:
            producer.produce(
                self.config.topics.events,
                key=sid.encode(),
                value=codec.encode_parsed_event(sid, ev),
            )
            producer.poll(0)
        if own:
            assert producer.flush(30) == 0
        self.logs.setdefault(sid, []).extend(events)

    def produce_raw(
        self,
        sid: str | None,
        value: bytes | None,
        headers: dict[str, str | bytes | None] | None = None,
    ) -> None:
        producer = self.producer()
        producer.produce(
            self.config.topics.events,
            key=sid.encode() if sid else None,
            value=value,
            headers=headers,
        )
        assert producer.flush(30) == 0

    def produce_control(self, sid: str | None, value: bytes | None) -> None:
        """One record on the control topic (operator commands)."""
        producer = self.producer()
        producer.produce(self.config.topics.control, key=sid.encode() if sid else None, value=value)
        assert producer.flush(30) == 0

    def produce_and_wait_folded(self, seed: int, timeout: float = 60) -> None:
        """One new session of 10 events, produced, until its views equal the offline fold."""
        from processor.client.views_reader import materialize_views, session_fold_equivalent

        logs = sessions(1, 10, seed=seed)
        for sid, events in logs.items():
            self.produce(sid, events)

        def folded() -> bool:
            views = materialize_views(self.config)
            return all(
                sid in views and as_json(session_fold_equivalent(views[sid])) == self.expected(sid)
                for sid in logs
            )

        wait_until(folded, "the session folded", timeout)

    def expected(self, sid: str, upto: int | None = None) -> Any:
        events = self.logs[sid] if upto is None else self.logs[sid][: upto + 1]
        return as_json(offline_equivalent(session_output(fold_events(events))))

    def run_processor(self, *, max_idle_s: float = 4.0, **overrides: Any) -> Processor:
        proc = Processor(self.config.with_overrides(**overrides))
        proc.run(max_idle_s=max_idle_s)
        return proc

    def start_thread(self, **overrides: Any) -> tuple[Processor, threading.Thread]:
        proc = Processor(self.config.with_overrides(**overrides))
        thread = threading.Thread(target=proc.run, daemon=True)
        thread.start()
        return proc, thread

    def spawn(
        self,
        instance_id: str,
        *extra: str,
        env: dict[str, str] | None = None,
        log: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """A real `processor run` OS process (for SIGKILL tests); ``env`` adds
        to the environment, ``log`` names its output file."""
        cmd = [
            sys.executable,
            "-m",
            "processor",
            "run",
            "-b",
            self.config.bootstrap_servers,
            "--topic-prefix",
            self.config.topic_prefix,
            "--group-id",
            self.config.group_id,
            "--instance-id",
            instance_id,
            "--transaction-timeout-ms",
            "10000",
            *extra,
        ]
        full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
        if log is None:
            log = Path(tempfile.gettempdir()) / f"{self.config.topic_prefix}-{instance_id}.log"
        with log.open("ab") as sink:  # a file, not a pipe: a chatty child never blocks
            # dies with the test run, however it ends (children.py)
            return popen_tied(cmd, env=full_env, stdout=sink, stderr=sink)


def as_json(value: Any) -> Any:
    return orjson.loads(orjson.dumps(value))


def sessions(n: int, length: int, seed: int = 1) -> dict[str, list[Event]]:
    rng = random.Random(seed)
    return {f"s{i:03d}": generate_session(random.Random(rng.random()), length) for i in range(n)}


_counter = iter(range(1_000_000))


@pytest.fixture
def stack(kafka_bootstrap: str) -> Iterator[Stack]:
    prefix = f"t{os.getpid()}x{next(_counter)}x{int(time.time() * 1000) % 100000}"
    config = ServiceConfig(
        bootstrap_servers=kafka_bootstrap,
        topic_prefix=prefix,
        group_id=f"{prefix}-group",
        partitions=3,
        commit_interval_ms=100,
        transaction_timeout_ms=10_000,
    )
    create_topics(clients.admin(config), config)
    yield Stack(config)


def wait_until(check: Any, what: str, timeout: float = 90, poll_s: float = 0.2) -> None:
    """Poll ``check`` until true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll_s)
