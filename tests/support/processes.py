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


def children(pid: int) -> set[int]:
    """The pids of a process's children (e.g. a gateway's tower and stores)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "children").read_text().split()
        except (FileNotFoundError, ProcessLookupError):
            # A thread that ended while it was read (a JVM's come and go): skipping the
            # whole process here missed its other threads' children (pyspark.daemon).
            continue
        found.update(int(child) for child in text)
    return found


def descendants(pid: int) -> set[int]:
    """The pids of a process's children, their children, and so on (those still there)."""
    found: set[int] = set()
    parents = [pid]
    while parents:
        parent = parents.pop()
        try:
            below = children(parent) - found
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited meanwhile
        found |= below
        parents.extend(below)
    return found


def child_running(pid: int, argument: str) -> int | None:
    """The pid of a running child of `pid` whose command line has `argument`, if any."""
    for child in children(pid):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError):
            continue
        if argument.encode() in argv and not pid_gone(child):
            return child
    return None


def vm_rss_kib(pid: int) -> int:
    """The resident memory of `pid` (VmRSS in /proc/<pid>/status), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise ValueError(f"no VmRSS for pid {pid}")


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


def threads_and_files(pid: int) -> tuple[int, int]:
    """The process's thread count and open file descriptors."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1]), len(list(Path(f"/proc/{pid}/fd").iterdir()))
    raise RuntimeError(f"no Threads for process {pid}")


def children_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by the live children of `pid`."""
    total = 0.0
    for child in children(pid):
        try:
            total += process_cpu(child)
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended meanwhile
    return total


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) `pid` used so far, all its threads."""
    return sum(_user_system(Path(f"/proc/{pid}/stat")))


def thread_cpu(pid: int) -> dict[int, tuple[str, float, float]]:
    """Each thread of `pid`: its id -> (its name, user CPU seconds, system CPU seconds)."""
    threads = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        name = (task / "comm").read_text().strip()
        threads[int(task.name)] = (name, *_user_system(task / "stat"))
    return threads


def _user_system(stat: Path) -> tuple[float, float]:
    """User and system CPU seconds from a /proc stat file (a process's or a thread's)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / ticks, int(fields[12]) / ticks
