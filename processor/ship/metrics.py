"""``/metrics``, ``/healthz`` and ``/readyz`` of ``processor ship``.

Health is :class:`processor.telemetry.health.Health`, as for ``run``: the loop
ticks it, and says what keeps it from being ready (the broker not taking
records, a fatal producer error).
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from processor.telemetry.health import Health

#: sessions named by ``ship_lag_bytes{session}``; the rest are summed only
MAX_LAG_LABELS = 200


class ShipMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.health = Health()
        self.events = Counter("ship_events", "Events acknowledged by the broker", registry=r)
        self.bytes = Counter(
            "ship_bytes", "Session-file bytes whose records are all acknowledged", registry=r
        )
        self.skipped = Counter(
            "ship_events_skipped",
            "Events read again and not sent (already sent; or in an older generation)",
            ["reason"],
            registry=r,
        )
        self.sessions = Gauge("ship_sessions_followed", "Session files followed", registry=r)
        self.lag = Gauge(
            "ship_lag_bytes",
            f"Bytes of a session file not yet acknowledged (the {MAX_LAG_LABELS} largest)",
            ["session"],
            registry=r,
        )
        self.lag_total = Gauge("ship_lag_bytes_total", "Bytes not yet acknowledged", registry=r)
        self.refused = Counter(
            "ship_files_refused", "Session files refused (named in the log)", ["reason"], registry=r
        )
        self.refused_now = Gauge(
            "ship_files_refused_current", "Session files refused and not followed", registry=r
        )
        self.shrinks = Counter("ship_file_shrinks", "Files found shorter than read", registry=r)
        self.switches = Counter(
            "ship_generation_switches", "Sessions moved to a newer format generation", registry=r
        )
        self.inflight = Gauge("ship_inflight_bytes", "Bytes produced, not acknowledged", registry=r)
        self.bound_hits = Counter(
            "ship_bound_hits",
            "Times a bound paused reading (inflight_bytes, unpersisted_events)",
            ["bound"],
            registry=r,
        )
        self.commits = Counter("ship_registry_commits", "Registry transactions", registry=r)
        self.delivery_errors = Counter(
            "ship_delivery_errors", "Records the broker did not acknowledge", registry=r
        )
        self._lag_labels: set[str] = set()

    def set_lags(self, lags: dict[str, int]) -> None:
        """Per-session lag for the largest ones, the total for all."""
        self.lag_total.set(sum(lags.values()))
        top = sorted((v, k) for k, v in lags.items() if v > 0)[-MAX_LAG_LABELS:]
        shown = {k for _, k in top}
        for gone in self._lag_labels - shown:
            self.lag.remove(gone)
        for v, k in top:
            self.lag.labels(k).set(v)
        self._lag_labels = shown

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def serve(metrics: ShipMetrics, host: str, port: int) -> ThreadingHTTPServer:
    """The endpoint on a daemon thread; ``server.server_port`` is the port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.startswith("/metrics"):
                self._send(200, metrics.exposition(), CONTENT_TYPE_LATEST)
            elif self.path.startswith("/healthz"):
                self._send(*metrics.health.liveness())
            elif self.path.startswith("/readyz"):
                self._send(*metrics.health.readiness())
            else:
                self._send(404, b"not found\n")

        def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="ship-http", daemon=True).start()
    return server
