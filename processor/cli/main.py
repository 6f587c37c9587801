"""The ``processor`` command: a thin shell over the library.

Each subcommand lives in its own module and only parses options, calls the
API and prints; there is no logic here a test could not reach directly.
"""

from __future__ import annotations

import gc
import sys

import click

from processor.cli.demo import demo
from processor.cli.dlq import dlq, redrive
from processor.cli.fold import fold
from processor.cli.ingest import ingest
from processor.cli.inspect import inspect_command
from processor.cli.replay import replay_command
from processor.cli.run import run
from processor.cli.topics import topics
from processor.cli.views import views
from processor.core.errors import ProcessorError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="processor")
def cli() -> None:
    """Fold AI-agent session logs into surfaces, transcripts and projections."""


cli.add_command(fold)
cli.add_command(run)
cli.add_command(replay_command)
cli.add_command(demo)
cli.add_command(topics)
cli.add_command(ingest)
cli.add_command(views)
cli.add_command(dlq)
cli.add_command(redrive)
cli.add_command(inspect_command)


def main() -> None:
    # Folding allocates many small long-lived objects (frozen events and
    # messages); the default gen-0 threshold of 700 makes the collector run
    # constantly over them.  Measured: reading a 100k-event log takes half
    # the time with these thresholds.  Nothing here makes reference cycles.
    gc.set_threshold(50_000, 20, 100)
    try:
        cli(prog_name="processor")
    except ProcessorError as exc:  # a command did not catch it: one line, never a traceback
        line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        click.echo(f"processor: {line}", err=True)
        sys.exit(1)
