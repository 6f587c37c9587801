"""Options shared by the Kafka subcommands: config file, environment, flags, -X."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from processor.config import (
    load_config,
    parse_kafka_overrides,
    secrets_on_command_line,
)

F = TypeVar("F", bound=Callable[..., Any])


def service_options(fn: F) -> F:
    """Add --config, --bootstrap-servers, --topic-prefix, --group-id and -X to a command.

    The wrapped command receives ``config: ServiceConfig`` instead of the raw options.
    """

    @click.option(
        "--config",
        "config_path",
        type=click.Path(exists=True, dir_okay=False),
        default=None,
        envvar="PROCESSOR_CONFIG",
        help="TOML config file (see README: Configuration).",
    )
    @click.option(
        "--bootstrap-servers",
        "-b",
        default=None,
        help="Kafka bootstrap servers (env KAFKA_BOOTSTRAP_SERVERS).",
    )
    @click.option(
        "--topic-prefix",
        default=None,
        help="Topic prefix: <prefix>.events/.views/.checkpoints/.dlq/.control.",
    )
    @click.option("--group-id", default=None, help="Consumer group id.")
    @click.option(
        "-X",
        "kafka_settings",
        multiple=True,
        metavar="KEY=VALUE",
        help="librdkafka setting passed through (repeatable). Not for secrets: "
        "use --kafka-secret-file or PROCESSOR_X_SASL_PASSWORD.",
    )
    @click.option(
        "--kafka-secret-file",
        "secret_file",
        type=click.Path(exists=True, dir_okay=False),
        default=None,
        envvar="PROCESSOR_KAFKA_SECRET_FILE",
        help="File of librdkafka key=value lines holding secrets "
        "(sasl.password, ssl.key.password); keep it mode 0600.",
    )
    @functools.wraps(fn)
    def wrapper(
        *args: Any,
        config_path: str | None,
        bootstrap_servers: str | None,
        topic_prefix: str | None,
        group_id: str | None,
        kafka_settings: tuple[str, ...],
        secret_file: str | None,
        **kwargs: Any,
    ) -> Any:
        try:
            kafka = parse_kafka_overrides(kafka_settings)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="-X") from None
        leaked = secrets_on_command_line(kafka)
        if leaked:
            click.echo(
                f"warning: {', '.join(leaked)} given with -X is visible to every "
                "user in the process list; use --kafka-secret-file or "
                "PROCESSOR_X_<KEY> instead",
                err=True,
            )
        try:
            config = load_config(
                config_path,
                bootstrap_servers=bootstrap_servers,
                topic_prefix=topic_prefix,
                group_id=group_id,
                kafka=kafka,
                secret_file=secret_file,
            )
        except (OSError, ValueError) as exc:
            # the value may come from the file, a PROCESSOR_* variable or a flag
            raise click.BadParameter(
                str(exc), param_hint="the configuration (--config, PROCESSOR_* environment, flags)"
            ) from None
        return fn(*args, config=config, **kwargs)

    return wrapper  # type: ignore[return-value]


def read_options(fn: F) -> F:
    """``--stop-after`` and ``--timeout`` of the commands that read a topic to its end."""
    fn = click.option(
        "--timeout",
        type=float,
        default=60.0,
        show_default=True,
        help="Longest time to read the topic to its end.",
    )(fn)
    return click.option(
        "--stop-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help="With --follow: stop after this many seconds.",
    )(fn)
