"""The HTTP server of a fake the real CLIs talk to (``fake_model.py``, ``fake_amp.py``): on
127.0.0.1 with a free port, or on a listener handed in (a test that must know the port before
the fake exists), served on a thread of its own until the fake is closed."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class LocalServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(
        self, listener: socket.socket | None, handler: type[BaseHTTPRequestHandler]
    ) -> None:
        if listener is None:
            super().__init__(("127.0.0.1", 0), handler)
        else:
            super().__init__(listener.getsockname(), handler, bind_and_activate=False)
            self.socket.close()
            self.socket = listener

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up mid-request: the fake's own log says what became of it


class ServedFake:
    """A fake served by a :class:`LocalServer` (:meth:`_serve`): ``with fake:`` serves it, and
    :meth:`close` stops it, waking whatever waits on ``_cond`` to see ``_closing``."""

    _cond: threading.Condition
    _closing: threading.Event

    def _serve(self, server: LocalServer) -> None:
        self._server = server
        self.port: int = server.server_address[1]
        self._serving = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        self._serving.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closing.set()
        with self._cond:
            self._hang_up()
            self._cond.notify_all()
        self._server.shutdown()
        self._server.server_close()
        self._serving.join(timeout=5)

    def _hang_up(self) -> None:
        """What else the fake holds open ends as it closes (``_cond`` held)."""
