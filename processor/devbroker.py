"""A real, local Apache Kafka broker (KRaft, one node) for tests and demos.

The broker is assembled from Maven Central jars: ``deploy/kafka/pom.xml`` pins
``org.apache.kafka:kafka_2.13`` plus a log4j2 binding, and :func:`resolve_jars`
copies the runtime dependencies into an ignored cache once.  :class:`LocalBroker`
writes a ``server.properties`` for a combined broker+controller on 127.0.0.1
with free ports, formats the storage and runs ``kafka.Kafka`` in a JVM until it
answers a metadata request.

Stdlib only at import time; the readiness probe imports confluent_kafka lazily
and falls back to a TCP connect plus the "Kafka Server started" log line.

CLI (also ``deploy/kafka/broker.sh``)::

    python -m processor.devbroker start  [--dir D] [--port P]   # daemon, prints bootstrap
    python -m processor.devbroker stop   [--dir D] [--purge]
    python -m processor.devbroker status [--dir D]
    python -m processor.devbroker resolve                       # prints the jar folder
    python -m processor.devbroker run    [--dir D] [--port P]   # foreground until Ctrl-C/SIGTERM

Environment: ``PROCESSOR_KAFKA_CACHE`` (cache root, default
``~/.cache/processor-kafka``; jars go to ``<root>/<kafka version>/jars``),
``PROCESSOR_KAFKA_JVM_OPTS`` (extra JVM options, shell-split), ``JAVA_HOME``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
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
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Self

from processor.kafka_dist import (
    _BOOTSTRAP,
    _LOG,
    _PID,
    _PROPS,
    _STATE,
    DEFAULT_JVM_OPTS,
    HOST,
    LOG4J_CONFIG,
    READY_TIMEOUT_S,
    STARTED_LINE,
    STOP_TIMEOUT_S,
    BrokerError,
    admin_ready,
    default_cache_root,
    default_jars_dir,
    default_state_dir,
    die_with_parent,
    free_ports,
    is_our_broker,
    java_binary,
    kafka_version,
    load_prctl,
    port_free,
    random_cluster_id,
    read_properties,
    resolve_jars,
    server_properties,
    tail,
    tail_text,
    tcp_open,
    wait_pid_gone,
    write_properties,
)

__all__ = [
    "DEFAULT_JVM_OPTS",
    "BrokerError",
    "BrokerState",
    "LocalBroker",
    "default_cache_root",
    "default_jars_dir",
    "default_state_dir",
    "kafka_version",
    "main",
    "random_cluster_id",
    "read_state",
    "resolve_jars",
    "server_properties",
    "stop_dir",
]


# ------------------------------------------------------------------------- state


@dataclass(frozen=True)
class BrokerState:
    """What a broker's working dir records (``broker.json``)."""

    workdir: Path
    pid: int
    bootstrap: str
    port: int
    controller_port: int
    cluster_id: str

    @property
    def running(self) -> bool:
        return is_our_broker(self.pid, self.workdir / _PROPS)


