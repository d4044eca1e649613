"""The event loop the gateway runs on (`gateway.event_loop`): asyncio's own, or uvloop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes a new event loop of kind `name` (config.EVENT_LOOPS)."""
    if name == "uvloop":
        import uvloop  # imported only when chosen

        return uvloop.new_event_loop
    return asyncio.new_event_loop
