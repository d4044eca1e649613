"""Tests of reads by offset on an engine that does not implement them yet.

Such an engine keeps the defaults of `Engine.partition_offsets` / `Engine.read`
(backends/base.py), which raise ReadError with READS_NOT_SUPPORTED; the gateway answers
`ERR read failed: <that text>`. A test that meets exactly that text ends as an expected
failure naming the engine, instead of failing, and becomes a real test again as soon as
the engine implements the two methods. Any other error still fails the test.
"""

from __future__ import annotations

import pytest
import redis

from backends.base import READS_NOT_SUPPORTED, Engine, ReadError


def xfail_if_not_supported(text: str, engine: str) -> None:
    if READS_NOT_SUPPORTED in text:
        pytest.xfail(f"the {engine} engine does not implement reads by offset yet")


async def require_engine_reads(engine: Engine, name: str, topic: str) -> None:
    try:
        await engine.partition_offsets(topic, 0)
    except ReadError as error:
        xfail_if_not_supported(str(error), name)


def require_gateway_reads(client: redis.Redis, name: str, topic: str) -> None:
    try:
        client.llen(f"topics:{topic}:0")
    except redis.ResponseError as error:
        xfail_if_not_supported(str(error), name)
