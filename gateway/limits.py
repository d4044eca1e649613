"""The process's open-files limit, sized for `max_clients` at start (as Redis does).

Every client connection holds a file descriptor, so a gateway under a soft RLIMIT_NOFILE
of 1024 (a common default) could not accept its 10,000 allowed clients: accept() would
fail with EMFILE instead of the client getting `-ERR max number of clients reached`. At
start the soft limit is raised to `max_clients` plus what the gateway itself uses
(listeners, the engine's sockets and pipes), up to the hard limit (`ulimit -Hn`); when
the hard limit is lower, a warning says so and the limit stays at the hard limit.
"""

from __future__ import annotations

import resource

import structlog

log = structlog.get_logger("rafka.gateway")

# File descriptors the gateway uses besides its clients (Redis reserves 32; the engines'
# sockets, pipes and child processes take more here).
RESERVED_FILES = 128


def size_open_files(max_clients: int) -> int:
    """Raise the soft RLIMIT_NOFILE for `max_clients` clients (never lower it); the soft
    limit now in force."""
    needed = max_clients + RESERVED_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return soft
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    if soft < needed:
        log.warning(
            "open files limit too low for max_clients: raise the hard limit (ulimit -Hn)",
            max_clients=max_clients,
            needed=needed,
            limit=soft,
        )
    return soft
