"""``processor dlq`` and ``processor redrive``: inspect and clear rejected input.

The DLQ keeps every refused record with its origin (topic, partition,
offset), the rule and reason, and the raw key and value bytes.  ``dlq``
prints one JSON line per dead letter, the refused value shown as the decoded
event envelope when it is a readable ``SessionEvent`` (else base64), so the
cause can be fixed at the writer.  ``redrive`` then lifts a session's
quarantine through a command on the control topic (operators only), addressed
to the session and the seq of its quarantine; produce the corrected events
before or after it, the order does not matter.
"""

from __future__ import annotations

import sys

import click
import orjson
from confluent_kafka import KafkaException

from processor.cli.common import read_options, service_options
from processor.client.session_writer import DeliveryError, SessionWriter
from processor.client.views_reader import (
    dead_letter_json,
    follow_dead_letters,
    materialize_views,
    read_dead_letters,
)
from processor.codec import DeadLetter
from processor.config import ServiceConfig
from processor.kafka.schema_registry import codec_for


def summary_line(letter: DeadLetter) -> str:
    """``topic[partition]@offset session seq RULE: reason`` (one line)."""
    seq = "-" if letter.seq is None else str(letter.seq)
    return (
        f"{letter.topic}[{letter.partition}]@{letter.offset}  {letter.session_id}  "
        f"seq={seq}  {letter.rule}: {letter.reason}"
    )


def _echo(letter: DeadLetter, fmt: str) -> None:
    if fmt == "summary":
        click.echo(summary_line(letter))
    else:
        click.echo(orjson.dumps(dead_letter_json(letter)).decode())


@click.command("dlq")
@service_options
@click.option("--session", "session_id", default=None, help="Only this session's records.")
@click.option(
    "--follow",
    is_flag=True,
    default=False,
    help="Print the existing records, then new ones as they commit.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "summary"]),
    default="json",
    show_default=True,
    help="json: one JSON line per record; summary: one text line.",
)
@read_options
def dlq(
    config: ServiceConfig,
    session_id: str | None,
    follow: bool,
    fmt: str,
    stop_after: float | None,
    timeout: float,
) -> None:
    """Print dead letters (refused events with the rule and reason)."""
    try:
        if follow:
            try:
                for letter in follow_dead_letters(
                    config,
                    session=session_id,
                    stop_after_s=stop_after,
                    timeout=timeout,
                    codec=codec_for(config),
                ):
                    _echo(letter, fmt)
            except KeyboardInterrupt:
                pass
            return
        for letter in read_dead_letters(
            config, session=session_id, timeout=timeout, codec=codec_for(config)
        ):
            _echo(letter, fmt)
    except (RuntimeError, KafkaException) as exc:
        click.echo(f"processor dlq: {exc}", err=True)
        sys.exit(1)


@click.command("redrive")
@service_options
@click.argument("session_ids", nargs=-1, required=True)
@click.option(
    "--seq",
    type=int,
    default=None,
    help="The quarantine's seq (its status view's quarantine.seq). Default: read "
    "it from each session's status view.",
)
@click.option(
    "--timeout",
    type=float,
    default=60.0,
    show_default=True,
    help="Longest time to read the views topic (without --seq).",
)
def redrive(
    config: ServiceConfig, session_ids: tuple[str, ...], seq: int | None, timeout: float
) -> None:
    """Lift the quarantine of sessions once the cause is fixed (needs WRITE on control)."""
    try:
        targets = (
            {sid: seq for sid in session_ids}
            if seq is not None
            else quarantine_seqs(config, session_ids, timeout)
        )
        with SessionWriter(config, client_id="processor-redrive") as writer:
            for sid, at in targets.items():
                if at is None:
                    click.echo(
                        f"{sid}: not quarantined (status view), nothing to redrive", err=True
                    )
                    continue
                writer.redrive(sid, at)
                click.echo(f"redrive requested for {sid} at seq {at}")
    except (DeliveryError, RuntimeError, KafkaException) as exc:
        click.echo(f"processor redrive: {exc}", err=True)
        sys.exit(1)


def quarantine_seqs(
    config: ServiceConfig, session_ids: tuple[str, ...], timeout: float
) -> dict[str, int | None]:
    """Each session's quarantine seq from its committed ``status`` view (None: ok)."""
    out: dict[str, int | None] = {}
    only = session_ids[0] if len(session_ids) == 1 else None
    every = materialize_views(config, session=only, timeout=timeout, codec=codec_for(config))
    for sid in session_ids:
        status = every.get(sid, {}).get("status")
        quarantine = status.value.get("quarantine") if status is not None else None
        out[sid] = int(quarantine["seq"]) if quarantine else None
    return out
