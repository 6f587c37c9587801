"""The ``processor`` command: a thin shell over the library.

Each subcommand lives in its own module and only parses options, calls the
API and prints; there is no logic here a test could not reach directly.
"""

from __future__ import annotations

import click

from processor.cli.fold import fold


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="processor")
def cli() -> None:
    """Fold AI-agent session logs into surfaces, transcripts and projections."""


cli.add_command(fold)


def main() -> None:
    cli(prog_name="processor")
