"""``processor topics create|verify|delete``: the five topics of a prefix.

events, views, checkpoints, dlq and control (operator commands).

``create`` is idempotent (existing topics are left alone, then verified, so
a half-right layout is reported instead of silently kept); ``verify`` exits 1
listing every problem, which makes it a deployment gate; ``delete`` needs
``--yes`` or an interactive confirmation because the events topic is the
only copy of the session logs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from processor.cli.common import service_options
from processor.config import ServiceConfig
from processor.kafka import clients
from processor.kafka.topic_admin import create_topics, delete_topics, topic_specs, verify_topics

F = TypeVar("F", bound=Callable[..., Any])


def _layout_options(fn: F) -> F:
    fn = click.option(
        "--replication-factor",
        type=int,
        default=None,
        help="Replication factor of new topics (default: config, 1).",
    )(fn)
    fn = click.option(
        "--partitions",
        type=int,
        default=None,
        help="Partitions of every topic (default: config, 12). All four "
        "topics must have the same count (co-partitioned).",
    )(fn)
    return fn


def _with_layout(
    config: ServiceConfig, partitions: int | None, replication_factor: int | None
) -> ServiceConfig:
    if partitions is not None and partitions < 1:
        raise click.BadParameter("must be >= 1", param_hint="--partitions")
    if replication_factor is not None and replication_factor < 1:
        raise click.BadParameter("must be >= 1", param_hint="--replication-factor")
    return config.with_overrides(partitions=partitions, replication_factor=replication_factor)


def layout_problems(
    config: ServiceConfig, *, expect_partitions: bool, timeout: float = 30
) -> list[str]:
    """``verify_topics`` plus, when asked, the partition count of ``config``."""
    admin = clients.admin(config)
    problems = verify_topics(admin, config, timeout=timeout)
    if expect_partitions:
        meta = admin.list_topics(timeout=timeout).topics
        for spec in topic_specs(config):
            if spec.name in meta and len(meta[spec.name].partitions) != spec.partitions:
                problems.append(
                    f"{spec.name}: {len(meta[spec.name].partitions)} partitions, "
                    f"expected {spec.partitions}"
                )
    return problems


def _report(problems: list[str]) -> None:
    for problem in problems:
        click.echo(f"  {problem}", err=True)


@click.group("topics")
def topics() -> None:
    """Create, verify or delete the events/views/checkpoints/dlq/control topics."""


@topics.command("create")
@service_options
@_layout_options
def create(config: ServiceConfig, partitions: int | None, replication_factor: int | None) -> None:
    """Create the missing topics with the right configs, then verify the layout."""
    config = _with_layout(config, partitions, replication_factor)
    created = create_topics(clients.admin(config), config)
    for name in created:
        click.echo(f"created {name}")
    if not created:
        click.echo("all topics exist")
    problems = layout_problems(config, expect_partitions=partitions is not None)
    if problems:
        click.echo("the existing topics do not match the layout:", err=True)
        _report(problems)
        sys.exit(1)


@topics.command("verify")
@service_options
@_layout_options
def verify(config: ServiceConfig, partitions: int | None, replication_factor: int | None) -> None:
    """Check partitions and configs of the five topics (exit 1 listing problems).

    ``--partitions`` also checks the count; without it only co-partitioning
    is checked.
    """
    config = _with_layout(config, partitions, replication_factor)
    problems = layout_problems(config, expect_partitions=partitions is not None)
    if problems:
        click.echo(
            f"{len(problems)} problem(s) with the topics of prefix {config.topic_prefix!r}:",
            err=True,
        )
        _report(problems)
        sys.exit(1)
    click.echo(f"topics of prefix {config.topic_prefix!r} are OK")


@topics.command("delete")
@service_options
@click.option(
    "--yes",
    is_flag=True,
    default=False,
    help="Do not ask; the events topic holds the session logs themselves.",
)
def delete(config: ServiceConfig, yes: bool) -> None:
    """Delete the existing topics of the prefix (asks unless --yes)."""
    admin = clients.admin(config)
    existing = set(admin.list_topics(timeout=30).topics)
    names = [s.name for s in topic_specs(config) if s.name in existing]
    if not names:
        click.echo("no topics to delete")
        return
    if not yes:
        click.confirm(
            f"delete {', '.join(names)}? The events topic is not recoverable", abort=True, err=True
        )
    delete_topics(admin, names)
    for name in names:
        click.echo(f"deleted {name}")
