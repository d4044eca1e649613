"""Commands as RESP multibulk bytes, for the clients that write to the gateway without a
client library (raw-socket tests, the benches' pre-encoded clients, the soak)."""

from __future__ import annotations

import hiredis


def command(*args: bytes | str | int) -> bytes:
    """`*N\\r\\n$len\\r\\narg\\r\\n...`: hiredis's encoder (its type stub declares the
    argument a one-element tuple, hence the ignore)."""
    return hiredis.pack_command(args)  # type: ignore[arg-type]
