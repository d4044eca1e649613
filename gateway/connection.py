"""The asyncio adapter: accept, read, dispatch, write, limits, shutdown.

Each connection is an asyncio Protocol. Every read is fed to the sans-IO parser and the
complete commands in it run at once, inside the transport's read callback: no task and
no future per read. All their replies go out in one write. A command that waits (BLPOP,
DUMP, KEYS) runs as a task of its own and suspends only its connection; meanwhile the
socket is still read, so a disconnect is noticed at once and releases the consumer
(commands pipelined behind it wait their turn in the parser, bounded by the query-buffer
limit). When the transport's write buffer is full (a client that does not read), the
connection stops reading and running commands until the buffer drains, so it stalls
only itself.
"""

from __future__ import annotations

import asyncio
import inspect
import signal
import types
from collections.abc import Awaitable
from typing import Any, TypeAlias, cast

import structlog

from backends.base import Engine, Stats
from backends.registry import engine_entry
from gateway import errors
from gateway.commands import dispatch
from gateway.config import Config
from gateway.context import ServerContext
from gateway.resp import (
    NULL_ARRAY,
    ErrorReply,
    ParserLimits,
    ProtocolError,
    Reply,
    SimpleString,
    encode,
    encode_into,
    make_parser,
)
from gateway.session import Session, peer_id

log = structlog.get_logger("rafka.gateway.server")

# How long a closed connection may take to send what is still buffered.
CLOSE_GRACE = 2.0
# After the shutdown bound, how long cancelled connections and the engine may take.
ABANDON_GRACE = 5.0

# Reply types that are never awaitable: checked before the (slow) inspect.isawaitable.
_IMMEDIATE: frozenset[type] = frozenset(
    {
        bytes,
        int,
        list,
        dict,
        str,
        SimpleString,
        ErrorReply,
        type(None),
        type(NULL_ARRAY),
        bool,
        float,
        tuple,
    }
)


# A command that waits, as _execute hands it to _run: a final class, so that the check
# `type(reply) is types.CoroutineType` tells mypy which of the two it is.
Waiting: TypeAlias = "types.CoroutineType[Any, Any, None]"

# _run's "no reply of a waiting command to write first" (None is a reply: RESP null).
_NO_REPLY: Any = object()


