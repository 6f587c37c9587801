"""``processor ship ROOT``: follow the runtime's session files into the events topic.

See docs/shipping.md.  ``--once`` ships what is complete now and exits 0
when the broker acknowledged all of it (1 when a file was refused or a
record not delivered); without it the command follows until SIGTERM or
Ctrl-C, then flushes and exits 0.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import FrameType

import click
from confluent_kafka import KafkaException

from processor.cli.common import service_options
from processor.cli.progress import Progress
from processor.config import ServiceConfig
from processor.ship.follow import Limits, Shipper, watch
from processor.ship.metrics import ShipMetrics, serve
from processor.ship.recover import topic_floor
from processor.ship.registry import Registry
from processor.ship.sender import KafkaSink


def _say(line: str) -> None:
    click.echo(f"processor ship: {line}", err=True)


@click.command("ship")
@service_options
@click.argument("root", type=click.Path(path_type=Path), metavar="ROOT")
@click.option("--once", is_flag=True, default=False, help="Ship what is complete now, then exit.")
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("state"),
    show_default=True,
    help="Where the registry of acknowledged positions lives (ship.sqlite3).",
)
@click.option(
    "--recover/--no-recover",
    default=True,
    show_default=True,
    help="With no registry yet, read the events topic once to learn which seqs it holds.",
)
@click.option(
    "--metrics-port",
    type=int,
    default=None,
    help="Serve /metrics, /healthz, /readyz on this port (0 picks one; default: the "
    "config's metrics_port, else none).",
)
@click.option("--metrics-host", default=None, help="Default: the config's metrics_host.")
@click.option("--rescan-interval", type=float, default=2.0, show_default=True, metavar="SECONDS")
@click.option(
    "--max-inflight-bytes", type=int, default=64 << 20, show_default=True, metavar="BYTES"
)
@click.option(
    "--timeout",
    type=float,
    default=300.0,
    show_default=True,
    help="With --once: longest wait for the broker's acknowledgements.",
)
@click.option("--progress/--no-progress", default=None, help="Progress bar with --once.")
def ship(
    config: ServiceConfig,
    root: Path,
    once: bool,
    state_dir: Path,
    recover: bool,
    metrics_port: int | None,
    metrics_host: str | None,
    rescan_interval: float,
    max_inflight_bytes: int,
    timeout: float,
    progress: bool | None,
) -> None:
    """Follow the agent runtime's sessions under ROOT into the events topic."""
    if not root.is_dir():
        raise click.BadParameter(f"{root} is not a directory", param_hint="ROOT")
    try:
        registry = Registry(state_dir / "ship.sqlite3")
    except Exception as exc:  # sqlite3.Error or OSError: one line
        raise click.ClickException(f"cannot open the registry in {state_dir}: {exc}") from None
    floor: dict[str, int] = {}
    if registry.fresh and recover:
        try:
            floor = topic_floor(config, say=_say)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else exc
            _say(
                f"no registry in {state_dir}, and {config.topics.events} cannot be read to learn "
                f"what it holds ({error}); retry, or --no-recover to send every session from seq 0"
            )
            sys.exit(1)
    registry.mark_initialized()
    sink = KafkaSink(config)
    metrics = ShipMetrics()
    # what a kill -9 makes us resend must stay inside the processor's duplicate window
    unpersisted = max(1, min(200, config.duplicate_window * 3 // 4))
    limits = Limits(
        rescan_s=rescan_interval,
        max_inflight_bytes=max_inflight_bytes,
        max_unpersisted=unpersisted,
    )
    shipper = Shipper(root, sink, registry, metrics, limits=limits, floor=floor, say=_say)
    port = metrics_port if metrics_port is not None else (config.metrics_port or None)
    host = metrics_host or config.metrics_host
    if port is not None:
        server = serve(metrics, host, port)
        _say(f"metrics on http://{host}:{server.server_port}/metrics")
    if once:
        show = sys.stderr.isatty() if progress is None else progress
        with Progress("ship", enabled=show) as bar:

            def shown() -> None:
                lag = sum(f.lag for f in shipper.followed.values())
                done = sum(f.acked_offset for f in shipper.followed.values())
                bar.update(
                    events=shipper.events_acked,
                    sessions=len(shipper.followed),
                    fraction=done / (done + lag) if done + lag else None,
                )

            remaining = shipper.run_once(timeout, on_turn=shown)
        registry.close()
        _summary(shipper, config)
        if remaining or sink.fatal:
            _say(f"{remaining} event(s) not delivered ({sink.fatal or 'flush timed out'})")
            sys.exit(1)
        sys.exit(1 if shipper.refused else 0)

    def stop(_sig: int, _frame: FrameType | None) -> None:
        shipper.stop.set()
        shipper.wake.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    watch(shipper)
    _say(f"following {root} into {config.topics.events} (state in {state_dir})")
    remaining = shipper.run_follow()
    registry.close()
    _summary(shipper, config)
    if remaining or sink.fatal:
        _say(f"{remaining} event(s) not delivered ({sink.fatal or 'flush timed out'})")
        sys.exit(1)


def _summary(shipper: Shipper, config: ServiceConfig) -> None:
    refused = f", {len(shipper.refused)} file(s) refused" if shipper.refused else ""
    click.echo(
        f"shipped {shipper.events_acked} event(s) of {len(shipper.followed)} session(s) "
        f"into {config.topics.events}{refused}",
        err=True,
    )
