"""The inspector on the processor's own HTTP port (``processor run --inspect``).

The stdlib server of :mod:`processor.service.ops.http` cannot host an ASGI
app, so when the inspector is enabled the whole port is served by uvicorn:
``/metrics``, ``/healthz`` and ``/readyz`` answer exactly as before (the
same route table) and the inspector lives under ``/inspect/``.  Off by default.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from processor.config import ServiceConfig
from processor.inspect.server import InspectorServer
from processor.service.ops.http import SESSIONS, Answer, PathHandler
from processor.service.ops.http import routes as ops_routes
from processor.telemetry.metrics import Metrics


class MountedInspector:
    """What ``processor run`` needs of its HTTP server: the port and shutdown."""

    def __init__(self, server: InspectorServer) -> None:
        self.server = server

    @property
    def server_port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return self.server.url

    def shutdown(self) -> None:
        self.server.stop()


def query_route(queries: PathHandler) -> Route:
    """``/sessions/...`` answered by the query handler (queries.py) in a worker thread.

    The raw path is passed on: a session id's ``%2F`` must reach the handler
    still encoded, or it would split the route.
    """

    async def sessions(request: Request) -> Response:
        raw = request.scope.get("raw_path") or request.url.path.encode()
        path = raw.decode("latin-1")
        if request.url.query:
            path = f"{path}?{request.url.query}"
        status, body, headers = await run_in_threadpool(queries, path)
        return Response(body, status, headers=dict(headers))

    return Route(SESSIONS + "{rest:path}", sessions)


def _route(path: str, answer: Callable[[], Answer]) -> Route:
    async def endpoint(request: Request) -> Response:
        code, body, media_type = answer()
        return Response(body, code, media_type=media_type)

    return Route(path, endpoint)


def serve_with_inspector(
    metrics: Metrics, config: ServiceConfig, queries: PathHandler | None = None
) -> MountedInspector:
    routes = [_route(path, answer) for path, answer in ops_routes(metrics).items()]
    if queries is not None:
        routes.append(query_route(queries))
    server = InspectorServer(
        config,
        host=config.metrics_host,
        port=config.metrics_port,
        token=config.inspect_token or None,
        mount_at="/inspect",
        extra_routes=routes,
    )
    return MountedInspector(server.start())
