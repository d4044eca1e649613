"""The idle timeout of one connection: close it after `timeout` seconds of silence.

One timer per connection, re-armed when it fires: activity only records the time, so a
busy connection costs no timer handling per read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


def _not_busy() -> bool:
    return False


def _nothing() -> None:
    pass


class _ConnectionTimer:
    """What both timers share: one `call_later` handle that `_check` re-arms, and the
    callbacks `busy()` (the connection counts as active) and `expire()` (close it)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        timeout: float,
        busy: Callable[[], bool],
        expire: Callable[[], None],
    ) -> None:
        """`timeout` 0 never expires."""
        self._loop = loop
        self._timeout = timeout
        self._busy = busy
        self._expire = expire
        self._handle: asyncio.TimerHandle | None = None

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def close(self) -> None:
        """Cancel for good and let go of the callbacks: they are the connection's bound
        methods, and a connection that held its timers and was held by them was freed only
        by the cycle collector (a full pass after 10,000 clients left took 100 ms)."""
        self.cancel()
        self._busy = _not_busy
        self._expire = _nothing


class IdleTimer(_ConnectionTimer):
    """While `busy()` the connection counts as active (a command waits, the client does
    not read our replies, it is a monitor)."""

    _last_activity = 0.0

    def start(self) -> None:
        if self._timeout:
            self._last_activity = self._loop.time()
            self._handle = self._loop.call_later(self._timeout, self._check)

    def touch(self) -> None:
        if self._timeout:
            self._last_activity = self._loop.time()

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


class PartialCommandTimer(_ConnectionTimer):
    """Close a connection whose command takes more than `timeout` seconds to arrive in
    full: a client that trickles a byte now and then is never silent, so the idle
    timeout alone would keep its unfinished command (and its buffer) for ever.

    The connection reports after each parse whether a command is unfinished and whether
    one completed (then the unfinished one is new). One timer, armed while a command is
    unfinished; time spent `busy()` (a command waits, the client does not read our
    replies: the bytes behind are not being parsed) does not count.
    """

    _since: float | None = None  # when the unfinished command started

    def parsed(self, unfinished: bool, completed: bool) -> None:
        """After a parse: is a command unfinished, and did one complete meanwhile?"""
        if not self._timeout:
            return
        if not unfinished:
            self._since = None
            return
        if completed or self._since is None:
            self._since = self._loop.time()
        if self._handle is None:
            self._handle = self._loop.call_later(self._timeout, self._check)

    def _check(self) -> None:
        self._handle = None
        since = self._since
        if since is None:
            return
        now = self._loop.time()
        if self._busy():
            self._since = since = now
        elif now - since >= self._timeout:
            self._expire()
            return
        self._handle = self._loop.call_later(self._timeout - (now - since), self._check)
