"""Idle connections: what each costs the gateway, and whether all of them are served.

Starts a real `rafka` (embedded Dafka engine on a temporary data directory), opens
--connections client connections (default 10,000) in waves, and checks that every one is
served: each sends PING and must get PONG, once in its wave and once more after all of
them are open. The gateway's resident memory (VmRSS of the `rafka` process; the
embedded tower and stores are processes of their own and not counted) is read before the
first connection and once all are open and answered; the growth divided by the number of
connections is the cost of one idle connection. The aim (issue 11) is at most 50 KB each.

The soft limit on open files (RLIMIT_NOFILE) is raised up to the hard limit, in this
process and so in the gateway it starts; the gateway's `max_clients` is set above the
number of connections.

Prints the figures; never passes or fails anything. Usage: `make bench-idle`, or
`.venv/bin/python bench/idle_connections.py [--connections N] [--wave N]`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.connections import (
    close_all,
    open_connections,
    ping_all,
    raise_open_files,
    rss_bytes,
)
from tests.support.rafka_process import exit_status, start_rafka

AIM_BYTES = 50 * 1024  # issue 11: at most 50 KB per idle connection
# File descriptors this process and the gateway need besides the connections.
SPARE_FILES = 200


def measure(port: int, pid: int, count: int, wave: int, timeout: float) -> dict[str, float]:
    """Open `count` idle connections; RSS growth per connection, and how many are served
    once all are open."""
    # One connection first: what the first client costs once (lazy imports, buffers) is
    # not the cost of each.
    warm = open_connections(port, 1, 1, timeout)
    before = rss_bytes(pid)
    started = time.monotonic()
    sockets = open_connections(port, count, wave, timeout)
    opened = time.monotonic() - started
    try:
        served = sum(ping_all(sockets[i : i + wave]) for i in range(0, len(sockets), wave))
        after = rss_bytes(pid)
    finally:
        close_all([*sockets, *warm])
    return {
        "before": before,
        "after": after,
        "per_connection": (after - before) / count,
        "served": served,
        "open_seconds": opened,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=10_000, help="idle connections")
    parser.add_argument("--wave", type=int, default=100, help="connections opened at a time")
    parser.add_argument("--timeout", type=float, default=30.0, help="socket timeout (s)")
    args = parser.parse_args()
    limit = raise_open_files(args.connections + SPARE_FILES)
    if limit < args.connections + SPARE_FILES:
        print(
            f"open files limited to {limit} (ulimit -Hn): at most "
            f"{limit - SPARE_FILES} connections",
            file=sys.stderr,
        )
        return 1
    with tempfile.TemporaryDirectory(prefix="rafka-bench-idle-") as tmp:
        gateway = {"max_clients": args.connections + 100}
        child, port = start_rafka(Path(tmp), {"gateway": gateway}, "--engine", "dafka")
        try:
            figures = measure(port, child.pid, args.connections, args.wave, args.timeout)
        finally:
            child.stop(30)
    per = figures["per_connection"]
    print(f"idle connections: {args.connections:,} (opened in {figures['open_seconds']:.1f} s)")
    print(
        f"gateway RSS {figures['before'] / 2**20:,.1f} MiB -> {figures['after'] / 2**20:,.1f} "
        f"MiB: {per / 1024:,.1f} KB per connection (aim <= {AIM_BYTES // 1024} KB: "
        f"{'met' if per <= AIM_BYTES else 'NOT met'})"
    )
    print(f"served with all open: {figures['served']:,.0f} of {args.connections:,}")
    return exit_status(child)


if __name__ == "__main__":
    sys.exit(main())
