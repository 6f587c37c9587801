"""``processor run``: one member of the processor consumer group."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

import click
from confluent_kafka import KafkaException

from processor.cli.common import service_options
from processor.config import ServiceConfig
from processor.core.errors import Unavailable
from processor.kafka.client_errors import (
    KafkaFatal,
    configure_librdkafka_logging,
    one_line,
)
from processor.service.loop.runner import Processor
from processor.service.loop.stopping import EXIT_UNCOMMITTED, STOPPING, Watchdog, uncommitted_line
from processor.service.ops.http import PathHandler, serve
from processor.service.partitions.restore import AnchorError
from processor.service.queries.query_setup import query_endpoint
from processor.telemetry.metrics import Metrics

_T = TypeVar("_T")


@click.command()
@service_options
@click.option(
    "--instance-id",
    default=None,
    help="Stable id of this member (transactional id suffix; static membership "
    "id). Keep it across restarts so a crashed instance is fenced at once.",
)
@click.option(
    "--static-membership/--dynamic-membership",
    default=None,
    help="Join with group.instance.id = instance id (no rebalance on restart).",
)
@click.option(
    "--group-protocol",
    type=click.Choice(["auto", "classic", "consumer"]),
    default=None,
    help="Consumer group protocol: auto (default: consumer where the broker's "
    "group.consumer.session.timeout.ms is at most 10 s, else classic), classic, or "
    "consumer (KIP-848, Kafka 4.0+; session timeout and heartbeat are the broker's).",
)
@click.option(
    "--commit-interval-ms",
    type=int,
    default=None,
    help="Longest time a batch stays open before its transaction commits.",
)
@click.option("--max-batch-events", type=int, default=None)
@click.option(
    "--anchor-policy",
    type=click.Choice(["fail", "rebuild"]),
    default=None,
    help="What to do when the events log no longer matches the checkpoints.",
)
@click.option(
    "--at-least-once",
    "at_least_once",
    is_flag=True,
    default=False,
    help="No transactions (brokers without them); seq watermarks make replays harmless.",
)
@click.option(
    "--metrics-port",
    type=int,
    default=None,
    help="Serve /metrics, /healthz, /readyz on this port (0 picks one).",
)
@click.option("--metrics-host", default=None)
@click.option(
    "--inspect/--no-inspect",
    "inspect",
    default=None,
    help="Also serve the inspector page under /inspect/ on the metrics port (off by default).",
)
@click.option(
    "--inspect-token",
    default=None,
    help="Token the inspector's redrive action requires (none: redrive off).",
)
@click.option(
    "--queries/--no-queries",
    "queries",
    default=None,
    help="Answer GET /sessions/<id>/... on the metrics port for the owned sessions "
    "(others are redirected to their owner).",
)
@click.option(
    "--query-advertise",
    default=None,
    help="URL other members redirect queries to (default: http://<metrics-host>:<port>).",
)
@click.option("--transaction-timeout-ms", type=int, default=None)
@click.option(
    "--max-idle-s",
    type=float,
    default=None,
    help="Exit after this many idle seconds (batch jobs, tests).  Idle counts only once "
    "every assigned partition has been fetched to its end and nothing is in flight; "
    "partitions that never reach their end (no leader, a stalled fetch) hold the run "
    "at most max(10 x N, 60) s without progress, then it exits with a warning naming them.",
)
@click.option("--log-level", default="INFO", show_default=True)
@click.option(
    "--kafka-log-level",
    default="OFF",
    show_default=True,
    help="Level from which librdkafka's own log lines are shown (DEBUG .. "
    "CRITICAL, or OFF); they go through Python logging as processor.librdkafka.",
)
def run(
    config: ServiceConfig,
    instance_id: str | None,
    static_membership: bool | None,
    group_protocol: str | None,
    commit_interval_ms: int | None,
    max_batch_events: int | None,
    anchor_policy: str | None,
    at_least_once: bool,
    metrics_port: int | None,
    metrics_host: str | None,
    inspect: bool | None,
    inspect_token: str | None,
    queries: bool | None,
    query_advertise: str | None,
    transaction_timeout_ms: int | None,
    max_idle_s: float | None,
    log_level: str,
    kafka_log_level: str,
) -> None:
    """Fold session events into views and checkpoints (exactly-once by default).

    Exit status: 0 after a stop, 1 when Kafka refuses (a missing ACL, a failed
    handshake, a fatal producer error: one line on stderr names it), 3 when
    the events log no longer matches the checkpoints, 4 when a stop left the
    open batch uncommitted (no broker answered, or the stop bound passed:
    ``stop_bound_s``, default 30 s; docs/operations.md).
    """
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    configure_librdkafka_logging(kafka_log_level.upper())
    config = config.with_overrides(
        instance_id=instance_id,
        static_membership=static_membership,
        group_protocol=group_protocol,
        commit_interval_ms=commit_interval_ms,
        max_batch_events=max_batch_events,
        anchor_policy=anchor_policy,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        transaction_timeout_ms=transaction_timeout_ms,
        inspect=inspect,
        inspect_token=inspect_token,
        queries=queries,
        query_advertise=query_advertise,
        exactly_once=False if at_least_once else None,
    )
    metrics = Metrics()
    if config.inspect and not (config.metrics_port or metrics_port == 0):
        raise click.UsageError("--inspect serves on the metrics port: give --metrics-port")
    if config.queries and not (config.metrics_port or metrics_port == 0):
        raise click.UsageError("--queries serves on the metrics port: give --metrics-port")
    try:
        server, processor, config = _start(config, metrics, metrics_port)
    except _PortTaken as exc:
        click.echo(f"processor: {exc}", err=True)
        sys.exit(1)
    if server is not None:
        click.echo(
            f"metrics on http://{config.metrics_host}:{server.server_port}/metrics", err=True
        )

    # a stop ends within stop_bound_s, however long the brokers have been gone
    watchdog = Watchdog(config.stop_bound_s, lambda: processor.engine.batch.events)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        STOPPING.set()
        watchdog.arm()
        processor.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    watchdog.listen()
    try:
        processor.run(max_idle_s=max_idle_s)
        if processor.uncommitted is not None:
            click.echo(
                uncommitted_line(processor.uncommitted, "while no broker answered"), err=True
            )
            sys.exit(EXIT_UNCOMMITTED)
    except AnchorError as exc:
        click.echo(f"processor: {exc}", err=True)
        sys.exit(3)
    except (KafkaFatal, KafkaException, RuntimeError) as exc:
        if STOPPING.is_set():  # a wait for a broker given up for the stop
            events = processor.engine.batch.events
            click.echo(uncommitted_line(events, f"while waiting ({one_line(exc)})"), err=True)
            sys.exit(EXIT_UNCOMMITTED)
        # one line naming the cause (a missing ACL, a failed handshake), no traceback
        click.echo(f"processor: {one_line(exc)}", err=True)
        sys.exit(1)
    finally:
        if server is not None:
            server.shutdown()


class _PortTaken(Unavailable):
    """The HTTP port cannot be had (in use by another member on this host or a
    process left over, an address not of this host): one line, not a traceback."""


def _bound(config: ServiceConfig, start: Callable[[], _T]) -> _T:
    try:
        return start()
    except OSError as exc:
        where = f"{config.metrics_host}:{config.metrics_port}"
        raise _PortTaken(f"cannot serve on {where}: {exc.strerror or exc}") from None


def _start(
    config: ServiceConfig, metrics: Metrics, metrics_port: int | None
) -> tuple[Any, Processor, ServiceConfig]:
    """The member and its HTTP port (the port first when it answers queries: the
    member advertises its URL when it joins); :class:`_PortTaken` when the port
    cannot be had."""
    server: Any = None
    if config.queries:  # the port first: the member advertises its URL when it joins
        base = config

        def with_inspector(handler: PathHandler) -> Any:
            from processor.inspect.mount import serve_with_inspector

            mounted = serve_with_inspector(metrics, base, queries=handler)
            click.echo(f"inspector on {mounted.url}", err=True)
            return mounted

        serving = with_inspector if config.inspect else None
        server, endpoint, config = _bound(config, lambda: query_endpoint(base, metrics, serving))
        click.echo(f"queries on {config.query_advertise}/sessions/", err=True)
        processor = Processor(config, metrics=metrics, queries=endpoint)
    else:
        processor = Processor(config, metrics=metrics)
    if server is not None:
        pass  # serving already (the queries' port)
    elif config.inspect:
        from processor.inspect.mount import serve_with_inspector

        server = _bound(config, lambda: serve_with_inspector(metrics, config))
        click.echo(f"inspector on {server.url}", err=True)
    elif config.metrics_port or metrics_port == 0:
        server = _bound(config, lambda: serve(metrics, config.metrics_host, config.metrics_port))
    return server, processor, config
