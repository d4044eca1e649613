"""Driving an engine directly from a test: async tests, bounded consumption, timing."""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec

import pytest

from backends.base import Consumer, Engine, Record

P = ParamSpec("P")

WAIT = 10.0  # seconds: the bound of every wait for something that should happen


def asyncio_test(test: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    """Run an async test on a fresh event loop (pytest sees the original signature)."""

    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


Keyed = tuple[bytes | None, bytes]


async def produce_all(engine: Engine, topic: str, records: list[Keyed]) -> None:
    """Produce `records` (key, value) through a handle of their own and wait for them."""
    handle = engine.producer("producing")
    for key, value in records:
        handle.produce(topic, key, value)
    assert await handle.flush(WAIT) == 0, "records still outstanding after the flush"
    await handle.close(WAIT)


def new_group() -> str:
    return f"g-{uuid.uuid4().hex[:6]}"


async def consume(consumer: Consumer, count: int, ack: bool = False) -> list[Record]:
    """`count` records within WAIT seconds, acked if asked; fails saying what arrived."""
    records: list[Record] = []
    deadline = time.monotonic() + WAIT
    while len(records) < count:
        remaining = deadline - time.monotonic()
        record = await consumer.next(remaining) if remaining > 0 else None
        if record is None:
            got = [r.value for r in records]
            pytest.fail(f"expected {count} records within {WAIT}s, got {len(got)}: {got}")
        if ack:
            consumer.ack(record.topic, record.partition, record.offset)
        records.append(record)
    return records


def by_partition(records: list[Record]) -> dict[int, list[Record]]:
    """`records` by partition number, each partition's in the order given."""
    grouped: dict[int, list[Record]] = {}
    for record in records:
        grouped.setdefault(record.partition, []).append(record)
    return grouped


async def timed(awaitable: Awaitable[Any]) -> tuple[Any, float]:
    start = time.monotonic()
    result = await awaitable
    return result, time.monotonic() - start
