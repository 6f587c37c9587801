"""``processor inspect``: serve the inspector page over the views topic."""

from __future__ import annotations

import contextlib
import logging
import signal
import sys

import click

from processor.cli.common import service_options
from processor.config import ServiceConfig


@click.command("inspect")
@service_options
@click.option(
    "--host", default=None, help="Address to listen on (default 127.0.0.1: only this machine)."
)
@click.option(
    "--port", type=int, default=None, help="Port to listen on (default 8765; 0 picks a free one)."
)
@click.option(
    "--token",
    default=None,
    envvar="PROCESSOR_INSPECT_TOKEN",
    help="Enables the redrive action: the page asks for this token. Also "
    "env PROCESSOR_INSPECT_TOKEN or inspect_token in the config file "
    "(better: a command line is visible to other users).",
)
@click.option("--log-level", default="WARNING", show_default=True)
def inspect_command(
    config: ServiceConfig, host: str | None, port: int | None, token: str | None, log_level: str
) -> None:
    """Serve a live web page of the sessions, their views and dead letters."""
    from processor.inspect.server import DEFAULT_HOST, DEFAULT_PORT, InspectorServer

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        server = InspectorServer(
            config,
            host=host or DEFAULT_HOST,
            port=DEFAULT_PORT if port is None else port,
            token=token or config.inspect_token or None,
        )
    except OSError as exc:
        click.echo(f"processor inspect: {exc}", err=True)
        sys.exit(1)
    click.echo(
        f"inspector on {server.url} (views topic {config.topics.views}; "
        f"redrive {'on' if server.inspector.redrive_enabled else 'off: no --token'})",
        err=True,
    )
    # uvicorn hands SIGINT/SIGTERM back once it has stopped: both end the command cleanly
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(0))
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
