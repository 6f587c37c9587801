"""What a local Kafka broker is made of: the jars, its configuration, and the
process helpers that ``devbroker`` (one node) and ``devcluster`` (three
nodes) share.

The jars come from Maven Central: ``deploy/kafka/pom.xml`` pins
``org.apache.kafka:kafka_2.13`` plus a log4j2 binding, and
:func:`resolve_jars` copies the runtime dependencies into an ignored cache
once.  Stdlib only at import time; :func:`admin_ready` imports confluent_kafka
lazily.
"""

from __future__ import annotations

import base64
import ctypes
import fcntl
import functools
import hashlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from processor.core.errors import Unavailable

REPO_ROOT = Path(__file__).resolve().parent.parent
#: Where an installed wheel keeps ``pom.xml`` and ``log4j2.properties`` (setup.py
#: copies them from ``deploy/kafka/``; the checkout's copy wins when present).
PACKAGED_DIR = Path(__file__).resolve().parent / "devbroker_files"


def deploy_dir() -> Path:
    """``deploy/kafka`` of a source checkout, else the wheel's packaged copy."""
    checkout = REPO_ROOT / "deploy" / "kafka"
    return checkout if (checkout / "pom.xml").is_file() else PACKAGED_DIR


DEPLOY_DIR = deploy_dir()
POM = DEPLOY_DIR / "pom.xml"
LOG4J_CONFIG = DEPLOY_DIR / "log4j2.properties"

HOST = "127.0.0.1"
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0
STARTED_LINE = "Kafka Server started"

#: JVM options of the broker.  ``-XX:TieredStopAtLevel=1`` (C1 only) measured
#: faster to ready on this 2-core machine; see deploy/kafka/README.md.
DEFAULT_JVM_OPTS: tuple[str, ...] = (
    "-Xms128m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Djava.awt.headless=true",
)

_MARKER = ".resolved"
_STATE = "broker.json"
_PID = "broker.pid"
_BOOTSTRAP = "bootstrap"
_LOG = "broker.log"
_PROPS = "server.properties"


class BrokerError(Unavailable, RuntimeError):
    """The local broker could not be resolved, started or stopped."""


# --------------------------------------------------------------------------- jars


@functools.cache
def kafka_version(pom: Path = POM) -> str:
    """The Kafka version pinned in ``deploy/kafka/pom.xml`` (property ``kafka.version``)."""
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    if not pom.is_file():
        raise BrokerError(
            f"the broker's {pom} is missing (a wheel built without setup.py's data step?)"
        )
    node = ET.parse(pom).getroot().find("m:properties/m:kafka.version", ns)
    if node is None or not (node.text or "").strip():
        raise BrokerError(f"{pom}: no <kafka.version> property")
    return (node.text or "").strip()


