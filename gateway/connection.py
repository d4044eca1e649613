"""One client connection: the asyncio Protocol that runs its commands, and its teardown.

Every read is fed to the sans-IO parser and the complete commands in it run at once,
inside the transport's read callback: no task and no future per read. All their replies
go out in one write; past WRITE_BATCH bytes of them, the rest of the read runs in a later
turn of the loop, and the client is not read until it has. A command that waits (BLPOP,
DUMP, KEYS) runs as a task of its own and suspends only its connection; meanwhile the
socket is still read, so a disconnect is noticed at once and releases the consumer
(commands pipelined behind it wait their turn in the parser, bounded by the query-buffer
limit; see gateway.flow). While the client does not read our replies, the connection
runs no commands.

On the TLS port the handshake runs inside the connection (`loop.start_tls`), after the
accept: a connection is counted against max_clients and closed by a shutdown from its
accept on, as on the plaintext port, however long its handshake takes.
"""

from __future__ import annotations

import asyncio
import inspect
import ssl
import types
from collections.abc import Awaitable
from time import perf_counter
from typing import Any, Protocol, TypeAlias, cast

import structlog

from gateway import errors
from gateway.commands import dispatch
from gateway.commands.produce import rpushx_run
from gateway.context import ServerContext
from gateway.flow import FlowControl
from gateway.idle import IdleTimer, PartialCommandTimer
from gateway.resp import (
    NULL_ARRAY,
    Encoded,
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
from gateway.tls import HANDSHAKE_TIMEOUT

log = structlog.get_logger("rafka.gateway.server")

# How long a closed connection may take to send what is still buffered.
CLOSE_GRACE = 2.0

# Replies are written once this many bytes of them are ready, and running the commands of
# one read stops there: it goes on in a later loop iteration (so that other connections
# are served in between), or once the client reads if it does not. However many commands
# one read holds, a client that does not read makes us hold at most this much more than
# the transport's high-water mark (plus one reply).
WRITE_BATCH = 256 * 1024

# Bytes a client that has not authenticated may have sent and not yet had parsed into
# commands (one unfinished request, or a backlog): past it, it is refused and closed, so
# that a client without credentials cannot make us hold max_query_buffer (Redis refuses
# a bulk over 16 KiB or more than 10 arguments before AUTH). AUTH and HELLO are small.
UNAUTHENTICATED_BUFFER = 1024 * 1024

# Reply types that are never awaitable: checked before the (slow) inspect.isawaitable.
_IMMEDIATE: frozenset[type] = frozenset(
    {
        bytes,
        int,
        list,
        dict,
        str,
        SimpleString,
        Encoded,
        ErrorReply,
        type(None),
        type(NULL_ARRAY),
        bool,
        float,
        tuple,
    }
)

# The spellings of RPUSHX run together with the RPUSHX to the same key behind them.
_RPUSHX: frozenset[bytes] = frozenset({b"RPUSHX", b"rpushx"})

# A command that waits, as _execute hands it to _run: a final class, so that the check
# `type(reply) is types.CoroutineType` tells mypy which of the two it is.
Waiting: TypeAlias = "types.CoroutineType[Any, Any, None]"

# _run's "no reply of a waiting command to write first" (None is a reply: RESP null).
_NO_REPLY: Any = object()


class Host(Protocol):
    """What a connection needs of the server that accepted it (gateway.server.Server)."""

    @property
    def ctx(self) -> ServerContext: ...

    @property
    def limits(self) -> ParserLimits: ...

    def admit(self, connection: Connection) -> bool:
        """Count the connection in; False when it must be refused (max clients)."""
        ...

    def forget(self, connection: Connection) -> None:
        """The connection is torn down: count it out (once, and only if admitted)."""
        ...


class Connection(asyncio.Protocol):
    """One client connection: the protocol callbacks, command execution and teardown."""

    def __init__(self, host: Host, tls: ssl.SSLContext | None = None) -> None:
        """`tls`: the TLS listener's context (the handshake runs after the accept)."""
        self._host = host
        self._config = host.ctx.config
        self._loop = asyncio.get_running_loop()
        self._parser = make_parser(host.limits)
        self._transport: asyncio.Transport | None = None
        self._flow: FlowControl  # from connection_made on
        self._tls = tls
        # The TLS handshake in progress (a task of its own), if any.
        self._handshake: asyncio.Task[None] | None = None
        # On the TLS port, bytes read before start_tls took the socket over (_early_data).
        self._early: bytearray | None = None
        # The client's address, read at the accept: uvloop cannot tell it once the
        # socket is closed (get_extra_info("peername") raises AttributeError).
        self._peer = ""
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
        self._idle = IdleTimer(self._loop, self._config.idle_timeout, self._busy, self._end)
        self._partial = PartialCommandTimer(
            self._loop, self._config.partial_command_timeout, self._parse_held, self._too_slow
        )
        # Per-command latency (gateway.latency), only with the metrics endpoint on.
        self._latency = host.ctx.latency
        self._waiting_since = 0.0  # perf_counter() when the waiting command started

    @property
    def waiting(self) -> bool:
        """True while a command that waits (BLPOP, DUMP, KEYS) is in progress."""
        return self._command is not None

    @property
    def unsent(self) -> int:
        """Bytes of replies written but not yet taken by the client's socket."""
        transport = self._transport
        return (
            0 if transport is None or transport.is_closing() else transport.get_write_buffer_size()
        )

    @property
    def unparsed(self) -> int:
        """Bytes the parser holds not parsed into commands yet (gateway.resp's
        `RequestParser.buffered`)."""
        return self._parser.buffered

    @property
    def parsed(self) -> int:
        """Commands parsed and not yet run: at most about one read's worth."""
        return self._parser.parsed

    @property
    def reading_paused(self) -> bool:
        """True while we do not read this client (it does not read our replies, it
        sent more than the query-buffer limit behind a waiting command, or commands it
        sent wait for a later turn: gateway.flow)."""
        return self._flow.reading_paused

    # --- protocol callbacks ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport = cast(asyncio.Transport, transport)
        self._peer = peer_id(transport.get_extra_info("peername"))
        self._flow = FlowControl(transport, self._loop, self._config.max_query_buffer)
        # Counted (and in the server's `live`, so that a shutdown closes it) from the
        # accept on, TLS handshake included: a client that never finishes its handshake
        # holds a socket as much as an idle one.
        if not self._host.admit(self):
            self._ended = True
            self._flow.stop()
            self._idle.close()
            self._partial.close()
            if self._tls is None:  # over TLS, no handshake yet: no way to tell it why
                transport.write(encode(ErrorReply(errors.max_clients_reached().text)))
            transport.close()
            return
        if self._tls is None:
            self._open()
            return
        # start_tls takes the socket over in the task's first step; until then nothing
        # should be read (asyncio's loop honours this; uvloop starts reading right after
        # connection_made whatever we say: see _early_data).
        transport.pause_reading()
        self._early = bytearray()
        self._handshake = self._loop.create_task(self._start_tls(transport, self._tls))

    async def _start_tls(self, raw: asyncio.Transport, context: ssl.SSLContext) -> None:
        """The TLS handshake, bounded by HANDSHAKE_TIMEOUT; then the session opens. On
        failure the connection ends (the teardown closes the raw socket); `_end` cancels
        this task when the connection ends first (shutdown, client gone)."""
        early, self._early = self._early, None
        if early:
            # Scheduled before start_tls schedules its TLS protocol's connection_made,
            # so that these bytes are handed to that protocol first.
            self._loop.call_soon(self._replay, raw, bytes(early))
        try:
            transport = await self._loop.start_tls(
                raw, self, context, server_side=True, ssl_handshake_timeout=HANDSHAKE_TIMEOUT
            )
            if transport is None:  # asyncio's, when the socket was lost before it began
                raise ConnectionResetError("connection lost before the TLS handshake")
        except Exception as error:  # SSLError, ConnectionError (timeout, reset), ...
            self._handshake = None
            self._end()
            log.debug("TLS handshake failed", peer=self._peer, error=repr(error))
            return
        if self.session is None:  # else opened by its first bytes (_early_data)
            self._adopt(transport)

    def _adopt(self, transport: asyncio.Transport) -> None:
        """The handshake is done: the session opens on the TLS transport."""
        self._handshake = None
        self._transport = transport
        self._flow = FlowControl(transport, self._loop, self._config.max_query_buffer)
        self._open()

    def _early_data(self, data: bytes) -> None:
        """Bytes received before the session opens, on the TLS port."""
        if self._early is not None:
            # The start of the handshake, read before start_tls took the socket over:
            # kept for its TLS protocol (_replay), and nothing more is read until then.
            self._early += data
            assert self._transport is not None
            self._transport.pause_reading()
        else:
            # The handshake is done and these are the first bytes behind it, handed to us
            # before start_tls returns (asyncio's loop does so in the callback that ends
            # the handshake, and a close_notify read with them ends the connection in
            # that same callback): open the session now, on the TLS transport start_tls
            # is about to return, and run them as any read.
            assert self._transport is not None
            tls = self._transport.get_protocol()  # the loop's SSLProtocol
            self._adopt(tls._get_app_transport())  # type: ignore[attr-defined]
            self.data_received(data)

    def _replay(self, raw: asyncio.Transport, data: bytes) -> None:
        """Hand `data` to the TLS protocol start_tls set on `raw` (a BufferedProtocol on
        both loops) as if just read; before its connection_made (they wait in its input
        buffer) and before it reads the socket, so in order."""
        protocol = raw.get_protocol()
        if protocol is self or raw.is_closing():
            return  # start_tls failed or was cancelled
        tls = cast(asyncio.BufferedProtocol, protocol)
        view = memoryview(data)
        while view:
            buffer = memoryview(tls.get_buffer(len(view)))
            size = min(len(buffer), len(view))
            buffer[:size] = view[:size]
            tls.buffer_updated(size)
            view = view[size:]

    def _open(self) -> None:
        """The connection is ready for commands (after the TLS handshake, on that port)."""
        self.session = session = Session(self._host.ctx, self._peer)
        session.writer = self
        self._idle.start()

    def data_received(self, data: bytes) -> None:
        if self._ended:
            return
        session = self.session
        if session is None:
            self._early_data(data)
            return
        self._parser.feed(data)
        self._idle.touch()
        if self._command is not None:
            # Read on while a command waits (to notice a disconnect), up to the limit.
            self._flow.received_while_waiting(len(data))
        elif not self._flow.write_paused:
            self._run()
        if (
            not self._ended
            and not session.authenticated
            and self._parser.buffered > UNAUTHENTICATED_BUFFER
        ):
            self._refuse_unauthenticated()

    def _refuse_unauthenticated(self) -> None:
        assert self.session is not None and self._transport is not None
        log.info(
            "closing an unauthenticated connection that sent too much",
            client=self.session.id,
            buffered=self._parser.buffered,
        )
        error = errors.unauthenticated_request_too_large(UNAUTHENTICATED_BUFFER)
        self._transport.write(encode(ErrorReply(error.text), self.session.protocol))
        self._end()

    def eof_received(self) -> bool:
        # The client will send nothing more; everything it sent has been run (or waits
        # behind a command, which is then abandoned as for a disconnect).
        self._end()
        # The teardown closes the transport once the session is released; a TLS
        # transport closes itself after EOF whatever we answer (and warns on True).
        return self._tls is None

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._lost.done():
            self._lost.set_result(None)
        self._flow.connection_lost()
        self._end()

    def pause_writing(self) -> None:
        self._flow.pause_writing()

    def resume_writing(self) -> None:
        self._flow.resume_writing()
        if self._ended:
            return
        self._idle.touch()
        if self._command is None:
            self._run()  # commands that arrived while the client was not reading

    # --- the writer interface of MONITOR (gateway.monitor.Writer) ------------------------

    def write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    async def drain(self) -> None:
        await self._flow.drain()

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
        latency = self._latency
        # A command's latency runs from the end of the one before it in this read (its
        # parsing included): one clock read per command (gateway.latency).
        started = perf_counter() if latency is not None else 0.0
        out: list[bytes] = []
        counted = size = 0  # bytes of out[:counted]
        completed = False
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
                    if parser.more:  # a step gave no command: the next in a later turn
                        self._run_rest_later()
                    else:
                        self._flow.caught_up()
                    break
                completed = True
                if len(command) > 2 and command[0] in _RPUSHX and latency is None:
                    reply = self._run_rpushx(command, out)
                else:
                    reply = self._execute(command)
                if type(reply) is types.CoroutineType:
                    # Answer what came before, then wait without blocking the others.
                    if out:
                        transport.write(b"".join(out))
                    self._waiting_since = started
                    self._start_waiting(reply)
                    return
                encode_into(reply, session.protocol, out)
                if latency is not None:
                    now = perf_counter()
                    latency.observe(command[0] if command else b"", now - started)
                    started = now
                end = len(out)  # most replies are one part: no slice, no sum
                size += len(out[-1]) if end == counted + 1 else sum(map(len, out[counted:]))
                counted = end
                if size >= WRITE_BATCH:
                    transport.write(b"".join(out))
                    out.clear()
                    counted = size = 0
                    self._run_rest_later()
                    break
            if out:
                transport.write(b"".join(out))
        except Exception:
            log.exception("connection failed", client=session.id)
            self._end()
            return
        if session.quit or self._closing:
            self._end()
            return
        self._partial.parsed(parser.pending, completed)

    def _run_rest_later(self) -> None:
        """The commands received left to run: read nothing more until they have run (as
        Redis runs a read before the next), and run them in the next turn of the loop,
        so that the other connections get in first; or, if the client does not read our
        replies, once it does (resume_writing)."""
        self._flow.run_later()
        if not self._flow.write_paused:
            self._loop.call_soon(self._resume)

    def _resume(self) -> None:
        """Run the commands left in the parser when a batch of replies was written."""
        if not self._ended and self._command is None and not self._flow.write_paused:
            self._run()

    def _run_rpushx(self, command: list[bytes], out: list[bytes]) -> Reply | Waiting:
        """An RPUSHX and the RPUSHXs parsed right behind it, run as one each would be
        (gateway.commands.produce.rpushx_run): the replies of all but the last onto
        `out`; the last one's reply (or what waits for it) is returned as _execute's.
        Only when dispatch would do nothing but call rpushx: the client is authenticated
        and no MONITOR is on (nor the latency clock: _run checks)."""
        session = self.session
        assert session is not None
        if not session.authenticated or session.ctx.monitors.registered:
            return self._execute(command)
        try:
            answers = rpushx_run(session, command, self._parser)
        except Exception:
            log.exception("command failed", client=session.id, command=command[:1])
            return ErrorReply(errors.internal_error().text)
        protocol = session.protocol
        final = answers.pop()  # rpushx_run answers at least one command
        reply: Any
        for answer in answers:  # counts, mostly; an error now and then
            reply = ErrorReply(answer.text) if isinstance(answer, errors.RespError) else answer
            encode_into(reply, protocol, out)
        reply = ErrorReply(final.text) if isinstance(final, errors.RespError) else final
        if type(reply) in _IMMEDIATE or not inspect.isawaitable(reply):
            return reply  # a Reply (Any: not cast(), a call each)
        return cast(Waiting, self._wait(reply, command))

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
            return reply  # type: ignore[return-value]  # a Reply: not cast(), a call each
        # Reply values are never coroutines: this is what tells _run a command waits.
        return cast(Waiting, self._wait(reply, command))

    def _start_waiting(self, waiting: Waiting) -> None:
        assert self.session is not None
        self._flow.command_waits(self.session.stop_reading)
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
        if self._latency is not None:
            self._latency.observe(
                command[0] if command else b"", perf_counter() - self._waiting_since
            )
        if self._ended:
            return
        # Answered inside this task, not in a done callback: one loop iteration less.
        self._flow.command_answered()
        self._idle.touch()
        if self._flow.write_paused:
            # Answer now; what is pipelined behind runs once the client reads again.
            assert self.session is not None and self._transport is not None
            out: list[bytes] = []
            encode_into(reply, self.session.protocol, out)
            self._transport.write(b"".join(out))
            if self.session.quit or self._closing:
                self._end()
            return
        self._run(reply)

    def _parse_held(self) -> bool:
        """The bytes received are not being parsed through no fault of the client's."""
        return self._command is not None or self._flow.write_paused or self._flow.behind

    def _too_slow(self) -> None:
        assert self.session is not None
        seconds = self._config.partial_command_timeout
        log.info(
            "closing a connection whose command did not arrive in time",
            client=self.session.id,
            seconds=seconds,
            buffered=self._parser.buffered,
        )
        if self._transport is not None:
            error = errors.partial_command_timeout(seconds)
            self._transport.write(encode(ErrorReply(error.text), self.session.protocol))
        self._end()

    def _busy(self) -> bool:
        """Not idle, however long the client is silent: a command waits, the client does
        not read our replies, or it is a monitor (as in Redis)."""
        assert self.session is not None
        return self._command is not None or self._flow.write_paused or self.session.monitoring

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
        if self._handshake is not None:
            # Still in its TLS handshake: stop it (start_tls closes the raw socket).
            self._handshake.cancel()
        self._flow.stop()
        self._idle.close()
        self._partial.close()
        self._teardown_task = self._loop.create_task(self._teardown())
        self._teardown_task.add_done_callback(self._finished)

    async def _teardown(self) -> None:
        transport = self._transport
        assert transport is not None
        if self.session is None:
            # Ended in its TLS handshake (failed, timed out, stopped): no session to
            # release and nothing to send; the raw socket goes at once. Our
            # connection_lost may come or not, before or after (asyncio, uvloop).
            handshake, self._handshake = self._handshake, None
            if handshake is not None:
                await asyncio.gather(handshake, return_exceptions=True)
            transport.abort()
            return
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
        if self.session is not None:
            self.session.writer = None  # the last reference back to us: no cycle left
        self._host.forget(self)
        if not self.closed.done():
            self.closed.set_result(None)
