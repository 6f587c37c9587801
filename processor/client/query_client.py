"""Asking a member for one session's views (``processor views --session``).

The member is the one given (``--member URL``: it redirects to the owner
when it is not; ``urllib`` follows a 307 by itself) or the owner the group
coordinator names (owners.py).  Any failure — no member advertises a URL,
a refused connection, a 503 while restoring, a response over the bound —
is returned as a reason, and the caller reads the views topic instead:
the member is a shortcut, never the only way to the truth.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import orjson

from processor.client.views_reader import SessionViews, ViewRecord
from processor.config import ServiceConfig
from processor.kafka import clients
from processor.kafka.owners import describe_group


@dataclass(frozen=True, slots=True)
class MemberAnswer:
    """The views a member served (``views``), or why it did not (``reason``)."""

    views: SessionViews | None
    url: str | None
    reason: str | None = None


def owner_url(config: ServiceConfig, session_id: str, timeout: float = 10.0) -> str | None:
    """The query URL of the member owning ``session_id``'s partition, if any."""
    admin = clients.admin(config)
    view = describe_group(admin, config.group_id, config.topics.events, timeout)
    return view.owner_of(session_id)[1]


def member_views(
    config: ServiceConfig, session_id: str, member: str | None, timeout: float = 10.0
) -> MemberAnswer:
    """The session's views from ``member`` (or the owner the group names)."""
    try:
        url = member or owner_url(config, session_id, timeout)
    except Exception as exc:  # no group, no topic, a coordinator moving
        return MemberAnswer(None, None, f"no member found: {exc}")
    if url is None:
        return MemberAnswer(None, None, "no member of the group advertises a query URL")
    if not url.startswith(("http://", "https://")):  # urlopen would also open files
        return MemberAnswer(None, url, f"member URL {url!r} is not http(s)")
    target = f"{url.rstrip('/')}/sessions/{quote(session_id, safe='')}/views"
    try:
        with urllib.request.urlopen(target, timeout=timeout) as resp:
            doc: dict[str, Any] = orjson.loads(resp.read())
            served_by = resp.geturl()
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            reason = str(orjson.loads(body)["error"])
        except Exception:
            reason = body.decode(errors="replace").strip()[:200]
        return MemberAnswer(None, url, f"{url} answered {exc.code}: {reason}")
    except (OSError, ValueError) as exc:
        return MemberAnswer(None, url, f"{url} unreachable: {exc}")
    views = {
        name: ViewRecord(name, int(v["asOfSeq"]), int(v["stateVersion"]), v["value"])
        for name, v in doc.items()
    }
    return MemberAnswer(views, served_by.split("/sessions/")[0])
