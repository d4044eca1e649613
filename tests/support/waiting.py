"""Waiting for an event in tests: poll with a bound, fail with a message naming the event."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class _Deadline:
    def __init__(self, timeout: float, what: str) -> None:
        self._timeout = timeout
        self._what = what
        self._at = time.monotonic() + timeout

    def poll(self, check: Callable[[], T]) -> T | None:
        """What `check` returns when truthy, None when it is not (yet); fails once late."""
        result = check()
        if result:
            return result
        if time.monotonic() > self._at:
            raise AssertionError(f"timed out after {self._timeout:g}s: {self._what}")
        return None


def wait_until(check: Callable[[], T], timeout: float, what: str, interval: float = 0.01) -> T:
    """Poll `check` until it returns something truthy (returned); fail naming `what`."""
    deadline = _Deadline(timeout, what)
    while (result := deadline.poll(check)) is None:
        time.sleep(interval)
    return result


async def wait_until_async(
    check: Callable[[], T], timeout: float, what: str, interval: float = 0.02
) -> T:
    """As wait_until, for a test running on an event loop: it keeps running meanwhile."""
    deadline = _Deadline(timeout, what)
    while (result := deadline.poll(check)) is None:
        await asyncio.sleep(interval)
    return result
