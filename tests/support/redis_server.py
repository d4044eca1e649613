"""A real redis-server on a random port, for tests that use plain Redis as a test double.

Started with `--save '' --appendonly no` (nothing written to disk), stopped after.
"""

from __future__ import annotations

import shutil
import tempfile
from types import TracebackType

import redis

from backends.process import Child, start
from tests.support.tansu import accepts_connections, free_port


class RedisServer:
    def __init__(self, startup_timeout: float = 10.0) -> None:
        self.port = free_port()
        self._startup_timeout = startup_timeout
        self._child: Child | None = None
        self._directory: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError("redis-server is not installed (make system-packages)")
        self._directory = tempfile.TemporaryDirectory(prefix="rafka-redis-")
        # Nothing written to disk: no RDB snapshot, no append-only file.
        settings = ["--save", "", "--appendonly", "no", "--dir", self._directory.name]
        self._child = start(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", *settings],
            name="redis-server",
            ready=lambda: accepts_connections(self.port),
            timeout=self._startup_timeout,
        )

    def client(self, protocol: int = 3) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, protocol=protocol)

    def stop(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            child.stop(5)
        directory, self._directory = self._directory, None
        if directory is not None:
            directory.cleanup()

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
