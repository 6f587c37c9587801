"""Running the inspector: uvicorn on a socket we bind ourselves.

Binding the socket first gives the real port at once (``port=0`` picks a
free one) and fails with a clear message when the port is taken.  The
default host is ``127.0.0.1``: exposing the page elsewhere is an explicit
``--host`` choice.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any

import uvicorn

from processor.config import ServiceConfig
from processor.inspect.app import Inspector, RedriveFn, build_app
from processor.inspect.history import EventHistory
from processor.inspect.state import InspectorState

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765


def writer_redrive(config: ServiceConfig) -> RedriveFn:
    """Redrive through :meth:`SessionWriter.redrive` (the one redrive API).

    One writer (an idempotent producer) is created on first use and kept.
    ``seq`` is where the session is quarantined: the control-topic command
    names it, so a stale page cannot lift a newer quarantine.
    """
    from processor.client.session_writer import SessionWriter

    holder: list[SessionWriter] = []
    lock = threading.Lock()

    def redrive(sid: str, seq: int) -> None:
        with lock:
            if not holder:
                holder.append(SessionWriter(config, client_id="processor-inspect"))
            holder[0].redrive(sid, seq)

    return redrive


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


class InspectorServer:
    """State + history + app + uvicorn, started in a thread or in the foreground."""

    def __init__(
        self,
        config: ServiceConfig,
        *,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        token: str | None = None,
        redrive: RedriveFn | None = None,
        mount_at: str = "",
        extra_routes: list[Any] | None = None,
    ) -> None:
        self.config = config
        self.state = InspectorState(config)
        self.inspector = Inspector(
            self.state,
            EventHistory(config),
            token=token or None,
            redrive=redrive or writer_redrive(config),
        )
        self.app = build_app(
            self.inspector, host=host, extra_routes=extra_routes, mount_at=mount_at
        )
        self.sock = bind(host, port)
        self.host = host
        self.port = int(self.sock.getsockname()[1])
        self.mount_at = mount_at
        self._server = uvicorn.Server(
            uvicorn.Config(
                self.app,
                log_level="warning",
                access_log=False,
                lifespan="off",
                timeout_graceful_shutdown=2,
            )
        )
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{self.mount_at}/"

    def start(self) -> InspectorServer:
        """Serve in a daemon thread (demo, tests, the processor's port)."""
        self.state.start()
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self.sock]},
            name="inspector-http",
            daemon=True,
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in this thread until SIGINT/SIGTERM (``processor inspect``)."""
        self.state.start()
        try:
            self._server.run(sockets=[self.sock])
        finally:
            self.state.stop()

    def stop(self) -> None:
        self.inspector.close()
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
        self.state.stop()
        self.sock.close()

    def __enter__(self) -> InspectorServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
