"""``processor ingest PATH...``: agent session files into the events topic.

Each file (JSON Lines, plain or zstd — see :mod:`processor.files`) is
validated in full by the session core *before* any of its events is
produced: a file with an invalid event is refused as a whole and reported as
``PATH: seq N: reason (RULE)``, the other files are still ingested, and the
command exits 1.  Refusing the whole file (rather than producing its valid
prefix) keeps a half-ingested session from being mistaken for a complete one;
the processor would quarantine it at the same seq anyway.

``--raw`` skips that validation and produces every line that the Avro
envelope can carry, as-is — the processor then judges it and dead-letters
what is invalid (demos, tests, DLQ drills).

Events are produced with the idempotent, murmur2-partitioned event producer
(key = session id).  Re-ingesting a file is harmless: the processor's seq
gate drops exact duplicates by digest, so a longer version of a session file
only adds its new tail.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from processor.cli.common import service_options
from processor.cli.progress import FileProgress, Progress
from processor.client.session_writer import producer_name
from processor.codec import Codec, CodecError, session_key
from processor.config import ServiceConfig
from processor.core.defaults import new_session
from processor.core.errors import InvalidInput, SessionError
from processor.core.events import Event
from processor.files import (
    SessionFileError,
    check_header,
    file_session_id,
    is_header_line,
    json_lines,
    read_bytes,
    read_session_file,
)
from processor.kafka import clients
from processor.kafka.client_errors import ClientProblems
from processor.kafka.schema_registry import codec_for


@dataclass
class IngestStats:
    """What one ``ingest`` run did (the summary line)."""

    files: int = 0
    refused: int = 0
    sessions: set[str] = field(default_factory=set)
    events: int = 0
    skipped_lines: int = 0
    delivery_errors: int = 0
    first_delivery_error: str | None = None
    seconds: float = 0.0

    def on_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self.delivery_errors += 1
            if self.first_delivery_error is None:
                self.first_delivery_error = str(err)


def validated_events(
    path: Path,
    session_id: str | None,
    drop_torn_tail: bool,
) -> tuple[str, list[Event]]:
    """The file's session id and events, after a full fold by the core.

    The fold uses the processor's registries, so a projection rule a unit
    enforces at commit refuses the file here too.  Raises
    ``SessionFileError`` or ``SessionError``.
    """
    file = read_session_file(path, drop_torn_tail=drop_torn_tail)
    sid = session_id or (str(file.header["id"]) if file.has_header else file_session_id(path))
    session = new_session(file.header)
    for event in file.events:
        session.append(event)
        session.log.trim_before(event.seq + 1)  # validation needs no log prefix
    return sid, file.events


def raw_envelopes(
    path: Path,
    session_id: str | None,
    drop_torn_tail: bool,
) -> tuple[str, list[tuple[int, Any]]]:
    """The file's session id and ``(byte offset, JSON value)`` of every event line.

    Nothing is validated except that each line is JSON and, for a first line
    of type ``session``, the header (it names the session).  The whole file
    is read before anything is produced, so an unreadable file produces
    nothing even in raw mode.
    """
    header_id: str | None = None
    envelopes: list[tuple[int, Any]] = []
    for offset, value, torn in json_lines(read_bytes(path), drop_torn_tail=drop_torn_tail):
        if torn is not None:
            break
        if not envelopes and header_id is None and is_header_line(value):
            header_id = str(check_header(value)["id"])
            continue
        envelopes.append((offset, value))
    return session_id or header_id or file_session_id(path), envelopes


def _flush(producer: Producer, problems: ClientProblems, timeout: float = 60) -> int:
    """Wait for delivery; a failed handshake or missing ACL ends it with one line."""
    deadline = time.monotonic() + timeout
    remaining = producer.flush(1.0)
    while remaining and time.monotonic() < deadline:
        if problems.fatal is not None:
            click.echo(f"processor ingest: {problems.fatal}", err=True)
            sys.exit(1)
        remaining = producer.flush(1.0)
    return int(remaining)


def _produce(producer: Producer, topic: str, key: bytes, value: bytes, stats: IngestStats) -> None:
    clients.produce(producer, topic, key, value, on_delivery=stats.on_delivery)
    producer.poll(0)


class _TooLarge(InvalidInput):
    """A record of the file exceeds what Kafka takes (refused before producing any)."""


def _checked(values: list[tuple[int | str, bytes]], limit: int) -> list[bytes]:
    """Every encoded record, or a refusal naming the first one Kafka cannot take.

    Checked before anything is produced: a file is ingested whole or not at
    all, never cut after the last record that happened to fit.
    """
    for where, value in values:
        if len(value) > limit:
            raise _TooLarge(
                f"{where}: record of {len(value):,} bytes exceeds "
                f"message.max.bytes ({limit:,}); nothing of this file was produced"
            )
    return [v for _, v in values]


def ingest_file(
    path: Path,
    *,
    producer: Producer,
    codec: Codec,
    topic: str,
    session_id: str | None,
    raw: bool,
    drop_torn_tail: bool,
    stats: IngestStats,
    bar: FileProgress,
    max_bytes: int = 1_000_000,
) -> str | None:
    """Ingest one file; returns the refusal message, or None when produced."""
    name = producer_name("ingest")
    try:
        if not raw:
            sid, events = validated_events(path, session_id, drop_torn_tail)
            values = _checked(
                [
                    (f"seq {e.seq}", codec.encode_parsed_event(sid, e, producer=name))
                    for e in events
                ],
                max_bytes,
            )
        else:
            sid, items = raw_envelopes(path, session_id, drop_torn_tail)
            encoded: list[tuple[int | str, bytes]] = []
            for offset, envelope in items:
                try:
                    encoded.append(
                        (
                            f"line at byte offset {offset}",
                            codec.encode_event(sid, envelope, producer=name),
                        )
                    )
                except CodecError as exc:
                    click.echo(f"{path}: line at byte offset {offset} skipped: {exc}", err=True)
                    stats.skipped_lines += 1
            values = _checked(encoded, max_bytes)
        key = session_key(sid)
        bar.expect(len(values))
        for value in values:
            _produce(producer, topic, key, value, stats)
            stats.events += 1
            bar.event()
    except (SessionFileError, SessionError, CodecError, _TooLarge) as exc:
        return f"{path}: {exc}"
    except KafkaException as exc:
        return f"{path}: {exc.args[0] if exc.args else exc}"
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    stats.sessions.add(sid)
    return None


@click.command("ingest")
@service_options
@click.argument(
    "paths", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option(
    "--session-id",
    default=None,
    help="Session id to write under (one PATH only; default: the header's id, else the file name).",
)
@click.option(
    "--raw",
    is_flag=True,
    default=False,
    help="Produce events as they are, without validating them (the processor "
    "dead-letters what is invalid).",
)
@click.option(
    "--drop-torn-tail",
    is_flag=True,
    default=False,
    help="Ingest a file whose last line was torn by a crash without that line.",
)
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Progress bar (default: when stderr is a terminal).",
)
def ingest(
    config: ServiceConfig,
    paths: tuple[Path, ...],
    session_id: str | None,
    raw: bool,
    drop_torn_tail: bool,
    progress: bool | None,
) -> None:
    """Produce agent session files (JSONL, plain or .zst) to the events topic."""
    if session_id is not None and len(paths) != 1:
        raise click.UsageError("--session-id needs exactly one PATH")
    t0 = time.monotonic()
    stats = IngestStats()
    codec = codec_for(config, writer=True)
    problems = ClientProblems()
    producer = clients.event_producer(config, "processor-ingest", problems)
    # librdkafka refuses a record above message.max.bytes locally (default 1,000,000)
    max_bytes = int(config.kafka.get("message.max.bytes", 1_000_000))
    show = sys.stderr.isatty() if progress is None else progress
    failures: list[str] = []
    with Progress("ingest", enabled=show) as shown:
        bar = FileProgress(shown, sum(p.stat().st_size for p in paths))
        for path in paths:
            bar.begin(path.stat().st_size)
            problem = ingest_file(
                path,
                producer=producer,
                codec=codec,
                topic=config.topics.events,
                session_id=session_id,
                raw=raw,
                drop_torn_tail=drop_torn_tail,
                stats=stats,
                bar=bar,
                max_bytes=max_bytes,
            )
            bar.end(len(stats.sessions))
            if problem is None:
                stats.files += 1
            else:
                stats.refused += 1
                failures.append(problem)
                click.echo(problem, err=True)
        remaining = _flush(producer, problems)
    stats.seconds = time.monotonic() - t0
    rate = stats.events / stats.seconds if stats.seconds else 0.0
    refused = f", {stats.refused} file(s) refused" if stats.refused else ""
    skipped = f", {stats.skipped_lines} line(s) skipped" if stats.skipped_lines else ""
    click.echo(
        f"ingested {stats.files} file(s), {len(stats.sessions)} session(s), "
        f"{stats.events} event(s) in {stats.seconds:.2f}s ({rate:,.0f} ev/s) into "
        f"{config.topics.events}{refused}{skipped}"
    )
    if remaining or stats.delivery_errors:
        click.echo(
            f"processor ingest: {stats.delivery_errors + remaining} event(s) not "
            f"delivered ({stats.first_delivery_error or 'flush timed out'})",
            err=True,
        )
        sys.exit(1)
    if failures:
        sys.exit(1)
