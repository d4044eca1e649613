"""Where the client tests run: a gateway on every engine of
tests.support.engines.FACTORIES (an engine added there is picked up), and a plain
redis-server as the test double the client promises to work with."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from rafka_client import Consumer, Record

from gateway.runner import ServerThread
from tests.support.engines import FACTORIES, EngineFactory
from tests.support.gateway import running
from tests.support.redis_server import RedisServer

DOUBLE = "redis"  # the plain redis-server test double
WAIT = 15.0  # seconds: the bound of every wait for records (Kafka group joins take ~1 s)


@dataclass
class Backend:
    """What a client connects to: a gateway on one engine, or the plain Redis double."""

    name: str
    url: str
    factory: EngineFactory | None = None
    gateway: ServerThread | None = None

    @property
    def double(self) -> bool:
        return self.factory is None

    def new_topic(self, partitions: int = 1) -> str:
        if self.factory is None:
            return f"t-{uuid.uuid4().hex[:8]}"
        return self.factory.new_topic(partitions)


@pytest.fixture(params=[*FACTORIES, DOUBLE])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == DOUBLE:
        server: RedisServer = request.getfixturevalue("redis_server")
        yield Backend(DOUBLE, server.url)
        return
    factory = FACTORIES[request.param](request)
    with running(factory.gateway_config()) as gateway:
        yield Backend(request.param, f"redis://127.0.0.1:{gateway.port}", factory, gateway)
    factory.close()


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def protocol(request: pytest.FixtureRequest) -> int:
    value: int = request.param
    return value


def new_group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


def take(consumer: Consumer, count: int, timeout: float = WAIT) -> list[Record]:
    """`count` records polled within `timeout` seconds; fails saying what arrived."""
    records: list[Record] = []
    deadline = time.monotonic() + timeout
    while len(records) < count:
        remaining = deadline - time.monotonic()
        record = consumer.poll(min(remaining, 1.0)) if remaining > 0 else None
        if record is not None:
            records.append(record)
        elif remaining <= 0:
            got = [r.value for r in records]
            raise AssertionError(f"expected {count} records within {timeout}s, got {got}")
    return records


def proxied_consumer(proxy_port: int, topic: str) -> Consumer:
    """A consumer of `topic` through a TcpProxy on `proxy_port` that reconnects quickly
    (backoff 0.05 to 0.2 s) and gives up after 1 s without a working session."""
    return Consumer(
        new_group(),
        "c",
        topic,
        url=f"redis://127.0.0.1:{proxy_port}",
        backoff=(0.05, 0.2),
        reconnect_timeout=1.0,
    )
