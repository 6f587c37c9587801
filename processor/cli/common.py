"""Options shared by the Kafka subcommands: config file, environment, flags, -X."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from processor.service.config import load_config, parse_kafka_overrides

F = TypeVar("F", bound=Callable[..., Any])


def service_options(fn: F) -> F:
    """Add --config, --bootstrap-servers, --topic-prefix, --group-id and -X to a command.

    The wrapped command receives ``config: ServiceConfig`` instead of the raw options.
    """

    @click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False),
                  default=None, envvar="PROCESSOR_CONFIG",
                  help="TOML config file (see README: Configuration).")
    @click.option("--bootstrap-servers", "-b", default=None,
                  help="Kafka bootstrap servers (env KAFKA_BOOTSTRAP_SERVERS).")
    @click.option("--topic-prefix", default=None,
                  help="Topic prefix: <prefix>.events/.views/.checkpoints/.dlq.")
    @click.option("--group-id", default=None, help="Consumer group id.")
    @click.option("-X", "kafka_settings", multiple=True, metavar="KEY=VALUE",
                  help="librdkafka setting passed through (repeatable).")
    @functools.wraps(fn)
    def wrapper(*args: Any, config_path: str | None, bootstrap_servers: str | None,
                topic_prefix: str | None, group_id: str | None,
                kafka_settings: tuple[str, ...], **kwargs: Any) -> Any:
        try:
            kafka = parse_kafka_overrides(kafka_settings)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="-X") from None
        config = load_config(config_path, bootstrap_servers=bootstrap_servers,
                             topic_prefix=topic_prefix, group_id=group_id, kafka=kafka)
        return fn(*args, config=config, **kwargs)

    return wrapper  # type: ignore[return-value]

