"""A real redis-server on a random port, for tests that use plain Redis as a test double.

Started with `--save '' --appendonly no` (nothing written to disk), stopped after. Also
`redis_benchmark`, the benchmarks' way to run redis-benchmark against a port.
"""

from __future__ import annotations

import shutil
import tempfile
from types import TracebackType

import redis

from backends.ports import free_port
from backends.process import Child
from tests.support.child_process import STOP_TIMEOUT, run_to_end, start_listening


def redis_benchmark(port: int, requests: int, *args: str) -> float:
    """Requests per second redis-benchmark reports with 50 clients (its last CSV line);
    `args`: its further options and the command (e.g. "-P", "16", "RPUSHX", key, value)."""
    argv = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", "50"]
    run = run_to_end([*argv, "-n", str(requests), "-q", "--csv", *args], timeout=600)
    last = [line for line in run.stdout_lines if line.startswith('"')][-1]
    return float(last.split(",")[1].strip('"'))


class RedisServer:
    def __init__(self, startup_timeout: float = 10.0, *options: str) -> None:
        """`options`: more redis-server flags (e.g. "--maxclients", "2")."""
        self.port = free_port()
        self._startup_timeout = startup_timeout
        self._options = options
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
        try:
            self._child = self._start(binary, self._directory.name)
        except BaseException:
            self.stop()
            raise

    def _start(self, binary: str, directory: str) -> Child:
        return start_listening(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                directory,
                *self._options,
            ],
            self.port,
            "redis-server",
            self._startup_timeout,
        )

    def client(self, protocol: int = 3) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, protocol=protocol)

    def stop(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            child.stop(STOP_TIMEOUT)
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
