"""``processor views``: what subscribers see, read back with ``read_committed``.

Without ``--follow`` the views topic is read from the beginning to its
current end and every (session, view) is printed once, split views
reassembled and removed views left out.  ``--follow`` prints that snapshot
as one JSON line per view and then one line per committed change, so a
dashboard can pipe it without ever missing an update.  ``--format fold``
prints each session shaped like ``processor fold`` output, to diff the
service against an offline fold of the same file.

A view record whose ``asOfSeq`` is lower than one read before it (a
processor published from a stale state) is never hidden: the latest record
is shown, and a warning on stderr names it (``--follow``: one line per such
update and a count at the end).
"""

from __future__ import annotations

import sys
from typing import Any

import click
import orjson
from confluent_kafka import KafkaException

from processor.cli.common import read_options, service_options
from processor.client.query_client import member_views
from processor.client.view_assembly import DECODED_CACHE_BYTES
from processor.client.views_reader import (
    SessionViews,
    ViewRegression,
    ViewsSnapshot,
    ViewUpdate,
    follow_views,
    read_views,
    session_fold_equivalent,
    view_update_json,
)
from processor.config import ServiceConfig
from processor.kafka.schema_registry import codec_for


def _dump(value: Any, *, pretty: bool = False) -> str:
    option = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS if pretty else 0
    return orjson.dumps(value, option=option).decode()


def summary_line(sid: str, views: SessionViews) -> str:
    """One line per session: status, watermark and the size of each core view."""
    status = views.get("status")
    state = status.value.get("state", "?") if status is not None else "?"
    last = status.value.get("lastSeq", "?") if status is not None else "?"
    surface = views.get("surface")
    messages = views.get("messages")
    index = views.get("transcript")
    parts = [
        f"{sid}",
        f"status={state}",
        f"lastSeq={last}",
        f"surface={len(surface.value['nodes']) if surface is not None else '-'}",
        f"messages={len(messages.value) if messages is not None else '-'}",
        f"transcript={index.value['total'] if index is not None else '-'}",
        f"views={len(views)}",
    ]
    if status is not None and state == "quarantined":
        q = status.value.get("quarantine") or {}
        parts.append(f"quarantine=seq {q.get('seq')}: {q.get('rule')}: {q.get('reason')}")
    return "  ".join(parts)


def views_json(views: dict[str, SessionViews]) -> dict[str, Any]:
    """``{session: {view: {asOfSeq, stateVersion, value}}}``."""
    return {
        sid: {
            name: {"asOfSeq": r.as_of_seq, "stateVersion": r.state_version, "value": r.value}
            for name, r in sorted(per.items())
        }
        for sid, per in sorted(views.items())
    }


@click.command("views")
@service_options
@click.option("--session", "session_id", default=None, help="Only this session.")
@click.option(
    "--view",
    "view_name",
    default=None,
    help="Only this view (e.g. messages, surface, status, sessionStats).",
)
@click.option(
    "--follow",
    is_flag=True,
    default=False,
    help="Print the current views, then every committed update (JSON lines).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "summary", "fold"]),
    default="json",
    show_default=True,
    help="json: raw views; summary: one line per session; fold: shaped like "
    "`processor fold` output.",
)
@click.option(
    "--no-snapshot",
    is_flag=True,
    default=False,
    help="With --follow: only updates committed from now on.",
)
@click.option(
    "--member",
    default=None,
    help="With --session: ask this member's query port (http://host:port); default: "
    "the owner the group names.  Falls back to reading the views topic.",
)
@click.option(
    "--from-topic",
    is_flag=True,
    default=False,
    help="With --session: read the views topic, never a member.",
)
@click.option(
    "--cache-mb",
    type=click.IntRange(min=0),
    default=DECODED_CACHE_BYTES >> 20,
    show_default=True,
    help="Bound of the decoded message records kept besides the views (MiB); "
    "beyond it they are decoded again when needed (logged once).",
)
@read_options
def views(
    config: ServiceConfig,
    session_id: str | None,
    view_name: str | None,
    follow: bool,
    fmt: str,
    no_snapshot: bool,
    member: str | None,
    from_topic: bool,
    cache_mb: int,
    stop_after: float | None,
    timeout: float,
) -> None:
    """Print the materialized views, or follow them as they commit."""
    if fmt == "fold" and (follow or view_name is not None):
        raise click.UsageError(
            "--format fold needs every view of a session (no --view, no --follow)"
        )
    try:
        if follow:
            _follow(
                config, session_id, view_name, fmt, not no_snapshot, stop_after, timeout, cache_mb
            )
            return
        snapshot = None
        if session_id is not None and not from_topic:
            snapshot = _from_member(config, session_id, view_name, member, timeout)
        if snapshot is None:
            snapshot = read_views(
                config,
                session=session_id,
                view=view_name,
                timeout=timeout,
                codec=codec_for(config),
                cache_bytes=cache_mb << 20,
            )
    except (RuntimeError, KafkaException) as exc:
        click.echo(f"processor views: {exc}", err=True)
        sys.exit(1)
    found = snapshot.views
    _warn_regressions(snapshot.regressions)
    if session_id is not None and session_id not in found:
        click.echo(f"processor views: no views of session {session_id!r}", err=True)
        sys.exit(1)
    if fmt == "summary":
        for sid in sorted(found):
            click.echo(summary_line(sid, found[sid]))
    elif fmt == "fold":
        click.echo(
            _dump(
                {sid: session_fold_equivalent(per) for sid, per in sorted(found.items())},
                pretty=True,
            )
        )
    else:
        click.echo(_dump(views_json(found), pretty=True))


