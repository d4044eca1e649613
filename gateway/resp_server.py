"""The former home of the asyncio adapter, kept for gateway/cli.py alone.

The adapter now lives in gateway.flow, gateway.idle, gateway.connection and
gateway.server; start-up and signals in gateway.runner. cli.py belongs to another branch
while issue 13 lands: once it calls `gateway.runner.start_server(config)` and
`gateway.runner.serve_until_signal(server)`, delete this module.
"""

from __future__ import annotations

from gateway import runner
from gateway.config import Config
from gateway.server import Server


class _Started:
    """The started Server, with what cli.py reads of it and the method it calls."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.ctx = server.ctx
        self.host = server.host
        self.port = server.port

    async def serve_until_signal(self) -> None:
        await runner.serve_until_signal(self.server)


async def start_server(config: Config) -> _Started:
    return _Started(await runner.start_server(config))
