"""The asyncio adapter: accept, read, dispatch, write, limits, shutdown.

One task per connection. Each read is fed to the sans-IO parser; every complete command
in it runs in order and all their replies go out in one write, then the writer is
drained (so a client that does not read stalls only itself). A command that waits (BLPOP,
DUMP, KEYS) suspends only its connection; while it waits the socket is still read, so a
disconnect is noticed at once and releases the consumer (commands pipelined behind it
wait their turn in the parser, bounded by the query-buffer limit).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import signal
from collections.abc import Awaitable
from typing import Any

import structlog

from backends.base import Engine, Stats
from gateway import errors
from gateway.commands import dispatch
from gateway.commands.base import Reply
from gateway.config import Config
from gateway.context import ServerContext
from gateway.resp import ErrorReply, ParserLimits, ProtocolError, encode_many, make_parser
from gateway.session import Session, peer_id

log = structlog.get_logger("rafka.gateway.server")

READ_SIZE = 64 * 1024
# How long a closed connection may take to send what is still buffered.
CLOSE_GRACE = 2.0
# After the shutdown bound, how long cancelled connections and the engine may take.
ABANDON_GRACE = 5.0


def error_reply(text: str) -> ErrorReply:
    return ErrorReply(text)


def _line(text: str) -> bytes:
    # An error line cannot hold CR or LF (they would end it early); Redis does the same.
    return text.replace("\r", " ").replace("\n", " ").encode("utf-8", "replace")


class _Output:
    """Replies of one read, encoded in the protocol that was current for each (HELLO can
    switch it in the middle of a pipeline)."""

    def __init__(self, protocol: int) -> None:
        self._protocol = protocol
        self._pending: list[Reply] = []
        self._chunks: list[bytes] = []

    def add(self, reply: Reply, protocol: int) -> None:
        if protocol != self._protocol:
            self._encode()
            self._protocol = protocol
        self._pending.append(reply)

    def _encode(self) -> None:
        if self._pending:
            self._chunks.append(encode_many(self._pending, self._protocol))
            self._pending = []

    def take(self) -> bytes:
        self._encode()
        data = b"".join(self._chunks)
        self._chunks = []
        return data


class Connection:
    def __init__(
        self,
        server: Server,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        session: Session,
    ) -> None:
        self._config = server.ctx.config
        self._reader = reader
        self._writer = writer
        self.session = session
        self._parser = make_parser(server.limits)
        self.task: asyncio.Task[Any] | None = None
        # A read started while a command waited, not consumed yet.
        self._read_task: asyncio.Future[bytes] | None = None
        self._idle = False
        self._closing = False
        # True while a command that waits (BLPOP, DUMP, KEYS) is in progress.
        self.waiting = False

    # --- lifecycle -------------------------------------------------------------------

    def close_soon(self) -> None:
        """Close after the command in progress (if any) has answered."""
        if self._closing:
            return
        self._closing = True
        if self._idle and self.task is not None:
            self.task.cancel()

    async def run(self) -> None:
        try:
            await self._serve()
        except asyncio.CancelledError:
            if not self._closing:
                raise
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
        except (ConnectionError, TimeoutError):
            pass  # the client went away or was idle too long: nothing to answer
        except Exception:
            log.exception("connection failed", client=self.session.id)
        finally:
            await self._teardown()

    async def _teardown(self) -> None:
        if self._read_task is not None:
            self._read_task.cancel()
        try:
            await self.session.close()
        finally:
            self._writer.close()
            try:
                # A client that does not read would keep unsent replies (and us) forever.
                await asyncio.wait_for(self._writer.wait_closed(), CLOSE_GRACE)
            except TimeoutError:
                self._writer.transport.abort()
            except (ConnectionError, OSError):
                pass

    # --- reading ---------------------------------------------------------------------

    async def _read(self) -> bytes:
        """The next bytes from the client (b"" at end of stream); TimeoutError when idle
        for longer than idle_timeout (never for monitors, as in Redis)."""
        idle = self._config.idle_timeout
        if self.session.monitoring:
            idle = 0
        self._idle = True
        try:
            pending, self._read_task = self._read_task, None
            read = pending if pending is not None else self._reader.read(READ_SIZE)
            if idle:
                return await asyncio.wait_for(read, idle)
            return await read
        finally:
            self._idle = False

    # --- serving ---------------------------------------------------------------------

    async def _serve(self) -> None:
        while not self._closing:
            data = await self._read()
            if not data:
                return
            self._parser.feed(data)
            if not await self._run_commands():
                return

    async def _run_commands(self) -> bool:
        """Run every complete command; False when the connection must close."""
        session = self.session
        out = _Output(session.protocol)
        while True:
            try:
                command = self._parser.get_command()
            except ProtocolError as error:
                # Answer what came before, then the error, then close (as Rafka).
                await self._write(out.take() + b"-" + _line(error.text) + b"\r\n")
                return False
            if command is None:
                break
            reply = self._execute(command)
            if inspect.isawaitable(reply):
                # Answer what came before, then wait without blocking other connections.
                await self._write(out.take())
                reply = await self._wait_for(reply)
                if reply is _LOST:
                    return False
            out.add(reply, session.protocol)
            if session.quit:
                break
        await self._write(out.take())
        return not session.quit

    def _execute(self, command: list[bytes]) -> Reply:
        try:
            reply = dispatch(self.session, command)
        except errors.RespError as error:
            return error_reply(error.text)
        except Exception:
            log.exception("command failed", client=self.session.id, command=command[:1])
            return error_reply(errors.internal_error().text)
        if inspect.isawaitable(reply):
            return self._guard(reply, command)
        return reply

    async def _guard(self, pending: Awaitable[Reply], command: list[bytes]) -> Reply:
        try:
            return await pending
        except errors.RespError as error:
            return error_reply(error.text)
        except Exception:
            log.exception("command failed", client=self.session.id, command=command[:1])
            return error_reply(errors.internal_error().text)

    async def _wait_for(self, pending: Awaitable[Reply]) -> Reply:
        """Await a waiting command while still reading the socket."""
        command = asyncio.ensure_future(pending)
        self.waiting = True
        # Bytes read meanwhile wait in the parser; past the query-buffer limit we stop
        # reading (TCP back-pressure) until the command has answered.
        buffered = 0
        limit = self._config.max_query_buffer
        try:
            while True:
                if self._read_task is None and buffered < limit:
                    self._read_task = asyncio.ensure_future(self._reader.read(READ_SIZE))
                waiters: set[asyncio.Future[Any]] = {command}
                if self._read_task is not None:
                    waiters.add(self._read_task)
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                if command.done():
                    return command.result()
                read, self._read_task = self._read_task, None
                assert read is not None
                try:
                    data = read.result()
                except (ConnectionError, OSError):
                    data = b""
                if not data:
                    log.debug("client left while waiting", client=self.session.id)
                    command.cancel()
                    await asyncio.gather(command, return_exceptions=True)
                    return _LOST
                buffered += len(data)
                self._parser.feed(data)
        except asyncio.CancelledError:
            command.cancel()
            raise
        finally:
            self.waiting = False

    async def _write(self, data: bytes) -> None:
        if data:
            self._writer.write(data)
            await self._writer.drain()


_LOST: Any = object()  # _wait_for's answer when the client disconnected meanwhile


class Server:
    """A listening gateway. Create with `start_server`."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        config = ctx.config
        self.limits = ParserLimits(
            max_arguments=config.max_arguments,
            max_bulk_length=config.max_bulk_length,
            max_inline_length=config.max_inline_length,
            max_query_buffer=config.max_query_buffer,
        )
        self._listener: asyncio.Server | None = None
        self._connections: set[Connection] = set()
        self._shutdown_task: asyncio.Task[None] | None = None
        self.port = 0
        self.host = config.host

    @property
    def connections(self) -> int:
        return len(self._connections)

    @property
    def waiting_commands(self) -> int:
        """Connections inside a waiting command (BLPOP, DUMP, KEYS) right now."""
        return sum(1 for connection in self._connections if connection.waiting)

    async def start(self) -> None:
        config = self.ctx.config
        self._listener = await asyncio.start_server(
            self._accept, config.host, config.port, reuse_address=True
        )
        self.port = self._listener.sockets[0].getsockname()[1]
        log.info("Listening", host=config.host, port=self.port)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ctx = self.ctx
        if len(self._connections) >= ctx.config.max_clients:
            writer.write(b"-" + _line(errors.max_clients_reached().text) + b"\r\n")
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            writer.close()
            return
        session = Session(ctx, peer_id(writer.get_extra_info("peername")))
        session.writer = writer
        connection = Connection(self, reader, writer, session)
        connection.task = asyncio.current_task()
        self._connections.add(connection)
        ctx.stats.incr(Stats.CONNECTIONS_TOTAL)
        ctx.stats.incr(Stats.CONNECTIONS_CURRENT)
        try:
            await connection.run()
        finally:
            self._connections.discard(connection)
            ctx.stats.incr(Stats.CONNECTIONS_CURRENT, -1)

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
            left = [c.session.id for c in self._connections]
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
        consuming = [c for c in self._connections if c.session.consumer is not None]
        await self._close(consuming)
        # 5. Stop accepting.
        self._close_listener()
        # 6. Close everyone else; their producers flush.
        await self._close(list(self._connections))
        # 7. Release the engine.
        await self.ctx.engine.stop()
        log.info("shutdown complete")

    async def _close(self, connections: list[Connection]) -> None:
        tasks = [c.task for c in connections if c.task is not None]
        for connection in connections:
            connection.close_soon()
        if tasks:
            await asyncio.wait(tasks)

    async def _abandon(self) -> None:
        tasks = [c.task for c in self._connections if c.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=ABANDON_GRACE)
        try:
            async with asyncio.timeout(ABANDON_GRACE):
                await self.ctx.engine.stop()
        except TimeoutError:
            log.error("engine did not stop in time, abandoned")

    def _close_listener(self) -> None:
        if self._listener is not None:
            self._listener.close()

    async def serve_until_signal(self) -> None:
        """Serve until SIGTERM or SIGINT, then shut down (a second signal is only logged)."""
        loop = asyncio.get_running_loop()
        stop = loop.create_future()

        def on_signal(signum: int) -> None:
            if stop.done():
                log.info("shutdown already in progress", signal=signal.Signals(signum).name)
            else:
                stop.set_result(None)

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal, signum)
        try:
            await stop
            await self.shutdown()
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)


def create_engine(config: Config, stats: Stats) -> Engine:
    if config.engine == "kafka":
        from backends.kafka.engine import KafkaEngine

        return KafkaEngine(
            stats,
            config.consumer,
            config.producer,
            metadata_timeout=config.metadata_timeout,
        )
    raise ValueError(f"unknown engine {config.engine!r}")


async def start_server(config: Config, *, engine: Engine | None = None) -> Server:
    """Start the engine and listen; the caller owns the Server and calls shutdown()."""
    stats = engine.stats if engine is not None else Stats()
    if engine is None:
        engine = create_engine(config, stats)
    await engine.start()
    server = Server(ServerContext(config=config, engine=engine, stats=stats))
    try:
        await server.start()
    except BaseException:
        await engine.stop()
        raise
    return server
