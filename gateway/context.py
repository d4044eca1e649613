"""State shared by every connection of one server: config, engine, stats, client ids."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

from backends.base import Engine
from gateway.clients import ClientIds
from gateway.config import Config
from gateway.latency import CommandLatency
from gateway.monitor import MonitorHub
from gateway.push.manager import PushManager
from gateway.stats import ServerStats


@dataclass
class ServerContext:
    config: Config
    engine: Engine
    stats: ServerStats  # the engine's counters and the gateway's
    monitors: MonitorHub = field(default_factory=MonitorHub)
    # The HTTP push subscriptions (gateway.push); None when the server runs without.
    push: PushManager | None = None
    # The ids of live connections, for SETNAME uniqueness.
    clients: ClientIds = field(default_factory=ClientIds)
    # Per-command latency histograms: only with the metrics endpoint on (gateway.metrics).
    latency: CommandLatency | None = None
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