class Connection(asyncio.Protocol):
    """One client connection: the protocol callbacks, command execution and teardown."""

    def __init__(self, server: Server) -> None:
        self._server = server
        self._config = server.ctx.config
        self._loop = asyncio.get_running_loop()
        self._parser = make_parser(server.limits)
        self._transport: asyncio.Transport | None = None
        self.session: Session | None = None
        # Resolved once the connection is torn down and forgotten by the server.
        self.closed: asyncio.Future[None] = self._loop.create_future()
        # Resolved by connection_lost.
        self._lost: asyncio.Future[None] = self._loop.create_future()
        # The waiting command (BLPOP, DUMP, KEYS) in progress, if any.
        self._command: asyncio.Task[None] | None = None
        self._teardown_task: asyncio.Task[None] | None = None
        self._ended = False  # no command runs any more; teardown started
        self._closing = False  # close_soon(): close after the command in progress
        # Why reading is paused: the client does not read our replies (write buffer
        # full), or it sent more than the query-buffer limit behind a waiting command.
        self._write_paused = False
        self._buffer_full = False
        self._reading_paused = False
        self._buffered = 0  # bytes received since the waiting command started
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._idle_timeout = self._config.idle_timeout
        self._idle_handle: asyncio.TimerHandle | None = None
        self._last_activity = 0.0

    @property
    def waiting(self) -> bool:
        """True while a command that waits (BLPOP, DUMP, KEYS) is in progress."""
        return self._command is not None

    # --- protocol callbacks ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport = cast(asyncio.Transport, transport)
        server = self._server
        ctx = server.ctx
        if len(server.live) >= ctx.config.max_clients:
            self._ended = True
            transport.write(encode(ErrorReply(errors.max_clients_reached().text)))
            transport.close()
            return
        self.session = session = Session(ctx, peer_id(transport.get_extra_info("peername")))
        session.writer = self
        server.live.add(self)
        ctx.stats.incr(Stats.CONNECTIONS_TOTAL)
        ctx.stats.incr(Stats.CONNECTIONS_CURRENT)
        if self._idle_timeout:
            self._last_activity = self._loop.time()
            self._idle_handle = self._loop.call_later(self._idle_timeout, self._check_idle)

    def data_received(self, data: bytes) -> None:
        if self._ended:
            return
        self._parser.feed(data)
        if self._idle_timeout:
            self._last_activity = self._loop.time()
        if self._command is not None:
            # Read on while a command waits (to notice a disconnect), up to the limit.
            self._buffered += len(data)
            if self._buffered >= self._config.max_query_buffer:
                self._buffer_full = True
                self._update_reading()
            return
        if not self._write_paused:
            self._run()

    def eof_received(self) -> bool:
        # The client will send nothing more; everything it sent has been run (or waits
        # behind a command, which is then abandoned as for a disconnect).
        self._end()
        return True  # the teardown closes the transport once the session is released

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._lost.done():
            self._lost.set_result(None)
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_exception(ConnectionResetError("Connection lost"))
        self._drain_waiters.clear()
        self._end()

    def pause_writing(self) -> None:
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._drain_waiters.clear()
        if self._ended:
            return
        self._update_reading()
        if self._idle_timeout:
            self._last_activity = self._loop.time()
        if self._command is None:
            self._run()  # commands that arrived while the client was not reading

    def _update_reading(self) -> None:
        transport = self._transport
        if transport is None or self._ended:
            return
        pause = self._write_paused or self._buffer_full
        if pause and not self._reading_paused:
            self._reading_paused = True
            transport.pause_reading()
        elif not pause and self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()

    # --- the writer interface of MONITOR (gateway.monitor.Writer) ------------------------

    def write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    async def drain(self) -> None:
        if self._transport is None or self._transport.is_closing():
            raise ConnectionResetError("Connection lost")
        if self._write_paused:
            waiter = self._loop.create_future()
            self._drain_waiters.append(waiter)
            await waiter

    # --- running commands ----------------------------------------------------------------

    def _run(self, first: Reply = _NO_REPLY) -> None:
        """Run every complete command in the parser and write their replies at once.

        `first` is the reply of a waiting command that just finished (_NO_REPLY
        otherwise), written together with the replies of the commands pipelined behind it.
        """
        session = self.session
        transport = self._transport
        assert session is not None and transport is not None
        parser = self._parser
        out: list[bytes] = []
        if first is not _NO_REPLY:
            encode_into(first, session.protocol, out)
        try:
            while not session.quit:
                try:
                    command = parser.get_command()
                except ProtocolError as error:
                    # Answer what came before, then the error, then close (as Rafka).
                    encode_into(ErrorReply(error.text), session.protocol, out)
                    transport.write(b"".join(out))
                    self._end()
                    return
                if command is None:
                    break
                reply = self._execute(command)
                if type(reply) is types.CoroutineType:
                    # Answer what came before, then wait without blocking the others.
                    if out:
                        transport.write(b"".join(out))
                    self._start_waiting(reply)
                    return
                encode_into(reply, session.protocol, out)
            if out:
                transport.write(b"".join(out))
        except Exception:
            log.exception("connection failed", client=session.id)
            self._end()
            return
        if session.quit or self._closing:
            self._end()

    def _execute(self, command: list[bytes]) -> Reply | Waiting:
        """The command's reply, or a coroutine that answers it (a waiting command)."""
        session = self.session
        assert session is not None
        try:
            reply = dispatch(session, command)
        except errors.RespError as error:
            return ErrorReply(error.text)
        except Exception:
            log.exception("command failed", client=session.id, command=command[:1])
            return ErrorReply(errors.internal_error().text)
        if type(reply) in _IMMEDIATE or not inspect.isawaitable(reply):
            return cast(Reply, reply)
        # Reply values are never coroutines: this is what tells _run a command waits.
        return cast(Waiting, self._wait(reply, command))

    def _start_waiting(self, waiting: Waiting) -> None:
        self._buffered = 0
        self._command = self._loop.create_task(waiting)

    async def _wait(self, pending: Awaitable[Reply], command: list[bytes]) -> None:
        """The task of a waiting command: await its reply, answer, run what follows."""
        try:
            reply = await pending
        except errors.RespError as error:
            reply = ErrorReply(error.text)
        except Exception:
            assert self.session is not None
            log.exception("command failed", client=self.session.id, command=command[:1])
            reply = ErrorReply(errors.internal_error().text)
        except asyncio.CancelledError:
            # By the teardown (client gone) or a shutdown past its bound.
            self._command = None
            self._end()
            raise
        self._command = None
        if self._ended:
            return
        # Answered inside this task, not in a done callback: one loop iteration less.
        self._buffered = 0
        self._buffer_full = False
        self._update_reading()
        if self._idle_timeout:
            self._last_activity = self._loop.time()
        if self._write_paused:
            # Answer now; what is pipelined behind runs once the client reads again.
            assert self.session is not None and self._transport is not None
            out: list[bytes] = []
            encode_into(reply, self.session.protocol, out)
            self._transport.write(b"".join(out))
            if self.session.quit or self._closing:
                self._end()
            return
        self._run(reply)

    def _check_idle(self) -> None:
        """Close a connection silent for longer than idle_timeout (never a monitor, as in
        Redis; never while a command waits or the client is not reading our replies)."""
        self._idle_handle = None
        if self._ended or self.session is None:
            return
        now = self._loop.time()
        timeout = self._idle_timeout
        if self._command is not None or self._write_paused or self.session.monitoring:
            self._last_activity = now
        elif now - self._last_activity >= timeout:
            self._end()
            return
        self._idle_handle = self._loop.call_later(
            timeout - (now - self._last_activity), self._check_idle
        )

    # --- lifecycle -------------------------------------------------------------------

    def close_soon(self) -> None:
        """Close after the command in progress (if any) has answered."""
        if self._closing:
            return
        self._closing = True
        if self._command is None:
            self._end()

    def abandon(self) -> None:
        """Shutdown past its bound: stop waiting for anything and drop the socket."""
        self._end()
        if self.session is not None:
            # The teardown is cancelled below, possibly before session.close() ran.
            self.session.release_registrations()
        if self._teardown_task is not None:
            self._teardown_task.cancel()
        if self._command is not None:
            self._command.cancel()
        if self._transport is not None:
            self._transport.abort()

    def _end(self) -> None:
        """No more commands: release the session, then close the socket (once)."""
        if self._ended:
            return
        self._ended = True
        if self._idle_handle is not None:
            self._idle_handle.cancel()
            self._idle_handle = None
        self._teardown_task = self._loop.create_task(self._teardown())
        self._teardown_task.add_done_callback(self._finished)

    async def _teardown(self) -> None:
        transport = self._transport
        assert transport is not None and self.session is not None
        try:
            command = self._command
            if command is not None:
                log.debug("client left while waiting", client=self.session.id)
                command.cancel()
                await asyncio.gather(command, return_exceptions=True)
            await self.session.close()
        finally:
            transport.close()
            # A client that does not read would keep unsent replies (and us) forever.
            await asyncio.wait((self._lost,), timeout=CLOSE_GRACE)
            if not self._lost.done():
                transport.abort()

    def _finished(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("connection teardown failed", exc_info=task.exception())
        if self in self._server.live:
            self._server.live.discard(self)
            self._server.ctx.stats.incr(Stats.CONNECTIONS_CURRENT, -1)
        if not self.closed.done():
            self.closed.set_result(None)


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
        # Accepted connections not yet torn down (a rejected one is never in here).
        self.live: set[Connection] = set()
        self._shutdown_task: asyncio.Task[None] | None = None
        self.port = 0
        self.host = config.host

    @property
    def connections(self) -> int:
        return len(self.live)

    @property
    def waiting_commands(self) -> int:
        """Connections inside a waiting command (BLPOP, DUMP, KEYS) right now."""
        return sum(1 for connection in self.live if connection.waiting)

    async def start(self) -> None:
        config = self.ctx.config
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(
            lambda: Connection(self), config.host, config.port, reuse_address=True
        )
        self.port = self._listener.sockets[0].getsockname()[1]
        log.info("Listening", host=config.host, port=self.port)

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
        await self._close(consuming)
        # 5. Stop accepting.
        self._close_listener()
        # 6. Close everyone else; their producers flush.
        await self._close(list(self.live))
        # 7. Release the engine.
        await self.ctx.engine.stop()
        log.info("shutdown complete")

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


async def start_server(config: Config, *, engine: Engine | None = None) -> Server:
    """Start the engine (the one `config` names, unless given) and listen; the caller
    owns the Server and calls shutdown()."""
    stats = engine.stats if engine is not None else Stats()
    if engine is None:
        entry = engine_entry(config.engine)
        engine = entry.create(config.engine_settings, stats, config.engine_options())
    await engine.start()
    server = Server(ServerContext(config=config, engine=engine, stats=stats))
    try:
        await server.start()
    except BaseException:
        await engine.stop()
        raise
    return server
