"""Local TCP ports for child processes: a free one to hand to a child, and whether a RESP
server (a `rafka` gateway, redis-server) answers PING on one, the `ready` check to give
`backends.process.start` for such a child."""

from __future__ import annotations

import random
import socket
from pathlib import Path

# free_port() picks below the kernel's ephemeral range. A port from bind(0) lies inside
# it, where every outgoing connection (librdkafka, redis clients, Spark) and every other
# bind(0) takes its local port: between the probe and the child's bind, one of them could
# take it (a gateway failed to start with "address already in use" that way).
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10_000
_handed_out: set[int] = set()


def _ephemeral_start() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, below the ephemeral range, not handed out before by
    this process; bind(0)'s as a last resort."""
    highest = _ephemeral_start() - 1
    for _ in range(100):
        port = random.randint(_LOWEST, highest) if highest > _LOWEST else 0
        if port in _handed_out:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            chosen: int = probe.getsockname()[1]
        _handed_out.add(chosen)
        return chosen
    with socket.socket() as probe:
        probe.bind((host, 0))
        port = probe.getsockname()[1]
        return port


def answers_ping(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16) == b"+PONG\r\n"
    except OSError:
        return False
