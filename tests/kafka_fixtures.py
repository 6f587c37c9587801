"""pytest plugin: a real Kafka broker for the tests that ask for ``kafka_bootstrap``.

Load it with ``-p tests.kafka_fixtures`` (or ``from tests.kafka_fixtures import *``
in a conftest).  The broker, chosen once per test session:

1. ``KAFKA_BOOTSTRAP_SERVERS`` when set (an external cluster; nothing is started);
2. testcontainers' Kafka (KRaft) when a Docker engine answers
   (image ``PROCESSOR_KAFKA_IMAGE``, default testcontainers' own);
3. otherwise :class:`processor.devbroker.LocalBroker`: a local KRaft broker
   from Maven Central jars (see deploy/kafka/README.md).

``PROCESSOR_TEST_KAFKA=local`` or ``=docker`` skips the choice.  Never a mock.
"""

from __future__ import annotations

import importlib
import itertools
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

__all__ = ["docker_available", "kafka_bootstrap", "unique_prefix"]

_counter = itertools.count()


def unique_prefix(label: str = "t") -> str:
    """A topic/group prefix unique to this call (process, counter, random part)."""
    return f"{label}{os.getpid()}x{next(_counter)}x{uuid.uuid4().hex[:8]}"


def docker_available(timeout: float = 5.0) -> bool:
    """True when a Docker engine answers within ``timeout`` seconds."""
    try:
        import docker

        client = docker.from_env(timeout=int(max(1, timeout)))
        try:
            return bool(client.ping())
        finally:
            client.close()
    except ImportError:
        pass
    except Exception:
        return False
    exe = shutil.which("docker")
    if exe is None:
        return False
    try:
        return (
            subprocess.run(
                [exe, "info"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=timeout,
                check=False,
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def _kafka_container_class() -> Any:
    for name in ("testcontainers.community.kafka", "testcontainers.kafka"):
        try:
            return importlib.import_module(name).KafkaContainer
        except ImportError:
            continue
    return None


def _container_broker() -> Iterator[str] | None:
    cls = _kafka_container_class()
    if cls is None or not docker_available():
        return None

    def run() -> Iterator[str]:
        image = os.environ.get("PROCESSOR_KAFKA_IMAGE")
        container = (cls(image) if image else cls()).with_kraft()
        with container:
            yield str(container.get_bootstrap_server())

    return run()


def _local_broker() -> Iterator[str]:
    from processor.devbroker import LocalBroker

    with LocalBroker() as broker:
        yield broker.bootstrap


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, the controller starts one local broker for every
    worker (they inherit ``KAFKA_BOOTSTRAP_SERVERS``) instead of one each,
    unless a cluster is configured or the run leaves the Kafka tests out."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip():
        return
    if "not kafka" in (config.option.markexpr or ""):
        return
    mode = os.environ.get("PROCESSOR_TEST_KAFKA", "auto").strip().lower()
    if mode == "docker" or (mode == "auto" and docker_available()):
        return
    from processor.devbroker import LocalBroker

    broker = LocalBroker()
    os.environ["KAFKA_BOOTSTRAP_SERVERS"] = broker.start()
    config.add_cleanup(broker.stop)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """``host:port`` of a real Kafka broker for the whole test session."""
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    if external:
        yield external
        return
    mode = os.environ.get("PROCESSOR_TEST_KAFKA", "auto").strip().lower()
    source: Iterator[str] | None = None
    if mode in ("auto", "docker"):
        source = _container_broker()
        if source is None and mode == "docker":
            pytest.fail("PROCESSOR_TEST_KAFKA=docker but no Docker engine / testcontainers")
    if source is None:
        source = _local_broker()
    yield from source