def default_cache_root() -> Path:
    """``$PROCESSOR_KAFKA_CACHE`` or ``~/.cache/processor-kafka``."""
    env = os.environ.get("PROCESSOR_KAFKA_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "processor-kafka"


def default_jars_dir() -> Path:
    """``<cache root>/<kafka version>/jars``."""
    return default_cache_root() / kafka_version() / "jars"


def default_state_dir() -> Path:
    """Working dir of the CLI's daemon broker: ``<cache root>/<kafka version>/broker``."""
    return default_cache_root() / kafka_version() / "broker"


def pom_digest(pom: Path) -> str:
    return hashlib.sha256(pom.read_bytes()).hexdigest()


def is_resolved(jars: Path, digest: str) -> bool:
    marker = jars / _MARKER
    try:
        ok = marker.read_text().strip() == digest
    except OSError:
        return False
    return ok and any(jars.glob("kafka_2.13-*.jar"))


def resolve_jars(cache_dir: Path | str | None = None, *, pom: Path = POM) -> Path:
    """Copy the broker's runtime jars into ``cache_dir`` (default :func:`default_jars_dir`).

    Runs ``mvn -B -q dependency:copy-dependencies`` only when the folder has no
    marker for the current ``pom.xml`` (its sha256 is the marker's content), so
    a warm cache costs nothing and editing the pom re-resolves.  Concurrent
    callers serialise on a lock file next to the folder.  Returns the folder.
    """
    jars = Path(cache_dir).expanduser() if cache_dir is not None else default_jars_dir()
    digest = pom_digest(pom)
    if is_resolved(jars, digest):
        return jars
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError("mvn not found on PATH: Maven is needed to fetch the Kafka jars")
    jars.mkdir(parents=True, exist_ok=True)
    with open(jars.parent / f".{jars.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_resolved(jars, digest):
            return jars
        (jars / _MARKER).unlink(missing_ok=True)
        for old in jars.glob("*.jar"):
            old.unlink()
        cmd = [
            mvn,
            "-B",
            "-q",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={jars}",
        ]
        try:
            proc = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=900,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise BrokerError(f"mvn timed out resolving the Kafka jars: {cmd}") from exc
        if proc.returncode != 0 or not any(jars.glob("kafka_2.13-*.jar")):
            out = tail_text(proc.stdout + proc.stderr, 40)
            raise BrokerError(
                f"mvn failed ({proc.returncode}) resolving the Kafka jars into {jars}:\n{out}"
            )
        (jars / _MARKER).write_text(digest + "\n")
    return jars


# ----------------------------------------------------------------------- config


def random_cluster_id() -> str:
    """22 chars of unpadded base64url from a random UUID, never starting with ``-``."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def server_properties(
    port: int, controller_port: int, log_dir: Path | str, overrides: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The ``server.properties`` of a one-node combined broker+controller on 127.0.0.1."""
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{HOST}:{controller_port}",
        "listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(log_dir),
        "num.partitions": "1",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "group.initial.rebalance.delay.ms": "0",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "share.coordinator.state.topic.num.partitions": "1",
        # compaction that tests can observe within seconds (per topic they still
        # need cleanup.policy=compact, a short segment.ms and a low dirty ratio)
        "log.cleaner.backoff.ms": "200",
        "log.cleaner.threads": "1",
        "log.cleaner.dedupe.buffer.size": "2097152",
        # a dead member's timed-out transaction is aborted within 1 s, not 10 s
        # (docs/operations.md "A member dies")
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
        # KIP-848 groups: the broker times their sessions out (45 s and a 45 s
        # minimum by default); as the cluster's (devcluster.py), so that the
        # members' ``group_protocol = "auto"`` picks KIP-848 here too
        "group.consumer.min.session.timeout.ms": "6000",
        "group.consumer.session.timeout.ms": "6000",
        "group.consumer.min.heartbeat.interval.ms": "500",
        "group.consumer.heartbeat.interval.ms": "500",
        # a 2-core test machine
        "num.network.threads": "2",
        "num.io.threads": "2",
        "num.recovery.threads.per.data.dir": "1",
    }
    props.update(overrides or {})
    return props


def write_properties(path: Path, props: Mapping[str, str]) -> None:
    lines = ["# written by processor.devbroker"]
    lines += [f"{k}={v}" for k, v in props.items()]
    path.write_text("\n".join(lines) + "\n")


def read_properties(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")) and "=" in line:
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


# ------------------------------------------------------------------------ helpers


def java_binary() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise BrokerError("java not found (install a JDK 17+ or set JAVA_HOME)")
    return java


def free_ports(n: int) -> list[int]:
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def tcp_open(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1.0):
            return True
    except OSError:
        return False


def tail_text(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


def tail(path: Path, lines: int = 40) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            return tail_text(f.read().decode("utf-8", "replace"), lines)
    except OSError:
        return f"(no log at {path})"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purposes
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return True


def is_our_broker(pid: int, props: Path) -> bool:
    """``pid`` is alive and (where /proc exists) runs kafka.Kafka on ``props``."""
    if not pid_alive(pid):
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return not Path("/proc/self").exists()
    return b"kafka.Kafka" in argv and str(props).encode() in argv


def wait_pid_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.1)
    return not pid_alive(pid)


_prctl: Callable[..., int] | None = None


def die_with_parent() -> None:  # runs in the child between fork and exec
    if _prctl is not None:
        _prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG


def load_prctl() -> bool:
    """Resolve prctl(2) before forking, so the pre-exec hook does no dlopen/malloc."""
    global _prctl
    if _prctl is None and sys.platform.startswith("linux"):
        try:
            _prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            return False
    return _prctl is not None


def admin_ready(bootstrap: str, timeout: float) -> bool | None:
    """True when an AdminClient gets metadata with a broker; None without confluent_kafka."""
    try:
        from confluent_kafka.admin import AdminClient
    except ImportError:
        return None
    quiet = logging.getLogger("processor.devbroker.librdkafka")
    quiet.propagate = False
    if not quiet.handlers:
        quiet.addHandler(logging.NullHandler())
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "logger": quiet,
        "socket.connection.setup.timeout.ms": 2000,
    }
    admin = AdminClient(conf)
    try:
        md = admin.list_topics(timeout=timeout)
    except Exception:
        return False
    return bool(md.brokers)
