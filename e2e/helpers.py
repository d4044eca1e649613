"""Start real processes for the end-to-end tests: a rafka gateway on a Tansu broker."""

from __future__ import annotations

import json
import signal
import socket
import sys
from pathlib import Path

from backends.kafka.tansu import free_port
from backends.process import Child, start

RAFKA = Path(sys.executable).parent / "rafka"
REPO = Path(__file__).resolve().parent.parent


def gateway_config(bootstrap: str) -> dict[str, dict[str, object]]:
    """Rafka's test configuration (spec §8.2), adapted to modern librdkafka and Tansu."""
    return {
        "general": {
            "bootstrap.servers": bootstrap,
            "session.timeout.ms": 2000,
            "heartbeat.interval.ms": 500,
            "log_level": 0,
        },
        "consumer": {
            "go.events.channel.enable": False,
            "go.application.rebalance.enable": False,
            "enable.auto.commit": True,
            "auto.commit.interval.ms": 500,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
        },
        "producer": {
            "go.delivery.reports": True,
            "queue.buffering.max.ms": 0,
            "allow.auto.create.topics": False,
            "topic.metadata.propagation.max.ms": 200,
        },
    }


def port_answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16) == b"+PONG\r\n"
    except OSError:
        return False


class RafkaProcess:
    """`rafka -c <file> -p <port>` as a child process (dies with the test run), stopped
    with SIGTERM."""

    def __init__(self, config_path: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.config_path = config_path
        self.child: Child | None = None

    def start(self) -> None:
        self.child = start(
            [str(RAFKA), "-c", str(self.config_path), "--host", "127.0.0.1", "-p", str(self.port)],
            name="rafka",
            ready=lambda: port_answers_ping(self.port),
            timeout=20,
            cwd=REPO,
            env={"PYTHONUNBUFFERED": "1"},
            keep_lines=None,
        )

    def stderr(self) -> str:
        return "\n".join(self.child.stderr_lines) if self.child is not None else ""

    def kill(self) -> None:
        """Make sure the process is gone (a failed test must not leave it running)."""
        if self.child is not None:
            self.child.kill()
            self.child.wait(10)

    def terminate(self, timeout: float = 30) -> int:
        assert self.child is not None
        code = self.child.stop(timeout)
        if code == -signal.SIGKILL:
            raise AssertionError(
                f"rafka did not exit within {timeout}s of SIGTERM: {self.stderr()}"
            )
        return code


def write_config(path: Path, bootstrap: str) -> Path:
    path.write_text(json.dumps(gateway_config(bootstrap), indent=2))
    return path
