"""Start real processes for the end-to-end tests: a rafka gateway on a Tansu broker."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from tests.support.kafka import kafka_document
from tests.support.tansu import free_port
from tests.waiting import wait_until

RAFKA = Path(sys.executable).parent / "rafka"
REPO = Path(__file__).resolve().parent.parent


def port_answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16) == b"+PONG\r\n"
    except OSError:
        return False


class RafkaProcess:
    """`rafka -c <file> -p <port>` as a child process, stopped with SIGTERM."""

    def __init__(self, config_path: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.config_path = config_path
        self.process: subprocess.Popen[bytes] | None = None
        self.stderr_path = config_path.with_suffix(".stderr")

    def start(self) -> None:
        with self.stderr_path.open("wb") as stderr:
            process = self.process = subprocess.Popen(
                [
                    str(RAFKA),
                    "-c",
                    str(self.config_path),
                    "--host",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                ],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                cwd=REPO,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        wait_until(
            lambda: port_answers_ping(self.port) or process.poll() is not None,
            20,
            f"rafka did not answer PING on port {self.port}",
        )
        assert process.poll() is None, f"rafka exited at start: {self.stderr()}"

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def kill(self) -> None:
        """Make sure the process is gone (a failed test must not leave it running)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def terminate(self, timeout: float = 30) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(
                f"rafka did not exit within {timeout}s of SIGTERM: {self.stderr()}"
            ) from None


def write_config(path: Path, bootstrap: str) -> Path:
    """The tests' Kafka configuration (tests/support/kafka.py) as a `rafka -c` file."""
    path.write_text(json.dumps(kafka_document(bootstrap), indent=2))
    return path
