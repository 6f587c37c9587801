"""Queries by session on the processor's HTTP port (issue 13, interactive queries).

Routes (GET only; ``<id>`` percent-encoded, so ids may hold ``/``):

- ``/sessions/<id>``: the session's view names with their ``asOfSeq``;
- ``/sessions/<id>/views``: every view, ``{name: {asOfSeq, stateVersion,
  value}}`` (what ``processor views --session`` prints);
- ``/sessions/<id>/views/<name>``: one view, shaped like a ``processor views
  --follow`` line (``session, view, asOfSeq, stateVersion, value``);
- ``/sessions/<id>/messages``: the ``messages`` view, same shape;
- ``/sessions/<id>/transcript[?offset=&limit=]``: the transcript stitched from
  its pages (``views_reader.assemble_transcript``), optionally a slice.

Values are what the views topic assembles for the session: the
:class:`SessionSource` hands over :class:`ViewRecord` s produced by the
readers' own assembly code, never a second rendering.

Only the member owning the session's events partition answers; any other
answers **307 Temporary Redirect** with ``Location`` at the owner and a JSON
body naming it (307, not 421: HTTP clients, curl ``-L`` and ``urllib``
follow it by themselves, and a GET stays a GET).  Every error is one JSON
line ``{"error": ...}``: 400 a bad id or a response over the size bound,
404 no such route, session or view, 429 too many queries at once or per
second, 503
(with ``Retry-After`` when waiting helps) while the partition is restoring,
the assignment is moving (also after ``MAX_HOPS`` redirects, counted in a
``hops`` query parameter, so members that disagree during a rebalance never
bounce a client forever), or the cache gave it up over its budget.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

import orjson
from prometheus_client import CollectorRegistry, Counter

from processor.client.views_reader import ViewRecord, assemble_transcript
from processor.core.errors import Unavailable
from processor.engine.dead_letters import MAX_KEY_BYTES

log = logging.getLogger(__name__)

#: Largest response body; a bigger transcript must be asked for in slices.
MAX_RESPONSE_BYTES = 8 * 1024 * 1024
#: Queries answered at once; more wait for nobody: they get 429.
MAX_CONCURRENT = 4
#: Queries per second a member answers (a burst of as many); more get 429.
MAX_RATE = 500.0
#: Redirects one query may take (``?hops=``) before members answer 503 instead.
MAX_HOPS = 3
#: Seconds a 503 asks the client to wait while a partition restores.
RETRY_AFTER_S = 1

OUTCOMES = (
    "served",
    "redirected",
    "not_found",
    "bad_request",
    "too_large",
    "busy",
    "unavailable",
    "failed",
)


class NotRestored(Unavailable):
    """The session's partition is owned but its views are not loaded yet."""


class GivenUp(Unavailable):
    """The views cannot be served here (a bound was hit); the message says which."""


class SessionSource(Protocol):
    """What a member knows about the sessions it owns."""

    def owns(self, session_id: str) -> bool | None:
        """Whether this member owns the session's partition; None: not known yet."""
        ...

    def session_views(self, session_id: str) -> Mapping[str, ViewRecord] | None:
        """The session's views as the views topic assembles them; None: no views.

        Raises :class:`NotRestored` or :class:`GivenUp`.
        """
        ...


#: Session id -> (partition, owner URL or None); None when the group is unknown.
OwnerLookup = Callable[[str], "tuple[int, str | None] | None"]


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    outcome: str
    headers: dict[str, str] = field(default_factory=dict)


def _json(status: int, outcome: str, doc: Any, **headers: str) -> Response:
    body = orjson.dumps(doc) + b"\n"
    return Response(status, body, outcome, {"Content-Type": "application/json", **headers})


def _error(status: int, outcome: str, message: str, **headers: str) -> Response:
    return _json(status, outcome, {"error": message}, **headers)


