"""``processor replay``: rebuild views and checkpoints from offset zero."""

from __future__ import annotations

import logging
import sys

import click

from processor.cli.common import service_options
from processor.cli.progress import Progress
from processor.client.replayer import ReplayError, replay
from processor.config import ServiceConfig


@click.command("replay")
@service_options
@click.option(
    "--into-prefix",
    default=None,
    help="Fold into fresh topics <prefix>.views/.checkpoints/.dlq (blue/green) "
    "instead of in place.",
)
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Show events, sessions, rate and ETA (default: when stderr is a terminal).",
)
def replay_command(config: ServiceConfig, into_prefix: str | None, progress: bool | None) -> None:
    """Replay the events topic from offset zero (stop the processors first)."""
    logging.basicConfig(level="WARNING")
    show = sys.stderr.isatty() if progress is None else progress
    bar = Progress("replay", enabled=show)

    def on_progress(done: int, total: int, sessions: int | None) -> None:
        bar.update(events=done, total_events=total, sessions=sessions)

    try:
        result = replay(config, into_prefix=into_prefix, progress=on_progress)
    except ReplayError as exc:
        bar.close()
        click.echo(f"processor replay: {exc}", err=True)
        sys.exit(1)
    bar.close()
    rate = result.events / result.seconds if result.seconds else 0.0
    click.echo(
        f"replayed {result.events} events in {result.seconds:.1f}s ({rate:,.0f}/s) into "
        f"{result.config.topics.views} and {result.config.topics.checkpoints}"
    )
