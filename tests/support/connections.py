"""Many idle client connections to a gateway, and what they cost it (the idle-connection
test and bench/idle_connections.py)."""

from __future__ import annotations

import resource
import socket
from collections.abc import Sequence
from pathlib import Path

PING = b"*1\r\n$4\r\nPING\r\n"
PONG = b"+PONG\r\n"


def raise_open_files(needed: int) -> int:
    """Raise the soft RLIMIT_NOFILE towards the hard limit (processes started afterwards
    inherit it), and the hard limit too where allowed (root); the soft limit now in
    force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (needed, needed))
            return needed
        except (ValueError, OSError):
            pass  # not allowed: up to the hard limit
    wanted = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        soft = wanted
    return soft


def rss_bytes(pid: int) -> int:
    """The process's resident set size (VmRSS of /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def ping_all(sockets: Sequence[socket.socket]) -> int:
    """Send PING on every socket, then read every answer (each socket's timeout bounds
    the wait); the number that got +PONG."""
    for sock in sockets:
        sock.sendall(PING)
    served = 0
    for sock in sockets:
        answer = b""
        try:
            while len(answer) < len(PONG):
                chunk = sock.recv(len(PONG) - len(answer))
                if not chunk:
                    break
                answer += chunk
        except TimeoutError:
            pass
        served += answer == PONG
    return served


def open_connections(port: int, count: int, wave: int, timeout: float) -> list[socket.socket]:
    """`count` connections, opened `wave` at a time, each wave answered before the next
    (a wave larger than the listen backlog, asyncio's 100, would wait for SYN
    retransmits). Raises, closing them, if one is not served."""
    sockets: list[socket.socket] = []
    try:
        while len(sockets) < count:
            batch = [
                socket.create_connection(("127.0.0.1", port), timeout=timeout)
                for _ in range(min(wave, count - len(sockets)))
            ]
            sockets.extend(batch)
            served = ping_all(batch)
            if served != len(batch):
                raise AssertionError(
                    f"{len(batch) - served} of a wave of {len(batch)} connections not "
                    f"answered PONG within {timeout:g}s ({len(sockets)} open)"
                )
    except BaseException:
        close_all(sockets)
        raise
    return sockets


def close_all(sockets: Sequence[socket.socket]) -> None:
    for sock in sockets:
        sock.close()
