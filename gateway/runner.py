"""Run a gateway in a background thread with its own event loop (tests, benchmarks, e2e).

    with ServerThread(config) as server:
        redis.Redis(port=server.port).ping()

`stop()` runs the full shutdown sequence and joins the thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, TypeVar

from backends.base import Engine
from gateway.config import Config
from gateway.resp_server import Server, start_server

T = TypeVar("T")


class ServerThread:
    def __init__(
        self, config: Config, *, engine: Engine | None = None, start_timeout: float = 10.0
    ) -> None:
        self._config = config
        self._engine = engine
        self._start_timeout = start_timeout
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rafka-gateway")
        self._server: Server | None = None

    @property
    def server(self) -> Server:
        if self._server is None:
            raise RuntimeError("server not started")
        return self._server

    @property
    def port(self) -> int:
        return self.server.port

    def start(self) -> ServerThread:
        self._thread.start()
        try:
            self._server = self.call(
                start_server(self._config, engine=self._engine), self._start_timeout
            )
        except BaseException:
            self._stop_loop()
            raise
        return self

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coroutine` on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def shutdown_async(self) -> Any:
        """Start the shutdown sequence; returns a concurrent Future for its end."""
        return asyncio.run_coroutine_threadsafe(self.server.shutdown(), self._loop)

    def stop(self, timeout: float | None = 60.0) -> None:
        if self._server is not None:
            self.shutdown_async().result(timeout)
        self._stop_loop()

    def _stop_loop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
