"""The metrics endpoint's HTTP server: prometheus_client's app served a thread per
connection, as its `start_http_server` does, but by a server that knows its connections:
stopping it closes the ones still open (a slow or stuck scraper) and joins their threads,
and a connection silent for `_Handler.timeout` is dropped."""

from __future__ import annotations

import contextlib
import socket
import threading
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import WSGIApplication


class _Handler(WSGIRequestHandler):
    # A client that sends nothing for this long is dropped (its thread ends).
    timeout = 60.0

    def log_message(self, format: str, *args: object) -> None:
        """Quiet, as prometheus_client's."""


class MetricsServer(ThreadingMixIn, WSGIServer):
    """A thread per connection, as prometheus_client's server; but it knows its
    connections, so that stopping closes them and joins their threads (server_close)."""

    daemon_threads = False
    block_on_close = True

    def __init__(self, *args: object, **kwargs: object) -> None:
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self._open_lock:
            connections = list(self._open)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


def serve(host: str, port: int, app: WSGIApplication) -> tuple[MetricsServer, threading.Thread]:
    """Listen on `host`:`port` and serve `app` on a thread of its own (OSError if the
    address cannot be bound)."""
    # IPv6 hosts too, as prometheus_client's start_http_server.
    family, _, _, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]

    class Server(MetricsServer):
        address_family = family

    server = make_server(str(address[0]), port, app, Server, _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread
