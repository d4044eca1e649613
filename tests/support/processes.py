"""What the kernel says about a process, for tests that check no process outlives its owner."""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path


def pid_gone(pid: int) -> bool:
    """The process no longer runs: gone, or a zombie waiting for whoever adopted it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def listening_addresses(pid: int) -> set[tuple[str, int]]:
    """The (address, port) pairs on which `pid` has a listening TCP socket (IPv4 and IPv6)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            hex_address, hex_port = local.split(":")
            raw = bytes.fromhex(hex_address)
            # /proc prints the address as host-order 32-bit words.
            words = struct.unpack(f"<{len(raw) // 4}I", raw)
            address = socket.inet_ntop(family, struct.pack(f">{len(words)}I", *words))
            found.add((address, int(hex_port, 16)))
    return found