def read_state(workdir: Path | str) -> BrokerState | None:
    """The recorded state of the broker in ``workdir``, or None if it never started."""
    wd = Path(workdir).expanduser().resolve()
    try:
        raw: dict[str, Any] = json.loads((wd / _STATE).read_text())
        return BrokerState(
            workdir=wd,
            pid=int(raw["pid"]),
            bootstrap=str(raw["bootstrap"]),
            port=int(raw["port"]),
            controller_port=int(raw["controller_port"]),
            cluster_id=str(raw["cluster_id"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def stop_dir(workdir: Path | str, timeout: float = STOP_TIMEOUT_S) -> bool:
    """Stop the (detached) broker recorded in ``workdir``: SIGTERM, SIGKILL after ``timeout``.

    Returns True if a running broker was stopped, False if none was running.
    """
    state = read_state(workdir)
    if state is None or not state.running:
        if state is not None:
            (state.workdir / _PID).unlink(missing_ok=True)
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(state.pid, signal.SIGTERM)
    if not wait_pid_gone(state.pid, timeout):
        with contextlib.suppress(ProcessLookupError):
            os.kill(state.pid, signal.SIGKILL)
        if not wait_pid_gone(state.pid, 10.0):
            raise BrokerError(f"broker pid {state.pid} survived SIGKILL")
    (state.workdir / _PID).unlink(missing_ok=True)
    return True


# ------------------------------------------------------------------------ broker


class LocalBroker:
    """One local KRaft Kafka broker (combined broker+controller) on 127.0.0.1.

    >>> with LocalBroker() as broker:          # doctest: +SKIP
    ...     produce_to(broker.bootstrap)

    ``daemon=True`` starts the JVM in its own session and leaves it running when
    this process exits (the CLI's ``start``); otherwise the JVM gets SIGTERM if
    the thread that started it dies (Linux PR_SET_PDEATHSIG) and at interpreter
    exit, so a killed test run leaves no broker behind.
    """

    def __init__(
        self,
        *,
        jars_dir: Path | str | None = None,
        keep: bool = False,
        daemon: bool = False,
        jvm_opts: Sequence[str] | None = None,
        overrides: Mapping[str, str] | None = None,
        ready_timeout: float = READY_TIMEOUT_S,
    ) -> None:
        self.jars_dir = Path(jars_dir) if jars_dir is not None else None
        self.keep = keep
        self.daemon = daemon
        self.jvm_opts: tuple[str, ...] = tuple(DEFAULT_JVM_OPTS if jvm_opts is None else jvm_opts)
        self.overrides: dict[str, str] = dict(overrides or {})
        self.ready_timeout = ready_timeout
        self.timings: dict[str, float] = {}
        self.workdir: Path | None = None
        self.port: int | None = None
        self.controller_port: int | None = None
        self.cluster_id: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._owns_workdir = False
        self._lock = threading.Lock()

    # -- properties
    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:<port>`` of the PLAINTEXT listener (after :meth:`start`)."""
        if self.port is None:
            raise BrokerError("broker not started")
        return f"{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def log_path(self) -> Path:
        if self.workdir is None:
            raise BrokerError("broker not started")
        return self.workdir / _LOG

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.log_path, lines)

    # -- lifecycle
    def start(self, workdir: Path | str | None = None, port: int | None = None) -> str:
        """Format (if needed) and start the broker; block until it serves metadata.

        ``workdir`` defaults to a fresh temp dir (removed by :meth:`stop` unless
        ``keep``); a given dir is kept, and its data and cluster id are reused on
        a restart.  ``port`` is the PLAINTEXT port (default: a free one, or the
        dir's previous one if still free).  Returns :attr:`bootstrap`.  Raises
        :class:`BrokerError` (with the log's tail) if the broker exits or is not
        ready within ``ready_timeout``; the dir is then kept for inspection.
        """
        with self._lock:
            if self._proc is not None:
                raise BrokerError(f"already started at {self.bootstrap}")
            t0 = time.monotonic()
            jars = resolve_jars(self.jars_dir)
            self.timings["resolve_s"] = time.monotonic() - t0
            if workdir is None:
                wd = Path(tempfile.mkdtemp(prefix="processor-kafka-"))
                self._owns_workdir = True
            else:
                wd = Path(workdir).expanduser().resolve()
                wd.mkdir(parents=True, exist_ok=True)
                self._owns_workdir = False
            self.workdir = wd
            try:
                self._start_in(wd, jars, port)
            except BaseException:
                # the workdir (log, properties) stays for a post-mortem
                self._kill()
                self.port = None
                raise
            self.timings["start_to_ready_s"] = time.monotonic() - t0
            if not self.daemon:
                atexit.register(self.stop)
            return self.bootstrap

    def _start_in(self, wd: Path, jars: Path, port: int | None) -> None:
        prev = read_state(wd)
        if prev is not None and prev.running:
            raise BrokerError(f"a broker already runs from {wd} (pid {prev.pid}, {prev.bootstrap})")
        data = wd / "data"
        cluster_id = read_properties(data / "meta.properties").get("cluster.id")
        self.cluster_id = cluster_id or random_cluster_id()
        if port is None and prev is not None and port_free(prev.port):
            port = prev.port
        cport = prev.controller_port if prev is not None else None
        if cport is None or cport == port or not port_free(cport):
            cport = next(p for p in free_ports(2) if p != port)
        if port is None:
            port = next(p for p in free_ports(2) if p != cport)
        self.port, self.controller_port = port, cport
        props_path = wd / _PROPS
        write_properties(props_path, server_properties(port, cport, data, self.overrides))

        java = java_binary()
        jvm = [
            *self.jvm_opts,
            *shlex.split(os.environ.get("PROCESSOR_KAFKA_JVM_OPTS", "")),
            f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
        ]
        classpath = str(jars / "*")
        t0 = time.monotonic()
        fmt = subprocess.run(
            [
                java,
                *jvm,
                "-cp",
                classpath,
                "kafka.tools.StorageTool",
                "format",
                "-t",
                self.cluster_id,
                "-c",
                str(props_path),
                "--ignore-formatted",
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        self.timings["format_s"] = time.monotonic() - t0
        if fmt.returncode != 0:
            raise BrokerError(
                f"kafka storage format failed ({fmt.returncode}):\n"
                f"{tail_text(fmt.stdout + fmt.stderr, 40)}"
            )

        log = wd / _LOG
        if log.exists():
            log.replace(wd / (_LOG + ".1"))
        preexec = die_with_parent if not self.daemon and load_prctl() else None
        t1 = time.monotonic()
        with open(log, "wb") as out:
            self._proc = subprocess.Popen(
                [java, *jvm, "-cp", classpath, "kafka.Kafka", str(props_path)],
                cwd=wd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=preexec,
            )
        state = {
            "pid": self._proc.pid,
            "bootstrap": self.bootstrap,
            "port": port,
            "controller_port": cport,
            "cluster_id": self.cluster_id,
        }
        (wd / _STATE).write_text(json.dumps(state, indent=1) + "\n")
        (wd / _PID).write_text(f"{self._proc.pid}\n")
        (wd / _BOOTSTRAP).write_text(self.bootstrap + "\n")
        self._wait_ready()
        self.timings["jvm_to_ready_s"] = time.monotonic() - t1

    def _wait_ready(self) -> None:
        assert self._proc is not None and self.port is not None
        deadline = time.monotonic() + self.ready_timeout
        use_admin: bool | None = True
        while True:
            code = self._proc.poll()
            if code is not None:
                raise BrokerError(
                    f"the broker exited with code {code} before it was ready; "
                    f"{self.log_path} ends:\n{self.log_tail()}"
                )
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrokerError(
                    f"the broker was not ready within {self.ready_timeout:g}s "
                    f"at {self.bootstrap}; {self.log_path} ends:\n"
                    f"{self.log_tail()}"
                )
            if tcp_open(self.port):
                if use_admin:
                    use_admin = admin_ready(self.bootstrap, min(3.0, max(0.5, left)))
                    if use_admin:
                        return
                if use_admin is None and STARTED_LINE in self.log_tail(400):
                    return
            time.sleep(0.1)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM the broker, SIGKILL after ``timeout`` s; remove an own temp dir unless keep."""
        with self._lock:
            atexit.unregister(self.stop)
            proc, self._proc = self._proc, None
            if proc is not None and proc.poll() is None:
                t0 = time.monotonic()
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
                self.timings["stop_s"] = time.monotonic() - t0
            if self.workdir is not None:
                (self.workdir / _PID).unlink(missing_ok=True)
                if self._owns_workdir and not self.keep:
                    shutil.rmtree(self.workdir, ignore_errors=True)

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)

    def __enter__(self) -> Self:
        if self._proc is None:
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
        where = f"{HOST}:{self.port}" if self.port is not None else "not started"
        return f"<LocalBroker {where} pid={self.pid} dir={self.workdir}>"


# --------------------------------------------------------------------------- CLI


def _cmd_start(args: argparse.Namespace) -> int:
    wd = Path(args.dir).expanduser().resolve()
    state = read_state(wd)
    if state is not None and state.running:
        print(f"already running (pid {state.pid}) in {wd}", file=sys.stderr)
        print(state.bootstrap)
        return 0
    broker = LocalBroker(keep=True, daemon=True)
    bootstrap = broker.start(workdir=wd, port=args.port)
    print(
        f"kafka {kafka_version()} ready in {broker.timings['start_to_ready_s']:.1f}s, "
        f"pid {broker.pid}, dir {wd}, log {broker.log_path}",
        file=sys.stderr,
    )
    print(bootstrap, flush=True)
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    wd = Path(args.dir).expanduser().resolve()
    stopped = stop_dir(wd)
    print("stopped" if stopped else f"not running in {wd}", file=sys.stderr)
    if args.purge and wd.exists():
        shutil.rmtree(wd)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    state = read_state(args.dir)
    if state is None or not state.running:
        print("stopped")
        return 1
    print(f"running {state.bootstrap} pid {state.pid} dir {state.workdir}")
    return 0


def _cmd_resolve(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    jars = resolve_jars()
    print(f"{len(list(jars.glob('*.jar')))} jars in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    print(jars)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    broker = LocalBroker(keep=args.dir is not None)
    try:
        bootstrap = broker.start(workdir=args.dir, port=args.port)
        print(
            f"kafka {kafka_version()} ready in {broker.timings['start_to_ready_s']:.1f}s, "
            f"pid {broker.pid}, log {broker.log_path}; Ctrl-C stops",
            file=sys.stderr,
        )
        print(bootstrap, flush=True)
        while not stop.wait(0.5):
            if not broker.running():
                print(f"the broker exited; log ends:\n{broker.log_tail()}", file=sys.stderr)
                return 1
        return 0
    finally:
        broker.stop()
        for s, h in old.items():
            signal.signal(s, h)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m processor.devbroker",
        description="A local Apache Kafka broker (KRaft, one node) from Maven Central jars.",
    )
    sub = p.add_subparsers(dest="cmd", required=True)

    def with_dir(sp: argparse.ArgumentParser, default: Path | None) -> None:
        sp.add_argument(
            "--dir",
            type=Path,
            default=default,
            help=f"broker working dir (default: {default or 'a temp dir'})",
        )

    state = default_state_dir()
    s = sub.add_parser("start", help="start a detached broker, print its bootstrap address")
    with_dir(s, state)
    s.add_argument("--port", type=int, default=None, help="PLAINTEXT port (default: free)")
    s.set_defaults(func=_cmd_start)
    s = sub.add_parser("stop", help="stop the detached broker of --dir")
    with_dir(s, state)
    s.add_argument("--purge", action="store_true", help="also delete the dir (data, logs)")
    s.set_defaults(func=_cmd_stop)
    s = sub.add_parser("status", help="print whether the broker of --dir runs (exit 1 if not)")
    with_dir(s, state)
    s.set_defaults(func=_cmd_status)
    s = sub.add_parser("resolve", help="fetch the jars into the cache, print the folder")
    s.set_defaults(func=_cmd_resolve)
    s = sub.add_parser("run", help="run a broker in the foreground until Ctrl-C / SIGTERM")
    with_dir(s, None)
    s.add_argument("--port", type=int, default=None, help="PLAINTEXT port (default: free)")
    s.set_defaults(func=_cmd_run)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
