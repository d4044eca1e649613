"""Local TCP ports for child processes: a free one to hand to a child, and whether a RESP
server (a `rafka` gateway, redis-server) answers PING on one, the `ready` check to give
`backends.process.start` for such a child."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def answers_ping(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16) == b"+PONG\r\n"
    except OSError:
        return False
