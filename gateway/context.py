"""State shared by every connection of one server: config, engine, stats, client ids."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from backends.base import Engine, Stats
from gateway.config import Config
from gateway.monitor import MonitorHub

if TYPE_CHECKING:
    from gateway.session import Session


@dataclass
class ServerContext:
    config: Config
    engine: Engine
    stats: Stats
    monitors: MonitorHub = field(default_factory=MonitorHub)
    # Client id -> session, for SETNAME uniqueness. Ids of live connections only.
    clients: dict[str, Session] = field(default_factory=dict)
    # Resolved once, when shutdown begins: BLPOPs answer `CONS Server shutdown` from then
    # on. A future (not an Event) so that a waiting BLPOP needs no extra task.
    shutdown_started: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    _numbers: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def shutting_down(self) -> bool:
        return self.shutdown_started.done()

    def begin_shutdown(self) -> None:
        if not self.shutdown_started.done():
            self.shutdown_started.set_result(None)

    def next_number(self) -> int:
        """A unique integer per connection (CLIENT ID, HELLO's `id`)."""
        return next(self._numbers)
