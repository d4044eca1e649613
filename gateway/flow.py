"""Flow control of one connection: when it reads, and when its writers may write.

Reading pauses while the client does not read our replies (the transport's write buffer
is full), so that such a client stalls only itself, while an RPUSHX waits for room in the
engine's queue (backpressure), while it has sent more than `max_query_buffer` bytes
behind a command that waits (we read on meanwhile, to notice a
disconnect at once, but not without bound), and while commands it sent are left to run
in a later turn of the event loop (what one read brings is run before the next read, as
in Redis: a client that reads its replies could otherwise make us hold every command it
ever sent). MONITOR's writer awaits `drain()` to wait for the client to read again.
"""

from __future__ import annotations

import asyncio


class FlowControl:
    def __init__(
        self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop, max_query_buffer: int
    ) -> None:
        self._transport = transport
        self._loop = loop
        self._max_query_buffer = max_query_buffer
        self.write_paused = False  # the client does not read our replies
        self._buffer_full = False  # it sent more than the limit behind a waiting command
        self._behind = False  # commands received are left to run in a later turn
        self._reading_paused = False
        self._buffered = 0  # bytes received since the waiting command started
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._stopped = False

    @property
    def reading_paused(self) -> bool:
        return self._reading_paused

    # --- the transport's write buffer (asyncio.Protocol's pause/resume_writing) -----------

    def pause_writing(self) -> None:
        self.write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._drain_waiters.clear()
        self._update_reading()

    async def drain(self) -> None:
        """Return once the client reads our replies again; raise if it is gone."""
        if self._transport.is_closing():
            raise ConnectionResetError("Connection lost")
        if self.write_paused:
            waiter = self._loop.create_future()
            self._drain_waiters.append(waiter)
            await waiter

    # --- commands received and not run yet ----------------------------------------------

    def run_later(self) -> None:
        """Commands received are left to run in a later turn: read nothing more until
        they have run (`caught_up`) or one of them waits."""
        if not self._behind:
            self._behind = True
            self._update_reading()

    def caught_up(self) -> None:
        """Every complete command received has run."""
        if self._behind:
            self._behind = False
            self._update_reading()

    @property
    def behind(self) -> bool:
        return self._behind

    # --- what arrives behind a waiting command --------------------------------------------

    def command_waits(self, stop_reading: bool = False) -> None:
        """A command waits; with `stop_reading`, read nothing until it is answered (it
        waits for room for records: reading more would only queue more). Otherwise read
        on, up to the limit, whatever was left to run behind it."""
        self._buffered = 0
        self._behind = False
        if stop_reading:
            self._buffer_full = True
        self._update_reading()

    def received_while_waiting(self, size: int) -> None:
        self._buffered += size
        if self._buffered >= self._max_query_buffer:
            self._buffer_full = True
            self._update_reading()

    def command_answered(self) -> None:
        self._buffered = 0
        self._buffer_full = False
        self._update_reading()

    # --- end --------------------------------------------------------------------------------

    def stop(self) -> None:
        """The connection ends: leave the transport's reading as it is from now on."""
        self._stopped = True

    def connection_lost(self) -> None:
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_exception(ConnectionResetError("Connection lost"))
        self._drain_waiters.clear()

    def _update_reading(self) -> None:
        if self._stopped:
            return
        pause = self.write_paused or self._buffer_full or self._behind
        if pause and not self._reading_paused:
            self._reading_paused = True
            self._transport.pause_reading()
        elif not pause and self._reading_paused:
            self._reading_paused = False
            self._transport.resume_reading()
