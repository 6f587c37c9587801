"""``processor demo``: the whole service end to end on a real broker.

1. use ``KAFKA_BOOTSTRAP_SERVERS`` or start a local single-node KRaft broker;
2. create the topics under a fresh prefix;
3. start two ``processor run`` processes in one consumer group;
4. drive several scripted agent sessions through the ``SessionWriter``;
5. read the views back (read_committed) and check each session against an
   offline fold of the same log; print a table and exit non-zero on any
   difference.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
import orjson

from processor.children import popen_tied, stop
from processor.cli.common import service_options
from processor.config import ServiceConfig


@contextmanager
def _broker(config: ServiceConfig, explicit: bool) -> Iterator[ServiceConfig]:
    if explicit:
        yield config
        return
    from processor.devbroker import LocalBroker

    click.echo("· no KAFKA_BOOTSTRAP_SERVERS: starting a local Kafka broker (KRaft) …", err=True)
    broker = LocalBroker()
    bootstrap = broker.start()
    click.echo(f"· broker ready at {bootstrap}", err=True)
    try:
        yield config.with_overrides(bootstrap_servers=bootstrap)
    finally:
        broker.stop()
        click.echo("· broker stopped", err=True)


def _spawn(config: ServiceConfig, instance: str) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "processor",
        "run",
        "-b",
        config.bootstrap_servers,
        "--topic-prefix",
        config.topic_prefix,
        "--group-id",
        config.group_id,
        "--instance-id",
        instance,
        "--commit-interval-ms",
        "100",
        "--log-level",
        "WARNING",
    ]
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).parents[2]),
        "PROCESSOR_STATE_DIR": config.state_dir,
    }
    return popen_tied(cmd, env=env)  # SIGTERM when the demo ends, however it ends


def _on_stop_signals() -> None:
    """SIGTERM and SIGHUP end the demo as Ctrl-C does: its ``finally`` blocks stop
    the processors and the broker (``kill <pid>`` signals the demo alone)."""

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_term)


def _summary(sid: str, views: dict[str, Any], ok: bool) -> str:
    from processor.client.views_reader import session_fold_equivalent

    doc = session_fold_equivalent(views)
    stats = doc["projections"].get("sessionStats", {})
    return (
        f"  {sid:<18} asOfSeq={doc['asOfSeq']:<4} surface={len(doc['surface']['nodes']):<3} "
        f"messages={len(doc['messages']):<3} transcript={len(doc['transcript']):<3} "
        f"turns={stats.get('turns', '?'):<3} toolCalls={stats.get('toolCalls', '?'):<3} "
        f"{'OK' if ok else 'MISMATCH'}"
    )


def _start_inspector(config: ServiceConfig, port: int) -> Any:
    from processor.inspect.server import InspectorServer

    try:
        return InspectorServer(config, port=port, token=config.inspect_token).start()
    except OSError:
        return InspectorServer(config, port=0, token=config.inspect_token).start()  # port taken


def _inspector_end(config: ServiceConfig, inspector: Any, keep: bool) -> None:
    """Print the inspector's address; with ``--inspect`` serve until Ctrl-C."""
    click.echo(f"\ninspector: {inspector.url}")
    if not keep:
        click.echo("(closed with the demo; `processor demo --inspect` keeps it open)")
        inspector.stop()
        return
    proc = _spawn(config, f"{config.topic_prefix}-a")  # live again: new events, redrive
    click.echo("open it in a browser; Ctrl-C stops the inspector, the processor and the broker")
    try:
        while proc.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        _stop_processors([proc])
        inspector.stop()


