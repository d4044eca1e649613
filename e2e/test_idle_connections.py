"""1,000 idle connections to a real `rafka` process (embedded Dafka): every one is
served while all are open, and each costs the gateway far less than issue 11's bound of
50 KB of resident memory. `make bench-idle` measures the same with 10,000.

The gateway starts under a soft open-files limit of 256 (`prlimit`): it must raise its
own limit for `max_clients` (gateway.limits), or most of the connections are never
accepted."""

from __future__ import annotations

import resource
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.process import Child
from tests.support.connections import (
    close_all,
    open_connections,
    ping_all,
    raise_open_files,
    rss_bytes,
)
from tests.support.rafka_process import start_rafka

CONNECTIONS = 1_000
BOUND = 50 * 1024  # bytes of gateway RSS per idle connection (issue 11)


@pytest.fixture
def rafka(tmp_path: Path) -> Iterator[tuple[Child, int]]:
    if raise_open_files(CONNECTIONS + 200) < CONNECTIONS + 200:
        pytest.fail(f"the open-files hard limit (ulimit -Hn) is below {CONNECTIONS + 200}")
    gateway = {"max_clients": CONNECTIONS + 10}
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    low = ["prlimit", f"--nofile=256:{'unlimited' if hard == resource.RLIM_INFINITY else hard}"]
    child, port = start_rafka(
        tmp_path, {"gateway": gateway}, "--engine", "dafka", wrapper=[*low, "--"]
    )
    yield child, port
    assert child.stop(30) == 0, child.stderr_lines[-5:]


def test_a_thousand_idle_connections_are_all_served_and_cost_little(
    rafka: tuple[Child, int],
) -> None:
    child, port = rafka
    limits = Path(f"/proc/{child.pid}/limits").read_text()
    soft = int(next(ln for ln in limits.splitlines() if ln.startswith("Max open files")).split()[3])
    assert soft >= CONNECTIONS + 10, f"the gateway kept an open-files limit of {soft}"
    first = open_connections(port, 1, 1, timeout=10)  # what the first client costs once
    before = rss_bytes(child.pid)
    sockets = open_connections(port, CONNECTIONS, 100, timeout=10)
    try:
        served = sum(ping_all(sockets[i : i + 100]) for i in range(0, CONNECTIONS, 100))
        grown = rss_bytes(child.pid) - before
    finally:
        close_all([*sockets, *first])
    assert served == CONNECTIONS, f"only {served} of {CONNECTIONS} open connections answered"
    per_connection = grown / CONNECTIONS
    assert per_connection <= BOUND, (
        f"each idle connection costs the gateway {per_connection / 1024:.1f} KB "
        f"(RSS +{grown / 2**20:.1f} MiB for {CONNECTIONS}), bound {BOUND // 1024} KB"
    )
