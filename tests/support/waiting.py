"""Waiting for an event in tests: poll with a bound, fail with a message naming the event."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(check: Callable[[], T], timeout: float, what: str, interval: float = 0.01) -> T:
    """Poll `check` until it returns something truthy (returned); fail naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s: {what}")
        time.sleep(interval)


async def wait_until_async(
    check: Callable[[], T], timeout: float, what: str, interval: float = 0.02
) -> T:
    """As wait_until, for a test running on an event loop: it keeps running meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s: {what}")
        await asyncio.sleep(interval)
