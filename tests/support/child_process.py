"""Start-up and stop of a server the tests run as a child process (redis-server, tansu)."""

from __future__ import annotations

import socket
import subprocess
import time


def wait_listening(process: subprocess.Popen[bytes], port: int, name: str, timeout: float) -> None:
    """Return once 127.0.0.1:`port` accepts connections; RuntimeError if `name` exits
    first, TimeoutError (after stopping it) if it does not listen within `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode} at start")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                stop(process)
                raise TimeoutError(
                    f"{name} did not listen on 127.0.0.1:{port} within {timeout}s"
                ) from None
            time.sleep(0.02)


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it has not exited after 5 s; reaped either way."""
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
