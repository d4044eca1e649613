"""A real HTTP server on 127.0.0.1 that records every request and answers each path as
the test says: 2xx, a failure (5xx), or a stall (no answer until the server closes).

    with HttpSink() as sink:
        sink.answer("/down", lambda body: 503)
        sink.answer("/stuck", STALL)
        ... sink.url("/down") ...
        sink.delivered("/ok")   # the JSON bodies answered 2xx, in arrival order
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# An answer: the status to send, or STALL to hold the request until the sink closes.
STALL = -1
Answer = Callable[[dict[str, Any]], int]


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    # The status answered; STALL for a request held without answer.
    status: int


class HttpSink:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._received: list[Received] = []
        self._answers: dict[str, Answer] = {}
        self._closing = threading.Event()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                status = sink._answer_for(self.path, body)
                sink._record(Received(self.path, dict(self.headers), body, status))
                if status == STALL:
                    sink._closing.wait(120)
                    return
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"no" if status >= 300 else b"ok")

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the test reads `received` instead."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="http-sink")

    def _answer_for(self, path: str, body: dict[str, Any]) -> int:
        with self._lock:
            answer = self._answers.get(path)
        return 200 if answer is None else answer(body)

    def _record(self, received: Received) -> None:
        with self._lock:
            self._received.append(received)

    def answer(self, path: str, answer: Answer) -> None:
        """How `path` answers from now on (default: 200)."""
        with self._lock:
            self._answers[path] = answer

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def received(self, path: str) -> list[Received]:
        """Every request to `path`, in arrival order."""
        with self._lock:
            return [r for r in self._received if r.path == path]

    def delivered(self, path: str) -> list[dict[str, Any]]:
        """The bodies `path` answered 2xx, in arrival order."""
        return [r.body for r in self.received(path) if 200 <= r.status < 300]

    def __enter__(self) -> HttpSink:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)
