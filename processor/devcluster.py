"""A local multi-node Apache Kafka cluster (KRaft) for fault tests.

Same Maven Central jars as :mod:`processor.devbroker`; every node is a
combined broker+controller with its own ports, ``server.properties`` and log
dir, all formatted with one cluster id, and the controllers form a static
quorum — or, with ``dedicated_controller``, the nodes are brokers only and
one more process is the cluster's one KRaft controller (isolated mode, as
production clusters run: a killed broker then loses no controller voter).
Replication is realistic (replication factor 3, ``min.insync.replicas=2``,
no unclean election), so a killed node is a real fault: leaders move, ISRs
shrink, the transaction coordinator fails over.

Nodes can be killed (SIGKILL), stopped, paused (SIGSTOP) and restarted on
their old ports and data, which is what the fault suite needs::

    with LocalCluster(3) as cluster:
        cluster.bootstrap              # "127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3"
        cluster.kill(2); cluster.restart(2)

CLI: ``python -m processor.devcluster run [--nodes 3]`` (foreground).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

from processor.kafka_dist import (
    DEFAULT_JVM_OPTS,
    HOST,
    LOG4J_CONFIG,
    BrokerError,
    admin_ready,
    die_with_parent,
    free_ports,
    java_binary,
    load_prctl,
    random_cluster_id,
    resolve_jars,
    server_properties,
    tail,
    tcp_open,
    write_properties,
)

__all__ = ["CLUSTER_PROPERTIES", "ClusterNode", "LocalCluster"]

#: Replication and fault-handling settings of a realistic small cluster.
#: ``transaction.abort.timed.out.transaction.cleanup.interval.ms`` is how
#: often the coordinator looks for transactions past their timeout (default
#: 10 s): a zombie's open transaction ends at most timeout + interval after
#: it began.  Tests shorten it so the fence bound is mostly the timeout.
CLUSTER_PROPERTIES: dict[str, str] = {
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
    "unclean.leader.election.enable": "false",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
    "replica.lag.time.max.ms": "10000",
    "num.replica.fetchers": "1",
    # KIP-848 groups (``group_protocol = "consumer"``): the broker times their
    # sessions out and sets their heartbeat; as the members' classic defaults
    # (6 s, 0.5 s) instead of the broker's 45 s and 5 s
    "group.consumer.min.session.timeout.ms": "6000",
    "group.consumer.session.timeout.ms": "6000",
    "group.consumer.min.heartbeat.interval.ms": "500",
    "group.consumer.heartbeat.interval.ms": "500",
}

#: Smaller heaps than the single broker: three JVMs share a small machine.
CLUSTER_JVM_OPTS: tuple[str, ...] = tuple(
    "-Xmx384m" if o.startswith("-Xmx") else o for o in DEFAULT_JVM_OPTS
)


@dataclass
class ClusterNode:
    node_id: int
    port: int
    controller_port: int
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = field(default=0)

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def props(self) -> Path:
        return self.workdir / "server.properties"

    @property
    def log_path(self) -> Path:
        return self.workdir / "node.log"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class LocalCluster:
    """``n`` KRaft nodes (broker+controller each) on 127.0.0.1; see the module docstring."""

    def __init__(
        self,
        nodes: int = 3,
        *,
        jars_dir: Path | str | None = None,
        overrides: Mapping[str, str] | None = None,
        jvm_opts: Sequence[str] | None = None,
        keep: bool = False,
        ready_timeout: float = 180.0,
        dedicated_controller: bool = False,
    ) -> None:
        """``dedicated_controller``: the ``nodes`` are brokers only and one more
        process is the KRaft controller (isolated mode, as production clusters
        run), so a killed broker is a broker fault alone; by default every node
        is broker and controller voter (combined mode: a killed node is also a
        voter lost, at times the active controller)."""
        if nodes < 1:
            raise BrokerError("a cluster needs at least one node")
        self.n = nodes
        self.dedicated_controller = dedicated_controller
        #: the controller-only node (``dedicated_controller``), never killed by the suite
        self.controller: ClusterNode | None = None
        self.jars_dir = Path(jars_dir) if jars_dir is not None else None
        self.overrides = dict(overrides or {})
        self.jvm_opts = tuple(CLUSTER_JVM_OPTS if jvm_opts is None else jvm_opts)
        self.keep = keep
        self.ready_timeout = ready_timeout
        self.nodes: dict[int, ClusterNode] = {}
        self.root: Path | None = None
        self.cluster_id = random_cluster_id()
        self._jars: Path | None = None
        self._lock = threading.RLock()

    # ------------------------------------------------------------ addresses

    @property
    def bootstrap(self) -> str:
        """Every node's PLAINTEXT address, comma-separated (clients survive any one down)."""
        if not self.nodes:
            raise BrokerError("cluster not started")
        return ",".join(n.address for n in self.nodes.values())

    def node(self, node_id: int) -> ClusterNode:
        return self.nodes[node_id]

    # ------------------------------------------------------------ lifecycle

    def start(self, root: Path | str | None = None) -> str:
        """Format and start every node; return when all of them serve metadata."""
        with self._lock:
            if self.nodes:
                raise BrokerError("cluster already started")
            self._jars = resolve_jars(self.jars_dir)
            self.root = (
                Path(root)
                if root is not None
                else Path(tempfile.mkdtemp(prefix="processor-cluster-"))
            )
            ports = free_ports(2 * self.n + (2 if self.dedicated_controller else 0))
            for i in range(self.n):
                node_id = i + 1
                wd = self.root / f"node{node_id}"
                wd.mkdir(parents=True, exist_ok=True)
                self.nodes[node_id] = ClusterNode(node_id, ports[2 * i], ports[2 * i + 1], wd)
            if self.dedicated_controller:
                wd = self.root / "controller"
                wd.mkdir(parents=True, exist_ok=True)
                self.controller = ClusterNode(self.n + 1, ports[-2], ports[-1], wd)
                voting = [self.controller]
            else:
                voting = list(self.nodes.values())
            voters = ",".join(f"{n.node_id}@{HOST}:{n.controller_port}" for n in voting)
            for n in self._all():
                props = server_properties(
                    n.port,
                    n.controller_port,
                    n.workdir / "data",
                    {
                        **CLUSTER_PROPERTIES,
                        "node.id": str(n.node_id),
                        "controller.quorum.voters": voters,
                        **self._roles(n),
                        **self.overrides,
                    },
                )
                if n is self.controller:  # a controller-only node serves no clients
                    props.pop("advertised.listeners", None)
                    props.pop("inter.broker.listener.name", None)
                write_properties(n.props, props)
                self._format(n)
            atexit.register(self.stop)
            try:
                for n in self._all():
                    self._spawn(n)
                for n in self._all():
                    self._wait_ready(n)
            except BaseException:
                self.stop()
                raise
            return self.bootstrap

    def _all(self) -> list[ClusterNode]:
        """Every process of the cluster: the controller-only node first."""
        return [*([self.controller] if self.controller else []), *self.nodes.values()]

    def _roles(self, n: ClusterNode) -> dict[str, str]:
        """The node's roles and listeners when the controller is a node of its own."""
        if not self.dedicated_controller:
            return {}
        if n is self.controller:
            return {
                "process.roles": "controller",
                "listeners": f"CONTROLLER://{HOST}:{n.controller_port}",
            }
        return {"process.roles": "broker", "listeners": f"PLAINTEXT://{HOST}:{n.port}"}

    def _jvm(self) -> list[str]:
        return [
            *self.jvm_opts,
            *shlex.split(os.environ.get("PROCESSOR_KAFKA_JVM_OPTS", "")),
            # PROCESSOR_KAFKA_LOG4J: a log4j2 file of one's own (e.g. DEBUG for the
            # transaction coordinator) when diagnosing a fault-suite failure; made
            # absolute, the nodes run in their own directories
            f"-Dlog4j2.configurationFile={_log4j_config()}",
        ]

    def _format(self, n: ClusterNode) -> None:
        assert self._jars is not None
        fmt = subprocess.run(
            [
                java_binary(),
                *self._jvm(),
                "-cp",
                str(self._jars / "*"),
                "kafka.tools.StorageTool",
                "format",
                "-t",
                self.cluster_id,
                "-c",
                str(n.props),
                "--ignore-formatted",
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        if fmt.returncode != 0:
            raise BrokerError(
                f"node {n.node_id}: storage format failed ({fmt.returncode}):\n"
                f"{(fmt.stdout + fmt.stderr)[-3000:]}"
            )

    def _spawn(self, n: ClusterNode) -> None:
        assert self._jars is not None
        preexec = die_with_parent if load_prctl() else None
        if n.log_path.exists():
            n.log_path.replace(n.workdir / f"node.log.{n.restarts}")
        with open(n.log_path, "wb") as out:
            n.proc = subprocess.Popen(
                [
                    java_binary(),
                    *self._jvm(),
                    "-cp",
                    str(self._jars / "*"),
                    "kafka.Kafka",
                    str(n.props),
                ],
                cwd=n.workdir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=preexec,
            )

    def _wait_ready(self, n: ClusterNode, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.ready_timeout)
        while True:
            assert n.proc is not None
            code = n.proc.poll()
            if code is not None:
                raise BrokerError(
                    f"node {n.node_id} exited with code {code}; log ends:\n{tail(n.log_path)}"
                )
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"node {n.node_id} not ready in time; log ends:\n{tail(n.log_path)}"
                )
            if n is self.controller:
                if tcp_open(n.controller_port):
                    return
            elif tcp_open(n.port) and admin_ready(n.address, 3.0):
                return
            time.sleep(0.2)

    def kill(self, node_id: int) -> None:
        """SIGKILL a node (a crash: no controlled shutdown, no leader hand-over)."""
        with self._lock:
            n = self.nodes[node_id]
            if n.proc is not None and n.proc.poll() is None:
                n.proc.kill()
                n.proc.wait(30)
            n.proc = None

    def pause(self, node_id: int) -> None:
        n = self.nodes[node_id]
        if n.proc is not None:
            n.proc.send_signal(signal.SIGSTOP)

    def resume(self, node_id: int) -> None:
        n = self.nodes[node_id]
        if n.proc is not None:
            n.proc.send_signal(signal.SIGCONT)

    def restart(self, node_id: int, *, wait: bool = True) -> None:
        """Start a stopped or killed node again on its ports and data."""
        with self._lock:
            n = self.nodes[node_id]
            if n.running():
                raise BrokerError(f"node {node_id} is running")
            n.restarts += 1
            self._spawn(n)
        if wait:
            self._wait_ready(n)

    def stop(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL) and remove a temp root unless keep."""
        with self._lock:
            atexit.unregister(self.stop)
            # brokers before the controller-only node: a broker's controlled
            # shutdown asks the controller
            _terminate(list(self.nodes.values()))
            _terminate([self.controller] if self.controller else [])
            if self.root is not None and not self.keep:
                shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        if not self.nodes:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<LocalCluster {self.n} nodes {self.bootstrap if self.nodes else 'stopped'}>"


def _terminate(nodes: list[ClusterNode]) -> None:
    """SIGTERM the nodes, then SIGKILL those still running 20 s later."""
    for n in nodes:
        if n.proc is not None and n.proc.poll() is None:
            n.proc.send_signal(signal.SIGCONT)  # a paused JVM cannot handle SIGTERM
            n.proc.terminate()
    for n in nodes:
        if n.proc is not None:
            try:
                n.proc.wait(20)
            except subprocess.TimeoutExpired:
                n.proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    n.proc.wait(10)
            n.proc = None


def _log4j_config() -> Path:
    own = os.environ.get("PROCESSOR_KAFKA_LOG4J")
    return Path(own).absolute() if own else LOG4J_CONFIG


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m processor.devcluster",
        description="A local multi-node KRaft cluster (foreground).",
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the cluster until Ctrl-C / SIGTERM")
    r.add_argument("--nodes", type=int, default=3)
    r.add_argument(
        "--dedicated-controller",
        action="store_true",
        help="the nodes are brokers only; one more process is the KRaft controller",
    )
    r.add_argument("--dir", type=Path, default=None, help="root dir (kept); default a temp dir")
    args = p.parse_args(argv)
    stop = threading.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda *_: stop.set())
    cluster = LocalCluster(
        args.nodes, keep=args.dir is not None, dedicated_controller=args.dedicated_controller
    )
    try:
        print(cluster.start(args.dir), flush=True)
        while not stop.wait(0.5):
            down = [n.node_id for n in cluster.nodes.values() if not n.running()]
            if down:
                print(f"nodes {down} exited", file=sys.stderr)
                return 1
        return 0
    except BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
