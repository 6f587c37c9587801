"""The ``processor`` command: a thin shell over the library.

Each subcommand lives in its own module and only parses options, calls the
API and prints; there is no logic here a test could not reach directly.
"""

from __future__ import annotations

import gc
import importlib
import sys

import click

from processor.cli import quick_exit
from processor.core.errors import ProcessorError

#: name -> (module, attribute) of each subcommand.  A command's module is
#: imported when that command runs (or help lists it): ``processor fold``
#: need not load the Kafka client, the web inspector and the service
#: (half of its start-up time).
COMMANDS: dict[str, tuple[str, str]] = {
    "fold": ("processor.cli.fold", "fold"),
    "run": ("processor.cli.run", "run"),
    "replay": ("processor.cli.replay", "replay_command"),
    "demo": ("processor.cli.demo", "demo"),
    "topics": ("processor.cli.topics", "topics"),
    "ingest": ("processor.cli.ingest", "ingest"),
    "ship": ("processor.cli.ship", "ship"),
    "views": ("processor.cli.views", "views"),
    "dlq": ("processor.cli.dlq", "dlq"),
    "redrive": ("processor.cli.dlq", "redrive"),
    "inspect": ("processor.cli.inspect", "inspect_command"),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS and cmd_name not in self.commands:
            module, attr = COMMANDS[cmd_name]
            self.add_command(getattr(importlib.import_module(module), attr), cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="processor")
def cli() -> None:
    """Fold AI-agent session logs into surfaces, transcripts and projections."""


def main() -> None:
    # Folding allocates many small long-lived objects (frozen events and
    # messages); the default gen-0 threshold of 700 makes the collector run
    # constantly over them.  Measured: reading a 100k-event log takes half
    # the time with these thresholds.  Nothing here makes reference cycles.
    gc.set_threshold(50_000, 20, 100)
    quick_exit.enable()
    try:
        cli(prog_name="processor")
    except SystemExit as exc:  # click ends every command with it
        if exc.code is None or isinstance(exc.code, int):
            quick_exit.exit_now(exc.code or 0)
        raise
    except ProcessorError as exc:  # a command did not catch it: one line, never a traceback
        line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        click.echo(f"processor: {line}", err=True)
        sys.exit(1)
