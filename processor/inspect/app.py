"""The inspector's web application (Starlette): pages, JSON API, live events, redrive.

Routes (all relative, so the app works mounted under a prefix such as
``/inspect`` on the processor's metrics port):

- ``/`` the page, ``/static/*`` its scripts and styles;
- ``GET api/health`` loading state, last error, counts, whether redrive is on;
- ``GET api/sessions?q=&status=&sort=&dir=&offset=&limit=`` one page of the list;
- ``GET api/session?id=`` a session's views, transcript, units, dead letters;
- ``GET api/session/surface?id=`` the surface as the model sees it (a fold
  of the session's events at the views' ``asOfSeq``);
- ``GET api/session/at?id=&seq=`` time travel: the session at ``seq`` and
  its diff against now;
- ``POST api/session/redrive?id=`` with header ``X-Inspector-Token``;
- ``GET api/stream[?session=]`` server-sent events: ``{sessions, resync}``
  whenever views or dead letters of those sessions commit, and a resync as
  each stream's first notice (what changed before it connected).

Safety: every JSON body goes through :func:`~.redact.redact`; the config and
the token are never serialized.  The token is compared in constant time
(:func:`hmac.compare_digest`) and travels in a custom header, which a
cross-site form or image cannot send (a browser preflights it, and no CORS
headers are served).  With no token configured redrive is refused (403)
and the page says how to enable it.  When bound to a loopback address the
``Host`` header must be a loopback name (no DNS rebinding).  Session content
is untrusted text: the page builds every node with ``textContent`` and the
CSP forbids inline scripts.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from processor.client.views_reader import (
    CORE_VIEWS,
    assemble_transcript,
    dead_letter_json,
    session_fold_equivalent,
)
from processor.inspect.history import (
    EventHistory,
    HistoryError,
    diff,
    fold_document,
    fold_records,
    surface_detail,
)
from processor.inspect.redact import redact
from processor.inspect.state import InspectorState
from processor.protocol import is_transcript_page

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
TOKEN_HEADER = "X-Inspector-Token"
LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "::1", "[::1]"]

#: Redrive ``(session, seq it is quarantined at)`` through the existing API
#: (:func:`~processor.inspect.server.writer_redrive` is the one place to adapt).
RedriveFn = Callable[[str, int], None]


def _json(doc: Any, status: int = 200) -> Response:
    return Response(
        orjson.dumps(redact(doc), option=orjson.OPT_NON_STR_KEYS),
        status,
        media_type="application/json",
        headers={"Cache-Control": "no-store"},
    )


def _error(message: str, status: int) -> Response:
    return Response(orjson.dumps({"error": message}), status, media_type="application/json")


def _int(request: Request, name: str, default: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None


class Inspector:
    """The application over one :class:`InspectorState`."""

    def __init__(
        self,
        state: InspectorState,
        history: EventHistory,
        *,
        token: str | None,
        redrive: RedriveFn | None,
    ) -> None:
        self.state = state
        self.history = history
        self._token = token.encode() if token else None
        self._redrive = redrive
        self._closing = False
        self._wakers: set[Callable[[], None]] = set()

    def close(self) -> None:
        """End every open event stream (so the server can stop at once)."""
        self._closing = True
        for wake in list(self._wakers):
            wake()

    @property
    def redrive_enabled(self) -> bool:
        return self._token is not None and self._redrive is not None

    # ------------------------------------------------------------ pages

    async def index(self, request: Request) -> Response:
        html = (STATIC / "index.html").read_text()
        return Response(
            html, media_type="text/html; charset=utf-8", headers={"Cache-Control": "no-store"}
        )

    async def health(self, request: Request) -> Response:
        return _json(
            {
                "loaded": self.state.loaded.is_set(),
                "error": self.state.error,
                **self.state.counts(),
                "redrive": self._token is not None,
                "topics": {
                    "views": self.state.config.topics.views,
                    "events": self.state.config.topics.events,
                    "dlq": self.state.config.topics.dlq,
                },
            }
        )

    async def sessions(self, request: Request) -> Response:
        q = request.query_params
        try:
            offset, limit = _int(request, "offset", 0), _int(request, "limit", 50)
            # sorting 100,000 summaries takes ~0.1 s: off the event loop
            page = await run_in_threadpool(
                self.state.page,
                query=q.get("q", ""),
                status=q.get("status", ""),
                sort=q.get("sort", "lastActivity"),
                descending=q.get("dir", "desc") != "asc",
                offset=offset,
                limit=limit,
            )
        except ValueError as exc:
            return _error(str(exc), 400)
        return _json({"total": page.total, "rows": page.rows, "loaded": self.state.loaded.is_set()})

    # ------------------------------------------------------------ one session

    def _lookup(self, request: Request) -> tuple[str, Any] | Response:
        sid = request.query_params.get("id")
        if not sid:
            return _error("missing ?id=<session>", 400)
        found = self.state.session(sid)
        if found is None:
            return _error(f"no session {sid!r} in the views or the dead letters", 404)
        return sid, found

    async def session(self, request: Request) -> Response:
        got = self._lookup(request)
        if isinstance(got, Response):
            return got
        _sid, (summary, views, letters, total) = got
        status = views["status"].value if "status" in views else None
        observed = status.get("lastSeq") if isinstance(status, dict) else None
        try:
            transcript = assemble_transcript(views)
            transcript_error = None
        except (ValueError, KeyError, TypeError) as exc:
            transcript, transcript_error = [], str(exc)
        units = [
            {
                "name": name,
                "asOfSeq": rec.as_of_seq,
                "stateVersion": rec.state_version,
                "observedSeq": observed,
                "value": rec.value,
            }
            for name, rec in sorted(views.items())
            if name not in CORE_VIEWS and not is_transcript_page(name)
        ]
        surface = views.get("surface")
        messages = views.get("messages")
        return _json(
            {
                "summary": summary.to_json(),
                "status": status,
                "surface": surface.value if surface else None,
                "messages": messages.value if messages else [],
                "transcript": transcript,
                "transcriptError": transcript_error,
                "units": units,
                "requestHeader": views["requestHeader"].value if "requestHeader" in views else None,
                "toolHistory": views["toolHistory"].value if "toolHistory" in views else None,
                "deadLetters": [dead_letter_json(d) for d in letters],
                "deadLettersTotal": total,
                "redrive": self._token is not None,
            }
        )

    def _fold(self, sid: str, partition: int, upto: int | None) -> tuple[Any, bool]:
        """The fold up to ``upto`` and whether every refused record was known."""
        records = self.history.records(sid, partition)
        refused = self.state.refused(sid)
        events = self.state.config.topics.events
        dead = {o for t, p, o in refused.offsets if t == events and p == partition}
        return fold_records(sid, records, dead, upto), refused.complete

    async def surface(self, request: Request) -> Response:
        got = self._lookup(request)
        if isinstance(got, Response):
            return got
        sid, (summary, *_rest) = got
        try:
            fold, complete = await run_in_threadpool(
                self._fold, sid, summary.partition, summary.as_of_seq
            )
        except HistoryError as exc:
            return _error(str(exc), 503)
        detail = surface_detail(fold)
        detail["viewsAsOfSeq"] = summary.as_of_seq
        detail["refusedComplete"] = complete
        return _json(detail)

    async def at(self, request: Request) -> Response:
        got = self._lookup(request)
        if isinstance(got, Response):
            return got
        sid, (summary, views, *_rest) = got
        try:
            seq = _int(request, "seq", summary.as_of_seq)
        except ValueError as exc:
            return _error(str(exc), 400)
        if seq < 0 or seq > summary.as_of_seq:
            return _error(
                f"seq {seq} is outside 0..{summary.as_of_seq} (the session's asOfSeq)", 400
            )
        try:
            fold, complete = await run_in_threadpool(self._fold, sid, summary.partition, seq)
        except HistoryError as exc:
            return _error(str(exc), 503)
        then = fold_document(fold)
        try:
            now = session_fold_equivalent(views)
            changes = diff(then, now)
        except (KeyError, ValueError, TypeError) as exc:
            now, changes = None, [{"path": "(views)", "kind": "unreadable", "now": str(exc)}]
        return _json(
            {
                "seq": seq,
                "then": then,
                "surface": surface_detail(fold),
                "diff": changes,
                "nowAsOfSeq": summary.as_of_seq,
                "refusedComplete": complete,
            }
        )

    async def redrive(self, request: Request) -> Response:
        if self._token is None or self._redrive is None:
            return _error(
                "redrive is disabled: start the inspector with --token "
                "(or inspect_token in the config)",
                403,
            )
        given = request.headers.get(TOKEN_HEADER, "").encode()
        if not hmac.compare_digest(given, self._token):
            return _error("wrong or missing token", 403)
        got = self._lookup(request)
        if isinstance(got, Response):
            return got
        sid, (summary, *_rest) = got
        if summary.status != "quarantined":
            return _error(f"session {sid} is not quarantined", 409)
        try:
            await run_in_threadpool(self._redrive, sid, summary.as_of_seq)
        except Exception as exc:  # a delivery failure is the operator's to see
            log.warning("inspector: redrive of %s failed: %s", sid, exc)
            return _error(f"redrive failed: {exc}", 502)
        log.info("inspector: redrive requested for %s", sid)
        return _json({"requested": sid})

    # ------------------------------------------------------------ live

    async def stream(self, request: Request) -> Response:
        only = request.query_params.get("session") or None
        loop = asyncio.get_running_loop()
        wake_event = asyncio.Event()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closing
                loop.call_soon_threadsafe(wake_event.set)

        sub = self.state.subscribe(only, wake)
        self._wakers.add(wake)

        async def events() -> AsyncIterator[bytes]:
            try:
                yield b"retry: 2000\n\n"
                while not self._closing:
                    try:
                        await asyncio.wait_for(wake_event.wait(), timeout=15.0)
                    except TimeoutError:
                        yield b": keepalive\n\n"
                        continue
                    wake_event.clear()
                    if self._closing:
                        break
                    ids, resync = self.state.take(sub)
                    if ids or resync:
                        body = orjson.dumps({"sessions": ids, "resync": resync})
                        yield b"data: " + body + b"\n\n"
                    await asyncio.sleep(0.2)  # coalesce a burst of commits into one notice
            finally:
                self._wakers.discard(wake)
                self.state.unsubscribe(sub)

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    # ------------------------------------------------------------ assembly

    def routes(self) -> list[Any]:
        return [
            Route("/", self.index),
            Route("/api/health", self.health),
            Route("/api/sessions", self.sessions),
            Route("/api/session", self.session),
            Route("/api/session/surface", self.surface),
            Route("/api/session/at", self.at),
            Route("/api/session/redrive", self.redrive, methods=["POST"]),
            Route("/api/stream", self.stream),
            Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
        ]


class _SecurityHeaders:
    """CSP (no inline script, nothing from elsewhere), no framing, no sniffing."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [
                    (
                        b"content-security-policy",
                        b"default-src 'self'; img-src 'self' data:; object-src 'none'; "
                        b"frame-ancestors 'none'; base-uri 'self'",
                    ),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"),
                ]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def build_app(
    inspector: Inspector, *, host: str, extra_routes: list[Any] | None = None, mount_at: str = ""
) -> Starlette:
    """The ASGI app; ``mount_at="/inspect"`` puts the inspector under a prefix."""
    routes = list(extra_routes or [])
    if mount_at:
        from starlette.responses import RedirectResponse

        async def to_slash(request: Request) -> Response:
            return RedirectResponse(f"{mount_at}/")

        routes += [Route(mount_at, to_slash), Mount(mount_at, routes=inspector.routes())]
    else:
        routes += inspector.routes()
    middleware = [Middleware(_SecurityHeaders)]
    if host in LOOPBACK_HOSTS:
        middleware.insert(0, Middleware(TrustedHostMiddleware, allowed_hosts=LOOPBACK_HOSTS))
    return Starlette(routes=routes, middleware=middleware)
