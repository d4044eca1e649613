"""The listening gateway: accept connections, track them, shut them down in order.

Start-up (making the engine) and signals are the runner's (gateway.runner); each
connection runs its own commands (gateway.connection).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import TYPE_CHECKING

import structlog

from gateway.connection import Connection
from gateway.context import ServerContext
from gateway.resp import ParserLimits

if TYPE_CHECKING:
    from gateway.metrics import MetricsEndpoint

log = structlog.get_logger("rafka.gateway.server")

# After the shutdown bound, how long cancelled connections and the engine may take.
ABANDON_GRACE = 5.0


class Server:
    """A listening gateway. Create with `gateway.runner.start_server`."""

    def __init__(self, ctx: ServerContext, tls: ssl.SSLContext | None = None) -> None:
        self.ctx = ctx
        self._tls = tls
        config = ctx.config
        self.limits = ParserLimits(
            max_arguments=config.max_arguments,
            max_bulk_length=config.max_bulk_length,
            max_inline_length=config.max_inline_length,
            max_query_buffer=config.max_query_buffer,
        )
        # The plaintext and the TLS listeners (either may be off).
        self._listeners: list[asyncio.Server] = []
        # Accepted connections not yet torn down, TLS ones from before their handshake
        # (a refused one is never in here).
        self.live: set[Connection] = set()
        self._shutdown_task: asyncio.Task[None] | None = None
        # The ports listened on, once started; None when that listener is off.
        self.port: int | None = None
        self.tls_port: int | None = None
        self.host = config.host
        # The Prometheus endpoint, when on (set by gateway.runner.start_server).
        self.metrics: MetricsEndpoint | None = None

    @property
    def connections(self) -> int:
        """Connections with a session: a TLS one once its handshake is done (`live`, which
        max_clients bounds, holds it from the accept)."""
        return sum(1 for connection in self.live if connection.session is not None)

    @property
    def waiting_commands(self) -> int:
        """Connections inside a waiting command (BLPOP, DUMP, KEYS) right now."""
        return sum(1 for connection in self.live if connection.waiting)

    async def start(self) -> None:
        config = self.ctx.config
        if (config.tls_port is None) != (self._tls is None):
            raise ValueError("a TLS port needs its SSLContext (gateway.tls.server_context)")
        try:
            if config.port is not None:
                self.port = await self._listen(config.port, None)
            if config.tls_port is not None:
                self.tls_port = await self._listen(config.tls_port, self._tls)
        except BaseException:
            self._close_listener()
            raise
        log.info("Listening", host=config.host, port=self.port, tls_port=self.tls_port)

    async def _listen(self, port: int, tls: ssl.SSLContext | None) -> int:
        # No `ssl=` here: the loop would run the handshake before the connection exists,
        # uncounted by max_clients and out of reach of a shutdown. The connection runs it
        # (gateway.connection.Connection._start_tls).
        listener = await asyncio.get_running_loop().create_server(
            lambda: Connection(self, tls),
            self.ctx.config.host,
            port,
            reuse_address=True,
        )
        self._listeners.append(listener)
        port_: int = listener.sockets[0].getsockname()[1]
        return port_

    # --- the connections (gateway.connection.Host) -----------------------------------

    def admit(self, connection: Connection) -> bool:
        if len(self.live) >= self.ctx.config.max_clients:
            return False
        self.live.add(connection)
        self.ctx.stats.connected()
        return True

    def forget(self, connection: Connection) -> None:
        if connection in self.live:
            self.live.discard(connection)
            self.ctx.stats.disconnected()

    # --- shutdown (spec §7, with the documented intent) ------------------------------

    async def shutdown(self) -> None:
        """Run the shutdown sequence once; later calls wait for the same run."""
        if self._shutdown_task is None:
            self._shutdown_task = asyncio.get_running_loop().create_task(self._shutdown())
        await asyncio.shield(self._shutdown_task)

    async def _shutdown(self) -> None:
        log.info("Shutting down...")
        bound = self.ctx.config.shutdown_timeout
        try:
            async with asyncio.timeout(bound):
                await self._drain()
        except TimeoutError:
            left = [c.session.id for c in self.live if c.session is not None]
            log.error("shutdown bound reached, abandoning", seconds=bound, connections=left)
            await self._abandon()
        finally:
            self._close_listener()

    async def _drain(self) -> None:
        # 1-2. No consumer can be created from now on; waiting BLPOPs answer
        #      `CONS Server shutdown`.
        self.ctx.begin_shutdown()
        # 3-4. Close the connections that own a consumer (consumer close commits, and
        #      their producers flush), and wait for them. New connections are still
        #      accepted and served meanwhile (BLPOP refused, RPUSHX allowed).
        consuming = [c for c in self.live if c.session and c.session.consumer is not None]
        await asyncio.gather(self._close(consuming), self._stop_push())
        # 5. Stop accepting.
        self._close_listener()
        # 6. Close everyone else; their producers flush.
        await self._close(list(self.live))
        # 7. Release the engine.
        await self._stop_metrics()
        await self.ctx.engine.stop()
        log.info("shutdown complete")

    async def _stop_push(self) -> None:
        """Stop the push subscriptions: records being delivered are not acked (they are
        delivered again after a restart); each subscription's consumer commits."""
        if self.ctx.push is not None:
            await self.ctx.push.stop()

    async def _close(self, connections: list[Connection]) -> None:
        for connection in connections:
            connection.close_soon()
        if connections:
            await asyncio.wait([c.closed for c in connections])

    async def _abandon(self) -> None:
        connections = list(self.live)
        for connection in connections:
            connection.abandon()
        if connections:
            await asyncio.wait([c.closed for c in connections], timeout=ABANDON_GRACE)
        await self._stop_metrics()  # bounded of its own: the engine gets its full grace
        try:
            async with asyncio.timeout(ABANDON_GRACE):
                await self._stop_push()
        except TimeoutError:
            log.error("push subscriptions did not stop in time, abandoned")
        try:
            async with asyncio.timeout(ABANDON_GRACE):
                await self.ctx.engine.stop()
        except TimeoutError:
            log.error("engine did not stop in time, abandoned")

    async def _stop_metrics(self) -> None:
        """Before the engine: the metrics read consumer lag from the engine's deployment."""
        metrics, self.metrics = self.metrics, None
        if metrics is not None:
            await metrics.stop()

    def _close_listener(self) -> None:
        for listener in self._listeners:
            listener.close()