class Queries:
    """Request path -> :class:`Response`; thread-safe, bounded, counted."""

    def __init__(
        self,
        source: SessionSource | None,
        owner: OwnerLookup | None = None,
        *,
        self_url: str | None = None,
        registry: CollectorRegistry | None = None,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        max_concurrent: int = MAX_CONCURRENT,
        max_rate: float = MAX_RATE,
    ) -> None:
        self.source = source
        self.owner = owner
        self.self_url = self_url
        self.max_response_bytes = max_response_bytes
        self._slots = threading.BoundedSemaphore(max_concurrent)
        self._rate = _TokenBucket(max_rate)
        self.counter = Counter(
            "processor_queries_total",
            "Session queries by outcome",
            ["outcome"],
            registry=registry if registry is not None else CollectorRegistry(),
        )
        for outcome in OUTCOMES:
            self.counter.labels(outcome)

    def serve(self, source: SessionSource, owner: OwnerLookup) -> None:
        """Answer from a member's cache.  The one binding after construction: the
        port serves before the member exists (the member advertises the port's
        URL when it joins), so the member's cache comes to it then (query_setup.py)."""
        self.source, self.owner = source, owner

    def http(self, path: str) -> tuple[int, bytes, dict[str, str]]:
        """:meth:`handle` as the HTTP server takes it (``ops/http.py`` serve)."""
        r = self.handle(path)
        return r.status, r.body, r.headers

    def handle(self, path: str) -> Response:
        if not self._rate.take():
            response = _error(429, "busy", "too many queries per second; retry", **_retry())
        elif not self._slots.acquire(blocking=False):
            response = _error(429, "busy", "too many queries at once; retry", **_retry())
        else:
            try:
                response = self._route(path)
            except Exception as exc:  # a bug must not kill the HTTP thread silently
                log.exception("query %s failed", path)
                response = _error(500, "failed", f"query failed: {type(exc).__name__}: {exc}")
            finally:
                self._slots.release()
        self.counter.labels(response.outcome).inc()
        return response

    # ------------------------------------------------------------ routing

    def _route(self, path: str) -> Response:
        url = urlsplit(path)
        segments = url.path.split("/")[1:]  # split before decoding: ids may hold "/"
        if len(segments) < 2 or segments[0] != "sessions" or not segments[1]:
            return _error(404, "not_found", f"no route {url.path!r}")
        try:
            sid = unquote(segments[1], errors="strict")
        except UnicodeDecodeError:
            return _error(400, "bad_request", "session id is not UTF-8")
        if len(sid.encode()) > MAX_KEY_BYTES:
            return _error(
                400,
                "bad_request",
                f"session id of {len(sid.encode())} bytes exceeds {MAX_KEY_BYTES}",
            )
        rest = [unquote(s) for s in segments[2:]]
        if rest not in ([], ["views"], ["messages"], ["transcript"]) and not (
            len(rest) == 2 and rest[0] == "views" and rest[1]
        ):
            return _error(404, "not_found", f"no route {url.path!r}")
        source = self.source
        if source is None:
            return _error(503, "unavailable", "queries are not served yet", **_retry())
        owned = source.owns(sid)
        if owned is None:
            return _error(503, "unavailable", "partition assignment not known yet", **_retry())
        if not owned:
            return self._redirect(sid, path)
        try:
            views = source.session_views(sid)
        except NotRestored as exc:
            return _error(503, "unavailable", f"restoring: {exc}", **_retry())
        except GivenUp as exc:
            return _error(503, "unavailable", str(exc))
        if not views:
            return _error(404, "not_found", f"no views of session {sid!r}")
        if not rest:
            return self._sized(
                {
                    "session": sid,
                    "views": {n: r.as_of_seq for n, r in sorted(views.items())},
                }
            )
        if rest == ["views"]:
            return self._sized(
                {
                    n: {"asOfSeq": r.as_of_seq, "stateVersion": r.state_version, "value": r.value}
                    for n, r in sorted(views.items())
                }
            )
        if rest == ["transcript"]:
            return self._transcript(sid, views, parse_qs(url.query))
        name = "messages" if rest == ["messages"] else rest[1]
        record = views.get(name)
        if record is None:
            return _error(404, "not_found", f"session {sid!r} has no view {name!r}")
        return self._sized(view_json(sid, record))

    def _redirect(self, sid: str, path: str) -> Response:
        url_parts = urlsplit(path)
        query = parse_qs(url_parts.query)
        try:
            hops = int(query.get("hops", ["0"])[0])
        except ValueError:
            hops = MAX_HOPS
        if hops >= MAX_HOPS:
            # members whose views of the group disagree (a rebalance) would
            # bounce the client between them: let it retry instead
            return _error(
                503, "unavailable", f"redirected {hops} times: ownership is moving", **_retry()
            )
        found = self.owner(sid) if self.owner is not None else None
        if found is None:
            return _error(503, "unavailable", "the group's owners are not known", **_retry())
        partition, url = found
        if url is None or url == self.self_url:
            # rebalancing (no owner, or the coordinator still names this member)
            return _error(
                503,
                "unavailable",
                f"partition {partition} has no member answering queries right now",
                **_retry(),
            )
        return _json(
            307,
            "redirected",
            {
                "error": f"session {sid!r} is owned by another member",
                "partition": partition,
                "owner": url,
            },
            Location=url.rstrip("/") + _with_hops(url_parts.path, query, hops + 1),
        )

    def _transcript(
        self, sid: str, views: Mapping[str, ViewRecord], query: Mapping[str, list[str]]
    ) -> Response:
        try:
            offset = int(query.get("offset", ["0"])[0])
            limit = int(query["limit"][0]) if "limit" in query else None
        except ValueError:
            return _error(400, "bad_request", "offset and limit must be integers")
        if offset < 0 or (limit is not None and limit < 0):
            return _error(400, "bad_request", "offset and limit must not be negative")
        index = views.get("transcript")
        if index is None:
            return _error(404, "not_found", f"session {sid!r} has no transcript")
        try:
            entries = assemble_transcript(dict(views))
        except ValueError as exc:
            return _error(503, "unavailable", f"transcript of {sid!r} is incomplete: {exc}")
        stop = len(entries) if limit is None else offset + limit
        return self._sized(
            {
                "session": sid,
                "asOfSeq": index.as_of_seq,
                "total": len(entries),
                "offset": offset,
                "entries": entries[offset:stop],
            }
        )

    def _sized(self, doc: Any) -> Response:
        response = _json(200, "served", doc)
        if len(response.body) > self.max_response_bytes:
            return _error(
                400,
                "too_large",
                f"response of {len(response.body)} bytes exceeds the bound of "
                f"{self.max_response_bytes}; ask for the transcript in slices "
                "(?offset=&limit=) or for one transcript.<n> page",
            )
        return response


def view_json(sid: str, record: ViewRecord) -> dict[str, Any]:
    """One view as the ``--follow`` lines show it."""
    return {
        "session": sid,
        "view": record.name,
        "asOfSeq": record.as_of_seq,
        "stateVersion": record.state_version,
        "value": record.value,
    }


class _TokenBucket:
    """``rate`` tokens a second, at most ``rate`` saved up (thread-safe)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._tokens = rate
        self._at = time.monotonic()
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.rate, self._tokens + (now - self._at) * self.rate)
            self._at = now
            if self._tokens < 1:
                return False
            self._tokens -= 1
            return True


def _with_hops(path: str, query: Mapping[str, list[str]], hops: int) -> str:
    """``path`` with its query and ``hops`` (counted by each redirecting member)."""
    pairs = [(k, v) for k, vs in query.items() if k != "hops" for v in vs]
    return f"{path}?{urlencode([*pairs, ('hops', str(hops))])}"


def _retry() -> dict[str, str]:
    return {"Retry-After": str(RETRY_AFTER_S)}