def _stop_processors(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM, and SIGKILL past the members' stop bound (children.py)."""
    for proc, code in zip(procs, stop(procs), strict=True):
        if code == -signal.SIGKILL:
            click.echo(f"· a processor did not stop in time; killed (pid {proc.pid})", err=True)


@click.command()
@service_options
@click.option("--sessions", "n_sessions", type=int, default=6, show_default=True)
@click.option(
    "--show",
    "show_session",
    default=None,
    help="Also print the full views of this session as JSON.",
)
@click.option(
    "--inspect",
    "keep_inspector",
    is_flag=True,
    default=False,
    help="Keep the inspector page (and the broker and a processor) open until Ctrl-C.",
)
@click.option(
    "--inspect-port",
    type=int,
    default=8765,
    show_default=True,
    help="Port of the inspector page (a free one when taken).",
)
def demo(
    config: ServiceConfig,
    n_sessions: int,
    show_session: str | None,
    keep_inspector: bool,
    inspect_port: int,
) -> None:
    """Run the service end to end and check it against the offline fold."""
    from processor.client.session_writer import SessionWriter
    from processor.client.views_reader import (
        materialize_views,
        offline_equivalent,
        session_fold_equivalent,
    )
    from processor.examples.make_example import scripted_sessions
    from processor.kafka import clients
    from processor.kafka.schema_registry import codec_for
    from processor.kafka.topic_admin import create_topics
    from processor.offline import fold_events, session_output

    _on_stop_signals()
    explicit = bool(os.environ.get("KAFKA_BOOTSTRAP_SERVERS")) or config.bootstrap_servers != (
        ServiceConfig().bootstrap_servers
    )
    prefix = f"demo{int(time.time())}"
    # the members' local stores live and die with the demo (its topics are new)
    state = tempfile.TemporaryDirectory(prefix="processor-demo-state-")
    config = config.with_overrides(
        topic_prefix=prefix, group_id=f"{prefix}-processor", partitions=4, state_dir=state.name
    )
    with state, _broker(config, explicit) as config:
        create_topics(clients.admin(config), config)
        click.echo(f"· topics {prefix}.events/.views/.checkpoints/.dlq/.control created", err=True)
        inspector = _start_inspector(config, inspect_port)
        click.echo(f"· inspector (live) at {inspector.url}", err=True)
        procs = [_spawn(config, f"{prefix}-a"), _spawn(config, f"{prefix}-b")]
        click.echo("· two processors started in one consumer group", err=True)
        try:
            logs = {}
            with SessionWriter(config) as writer:
                for sid, events in scripted_sessions(n_sessions):
                    for event in events:
                        writer.append_event(sid, event)
                    logs[sid] = events
                writer.flush()
            click.echo(
                f"· {len(logs)} scripted agent sessions written "
                f"({sum(len(e) for e in logs.values())} events)",
                err=True,
            )
            expected = {
                sid: orjson.loads(orjson.dumps(offline_equivalent(session_output(fold_events(ev)))))
                for sid, ev in logs.items()
            }
            deadline = time.monotonic() + 90
            got: dict[str, Any] = {}
            views: dict[str, Any] = {}
            while time.monotonic() < deadline:
                views = materialize_views(config, codec=codec_for(config))
                got = {
                    sid: orjson.loads(orjson.dumps(session_fold_equivalent(views[sid])))
                    for sid in logs
                    if sid in views
                }
                if got == expected:
                    break
                time.sleep(0.5)
        finally:
            _stop_processors(procs)
        click.echo("\nviews (read_committed) vs offline fold of the same logs:")
        bad = 0
        for sid in logs:
            ok = got.get(sid) == expected[sid]
            bad += not ok
            click.echo(_summary(sid, views[sid], ok) if sid in views else f"  {sid}: no views")
        if show_session and show_session in views:
            click.echo(
                orjson.dumps(
                    session_fold_equivalent(views[show_session]), option=orjson.OPT_INDENT_2
                ).decode()
            )
        if bad:
            click.echo(f"\n{bad} session(s) differ from the offline fold", err=True)
        else:
            click.echo(f"\nall {len(logs)} sessions match the offline fold exactly")
        _inspector_end(config, inspector, keep_inspector)
        if bad:
            sys.exit(1)
