"""The member's HTTP port: every route in one table, served by either server.

``/metrics`` (Prometheus), ``/healthz`` and ``/readyz`` (:attr:`Metrics.health`)
and, with queries, ``/sessions/...`` (``queries.py``).  :func:`serve` is the
stdlib server; with ``--inspect`` the same table is mounted on the
inspector's ASGI app (``processor/inspect/mount.py``) beside ``/inspect/``.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from processor.telemetry.metrics import Metrics

TEXT = "text/plain; charset=utf-8"
#: where the queries by session are mounted
SESSIONS = "/sessions/"

#: an answer: (status, body, content type)
Answer = tuple[int, bytes, str]


def routes(metrics: Metrics, liveness_s: float = 60.0) -> dict[str, Callable[[], Answer]]:
    """The port's fixed routes: path -> answer."""
    return {
        "/metrics": lambda: (200, metrics.exposition(), CONTENT_TYPE_LATEST),
        "/healthz": lambda: (*liveness(metrics, liveness_s), TEXT),
        "/readyz": lambda: (*readiness(metrics, liveness_s), TEXT),
    }


def liveness(m: Metrics, liveness_s: float = 60.0) -> tuple[int, bytes]:
    """``/healthz``: the loop ticked recently and nothing fatal happened."""
    return m.health.liveness(liveness_s)


def readiness(m: Metrics, liveness_s: float = 60.0) -> tuple[int, bytes]:
    """``/readyz``: see :class:`processor.telemetry.health.Health`."""
    return m.health.readiness(liveness_s)


#: A path -> (status, body, headers) answerer mounted under ``/sessions/`` (queries.py).
PathHandler = Callable[[str], tuple[int, bytes, Mapping[str, str]]]


class _Handler(BaseHTTPRequestHandler):
    routes: dict[str, Callable[[], Answer]]
    queries: PathHandler | None = None

    def do_GET(self) -> None:
        if self.queries is not None and self.path.startswith(SESSIONS):
            status, body, headers = self.queries(self.path)
            self._send(status, body, headers=headers)
            return
        for path, answer in self.routes.items():
            if self.path.startswith(path):
                self._send(*answer())
                return
        self._send(404, b"not found\n")

    def _send(
        self,
        code: int,
        body: bytes,
        ctype: str = TEXT,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.send_response(code)
        headers = headers or {}
        self.send_header("Content-Type", headers.get("Content-Type", ctype))
        for name, value in headers.items():
            if name != "Content-Type":
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


def serve(
    metrics: Metrics, host: str, port: int, queries: PathHandler | None = None
) -> ThreadingHTTPServer:
    """Start the HTTP endpoint in a daemon thread; ``server.server_port`` is the port."""
    handler = type(
        "Handler",
        (_Handler,),
        {"routes": routes(metrics), "queries": staticmethod(queries) if queries else None},
    )
    server = ThreadingHTTPServer((host, port), handler)
    # a stop's shutdown() waits up to one poll interval (0.5 s by default, in
    # each member's stop of a rolling restart: issue 37)
    serving = functools.partial(server.serve_forever, poll_interval=0.05)
    threading.Thread(target=serving, name="metrics-http", daemon=True).start()
    return server
