"""Per-connection state and its cleanup.

A session's id is its peer address (`ip:port`, `[::1]:port`) until CLIENT SETNAME sets
`<group>:<name>...`; the id is unique among live connections. Closing a session releases
what it owns exactly once: id and monitor registration at once (so the id can be
reclaimed), then the consumer (closing commits acked offsets) and the producer (flushed
for up to `producer_close_timeout`; the engine counts what is left as unflushed).
"""

from __future__ import annotations

import asyncio

import structlog

from backends.base import Consumer, Producer
from gateway import errors
from gateway.context import ServerContext
from gateway.monitor import Monitor, Writer

log = structlog.get_logger("rafka.gateway.session")


def peer_id(peername: object) -> str:
    """Rafka's id for an unnamed client: Go's net.Addr String() form."""
    if isinstance(peername, tuple) and len(peername) >= 2:
        host, port = str(peername[0]), peername[1]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return str(peername)


class Session:
    def __init__(self, ctx: ServerContext, peer: str) -> None:
        self.ctx = ctx
        self.number = ctx.next_number()
        self.peer = peer
        self.id = peer
        self.name_set = False
        self.group = ""
        # librdkafka client.id: the segment between the first and second ':' of the name.
        self.client_name = ""
        self.protocol = 2
        self.authenticated = not ctx.config.auth_required
        self.producer: Producer | None = None
        self.consumer: Consumer | None = None
        self.consumer_topics: str | None = None  # the consumer's, joined by ","
        # The last BLPOP/BLMPOP key and what it parsed to (topics, JSON settings, topics
        # joined by ","): a consumer sends the same key every time, and a key naming
        # 1,000 topics cost more to split than the rest of the BLPOP.
        self.topics_key: bytes | None = None
        self.topics_parsed: tuple[tuple[str, ...], dict[str, object] | None, str] | None = None
        self.monitoring = False
        # Set by a command that waits for room in the engine's queue: the connection
        # reads nothing more until it has answered (backpressure).
        self.stop_reading = False
        # Set by QUIT: the server closes the connection once the reply is written.
        self.quit = False
        # The connection, as the writer of MONITOR output (set by the server).
        self.writer: Writer | None = None
        self._closed = False
        ctx.clients.add(self.id, self)

    @property
    def closed(self) -> bool:
        return self._closed

    def set_name(self, name: str) -> None:
        """CLIENT SETNAME, with Rafka's checks in Rafka's order (spec §2.1).

        Check and store happen without an await in between, so two connections cannot
        both take one id (Rafka's race).
        """
        if name in self.ctx.clients:
            raise errors.id_taken(name)
        if self.name_set:
            raise errors.id_already_set(self.id)
        if ":" not in name:
            raise errors.cannot_parse_group()
        self.ctx.clients.release(self.id, self)
        self.id = name
        self.name_set = True
        parts = name.split(":", 2)
        self.group = parts[0]
        self.client_name = parts[1]
        self.ctx.clients.add(name, self)

    def consumer_id_for(self, topics: str) -> str:
        """Rafka's id of this client's consumer of `topics` (joined by ",")."""
        return f"{self.id}|{topics}"

    @property
    def consumer_id(self) -> str | None:
        """The id of this client's consumer; None before it has one. (The client id is
        set for good before a consumer can exist.)"""
        topics = self.consumer_topics
        return None if topics is None else self.consumer_id_for(topics)

    def start_monitor(self, monitor: Monitor) -> None:
        self.monitoring = True
        self.ctx.monitors.add(self.number, monitor)

    def release_registrations(self) -> None:
        """Give up the id and the monitor registration at once, without awaiting: for a
        connection abandoned at the shutdown bound, whose close() may never run."""
        self.ctx.clients.release(self.id, self)
        if self.monitoring:
            self.ctx.monitors.discard(self.number)

    async def close(self) -> None:
        """Release everything this session owns; later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        self.ctx.clients.release(self.id, self)
        if self.monitoring:
            await self.ctx.monitors.remove(self.number)
        consumer, self.consumer = self.consumer, None
        producer, self.producer = self.producer, None
        await asyncio.gather(self._close_consumer(consumer), self._close_producer(producer))

    async def _close_consumer(self, consumer: Consumer | None) -> None:
        if consumer is None:
            return
        try:
            await consumer.close()
        except Exception:
            log.exception("error closing consumer", client=self.id, consumer=self.consumer_id)

    async def _close_producer(self, producer: Producer | None) -> None:
        if producer is None:
            return
        try:
            left = await producer.close(self.ctx.config.producer_close_timeout)
        except Exception:
            log.exception("error closing producer", client=self.id)
            return
        if left:
            log.warning("producer closed with unflushed messages", client=self.id, unflushed=left)