def _from_member(
    config: ServiceConfig,
    session_id: str,
    view_name: str | None,
    member: str | None,
    timeout: float,
) -> ViewsSnapshot | None:
    """The session's views from its owner (query_client.py), None to read the topic."""
    answer = member_views(config, session_id, member, timeout=min(timeout, 10.0))
    if answer.views is None:
        if member is not None or answer.url is not None:  # quiet when no member serves
            click.echo(f"processor views: reading the views topic ({answer.reason})", err=True)
        return None
    click.echo(f"processor views: served by {answer.url}", err=True)
    per = {n: r for n, r in answer.views.items() if view_name in (None, n)}
    return ViewsSnapshot({session_id: per} if per else {}, [])


def _warn_regressions(regressions: list[ViewRegression], shown: int = 5) -> None:
    if not regressions:
        return
    sample = ", ".join(
        f"{r.session_id}/{r.view} {r.previous}->{r.as_of_seq}" for r in regressions[:shown]
    )
    more = f" (+{len(regressions) - shown} more)" if len(regressions) > shown else ""
    click.echo(
        f"processor views: warning: {len(regressions)} view record(s) went back in "
        f"asOfSeq (a processor published from a stale state; the latest record is "
        f"shown): {sample}{more}",
        err=True,
    )


def _regression_line(update: ViewUpdate) -> str:
    r = update.record
    assert r is not None and update.regressed_from is not None
    return (
        f"processor views: warning: {update.session_id}/{update.view} went back from "
        f"asOfSeq {update.regressed_from} to {r.as_of_seq} (a processor published from "
        "a stale state)"
    )


def _follow(
    config: ServiceConfig,
    session_id: str | None,
    view_name: str | None,
    fmt: str,
    snapshot: bool,
    stop_after: float | None,
    timeout: float,
    cache_mb: int,
) -> None:
    regressions = 0
    try:
        for update in follow_views(
            config,
            session=session_id,
            view=view_name,
            snapshot=snapshot,
            stop_after_s=stop_after,
            timeout=timeout,
            codec=codec_for(config),
            cache_bytes=cache_mb << 20,
        ):
            if update.regressed_from is not None:
                regressions += 1
                click.echo(_regression_line(update), err=True)
            if fmt == "summary":
                r = update.record
                click.echo(
                    f"{update.session_id}  {update.view}  "
                    + ("removed" if r is None else f"asOfSeq={r.as_of_seq}")
                    + (
                        ""
                        if update.regressed_from is None
                        else f"  regressedFrom={update.regressed_from}"
                    )
                )
            else:
                click.echo(_dump(view_update_json(update)))
    except KeyboardInterrupt:
        pass
    if regressions:
        click.echo(
            f"processor views: warning: {regressions} update(s) went back in asOfSeq", err=True
        )
