"""A server the tests and benches run as a child process (redis-server, tansu): started
through `backends.process`, so it is ready when it listens, stops within a bound and dies
with its owner (parent-death signal), even when the owner is SIGKILLed."""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence

from backends.process import Child, start

STOP_TIMEOUT = 5.0  # seconds between SIGTERM and SIGKILL
KEEP_LINES = 200  # output lines kept for error messages


def accepts_connections(port: int) -> bool:
    """Something listens on 127.0.0.1:`port` (a readiness probe)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
    except OSError:
        return False
    return True


def start_listening(
    argv: Sequence[str],
    port: int,
    name: str,
    timeout: float,
    env: Mapping[str, str] | None = None,
) -> Child:
    """`argv` as a child, returned once 127.0.0.1:`port` accepts connections. ProcessError
    (naming `name`, the bound and its last output; the child stopped) if it exits first or
    does not listen within `timeout` s."""
    return start(
        argv,
        name=name,
        ready=lambda: accepts_connections(port),
        timeout=timeout,
        stop_timeout=STOP_TIMEOUT,
        env=env,
        keep_lines=KEEP_LINES,
    )
