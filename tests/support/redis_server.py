"""A real redis-server on a random port, for tests that use plain Redis as a test double.

Started with `--save '' --appendonly no` (nothing written to disk), stopped after. Also
`redis_benchmark`, the benchmarks' way to run redis-benchmark against a port.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from types import TracebackType

import redis

from tests.support.tansu import free_port


def redis_benchmark(port: int, requests: int, *args: str) -> float:
    """Requests per second redis-benchmark reports with 50 clients (its last CSV line);
    `args`: its further options and the command (e.g. "-P", "16", "RPUSHX", key, value)."""
    output = subprocess.run(
        [
            *("redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", "50"),
            *("-n", str(requests), "-q", "--csv", *args),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    last = [line for line in output.splitlines() if line.startswith('"')][-1]
    return float(last.split(",")[1].strip('"'))


class RedisServer:
    def __init__(self, startup_timeout: float = 10.0, *options: str) -> None:
        """`options`: more redis-server flags (e.g. "--maxclients", "2")."""
        self.port = free_port()
        self._startup_timeout = startup_timeout
        self._options = options
        self._process: subprocess.Popen[bytes] | None = None
        self._directory: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError("redis-server is not installed (make system-packages)")
        self._directory = tempfile.TemporaryDirectory(prefix="rafka-redis-")
        self._process = subprocess.Popen(
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
                self._directory.name,
                *self._options,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + self._startup_timeout
        while True:
            if self._process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self._process.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(
                        f"redis-server did not listen on {self.port} in {self._startup_timeout}s"
                    ) from None
                time.sleep(0.02)

    def client(self, protocol: int = 3) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, protocol=protocol)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
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
