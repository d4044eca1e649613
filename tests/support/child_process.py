"""Programs the tests and benches run as child processes, through `backends.process`, so
that they die with their owner (parent-death signal), even when it is SIGKILLed: a server
(redis-server, tansu) ready once it listens, or a command run to its end (redis-benchmark,
a script) within a bound."""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from typing import Any

from backends.process import Child, ProcessError, describe_exit, spawn, start

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


def run_to_end(argv: Sequence[str], timeout: float, *, check: bool = True, **options: Any) -> Child:
    """`argv` as a child (`backends.process.spawn`'s `options`), once it has exited; all its
    output is kept (`stdout_lines`, `stderr_lines`). ProcessError naming it, the bound and
    its last output (the child killed) if it still runs after `timeout` s, or, with `check`,
    if it exits with a status other than 0."""
    child = spawn(argv, keep_lines=None, **options)
    try:
        code = child.wait(timeout)
    except ProcessError:
        child.stop(0)
        raise
    if check and code != 0:
        raise ProcessError(
            f"{child.name} (pid {child.pid}) ended with {describe_exit(code)}; last output:\n"
            f"{child.tail()}\n  command: {' '.join(child.argv)}"
        )
    return child
