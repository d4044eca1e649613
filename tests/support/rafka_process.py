"""The `rafka` command as a real process (end-to-end tests, benchmarks)."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from backends.ports import answers_ping, free_port
from backends.process import Child, start
from tests.support.kafka import kafka_document

RAFKA = Path(sys.executable).parent / "rafka"
REPO = Path(__file__).resolve().parents[2]
# The child runs this checkout's code, whatever checkout the editable install points at:
# a benchmark run from a second worktree (old and new trees compared) measured the
# first one's code in both.
CHILD_ENV = {"PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}


class RafkaProcess:
    """`rafka -c <file> -p <port>` as a child process (dies with the test run), stopped
    with SIGTERM. `wrapper`: a command that ends by exec'ing its arguments (so the pid
    stays rafka's), e.g. one that mounts something in a namespace of its own first."""

    def __init__(
        self, config_path: Path, port: int | None = None, *args: str, wrapper: Sequence[str] = ()
    ) -> None:
        self.port = port or free_port()
        self.config_path = config_path
        self.args = args
        self.wrapper = list(wrapper)
        self.child: Child | None = None

    def start(self) -> None:
        argv = [str(RAFKA), "-c", str(self.config_path), "--host", "127.0.0.1"]
        self.child = start(
            [*self.wrapper, *argv, "-p", str(self.port), *self.args],
            name="rafka",
            ready=lambda: answers_ping(self.port),
            timeout=20,
            cwd=REPO,
            env=CHILD_ENV,
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


def exit_status(child: Child) -> int:
    """A benchmark's exit status once its stopped `rafka` has exited: 0 when rafka exited
    0, else 1, with rafka's exit code and last lines on stderr."""
    code = child.returncode
    if code != 0:
        print(f"rafka exited with {code}: {child.stderr_lines[-5:]}", file=sys.stderr)
        return 1
    return 0


def write_config(path: Path, bootstrap: str) -> Path:
    """The tests' Kafka configuration (tests/support/kafka.py) as a `rafka -c` file."""
    path.write_text(json.dumps(kafka_document(bootstrap), indent=2))
    return path


def start_rafka(
    workdir: Path, document: dict[str, Any], *args: str, wrapper: Sequence[str] = ()
) -> tuple[Child, int]:
    """`rafka` with `document` as its configuration file, listening on a free loopback
    port, its data directory (embedded engine) in `workdir`; the child and its port.
    `wrapper` runs it (e.g. `prlimit --nofile=...`, which execs it under the same pid).
    The caller stops it (`child.stop(timeout)`)."""
    port = free_port()
    config = workdir / "rafka.json"
    config.write_text(json.dumps(document))
    argv = [*wrapper, str(RAFKA), "-c", str(config), "--host", "127.0.0.1", "-p", str(port)]
    child = start(
        [*argv, "--data-dir", str(workdir / "data"), *args],
        name="rafka",
        ready=lambda: answers_ping(port),
        timeout=60,
        cwd=REPO,
        env=CHILD_ENV,
    )
    return child, port
