"""The ``processor`` command: a thin shell over the library.

Each subcommand lives in its own module and only parses options, calls the
API and prints; there is no logic here a test could not reach directly.
"""

from __future__ import annotations

import click

from processor.cli.demo import demo
from processor.cli.fold import fold
from processor.cli.replay import replay_command
from processor.cli.run import run


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="processor")
def cli() -> None:
    """Fold AI-agent session logs into surfaces, transcripts and projections."""


cli.add_command(fold)
cli.add_command(run)
cli.add_command(replay_command)
cli.add_command(demo)


def main() -> None:
    cli(prog_name="processor")
