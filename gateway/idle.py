"""The idle timeout of one connection: close it after `timeout` seconds of silence.

One timer per connection, re-armed when it fires: activity only records the time, so a
busy connection costs no timer handling per read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class IdleTimer:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        timeout: float,
        busy: Callable[[], bool],
        expire: Callable[[], None],
    ) -> None:
        """`timeout` 0 never expires. While `busy()` the connection counts as active (a
        command waits, the client does not read our replies, it is a monitor)."""
        self._loop = loop
        self._timeout = timeout
        self._busy = busy
        self._expire = expire
        self._handle: asyncio.TimerHandle | None = None
        self._last_activity = 0.0

    def start(self) -> None:
        if self._timeout:
            self._last_activity = self._loop.time()
            self._handle = self._loop.call_later(self._timeout, self._check)

    def touch(self) -> None:
        if self._timeout:
            self._last_activity = self._loop.time()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _check(self) -> None:
        self._handle = None
        now = self._loop.time()
        if self._busy():
            self._last_activity = now
        elif now - self._last_activity >= self._timeout:
            self._expire()
            return
        self._handle = self._loop.call_later(
            self._timeout - (now - self._last_activity), self._check
        )
