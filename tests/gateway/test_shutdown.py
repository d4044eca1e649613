"""The shutdown sequence (spec §7 with the documented intent; A15, G1), on the in-memory
engine and on the Kafka engine (Tansu): the sequence is the gateway's, whatever the engine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence

import pytest

from backends.base import Consumer, Engine, Producer, Record, Stats
from gateway.config import Config
from gateway.runner import ServerThread
from gateway.stats import ServerStats
from tests.support.engines import GATEWAY_ENGINES
from tests.support.fixtures import EngineFactories, GatewayConfig
from tests.support.gateway import Raw, client, configured_engine, refused
from tests.support.waiting import wait_until


class HeldConsumer(Consumer):
    """A real consumer whose close() first waits for the test's release.

    Not a failure double: it only holds the shutdown in its "consumers are closing"
    step, which otherwise lasts too short a time to observe deterministically.
    """

    def __init__(self, inner: Consumer, release: asyncio.Event) -> None:
        self._inner = inner
        self._release = release

    async def next(self, timeout: float | None) -> Record | None:
        return await self._inner.next(timeout)

    def ack(self, topic: str, partition: int, offset: int) -> None:
        self._inner.ack(topic, partition, offset)

    async def close(self) -> None:
        await self._release.wait()
        await self._inner.close()


class HoldingEngine(Engine):
    """The configured engine, with consumer close held by `release` (see HeldConsumer)."""

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner.stats)
        self.inner = inner
        self.release = asyncio.Event()

    async def start(self) -> None:
        await self.inner.start()

    async def stop(self) -> None:
        await self.inner.stop()

    def producer(self, session_id: str) -> Producer:
        return self.inner.producer(session_id)

    async def consumer(
        self, group: str, name: str, topics: Sequence[str], settings: Mapping[str, object]
    ) -> Consumer:
        return HeldConsumer(await self.inner.consumer(group, name, topics, settings), self.release)

    async def topics(self) -> list[str]:
        return await self.inner.topics()


def engine_for(config: Config) -> HoldingEngine:
    return HoldingEngine(configured_engine(config))


@pytest.fixture(params=["memory", *GATEWAY_ENGINES])
def engine_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def blpop_waiting(server: ServerThread, name: str, topic: str) -> Raw:
    raw = Raw(server.port, timeout=20)
    raw.command("CLIENT", "SETNAME", name)
    raw.expect(b"$2\r\nOK\r\n")
    raw.command("BLPOP", f"topics:{topic}", "0.05")  # creates the consumer
    raw.expect(b"*-1\r\n")
    raw.command("BLPOP", f"topics:{topic}", "0")  # waits until a record or shutdown
    wait_until(lambda: server.server.waiting_commands == 1, 10, "the BLPOP to be waiting")
    return raw


def test_shutdown_sequence(  # A15, G1
    engine_name: str, gateway_config: GatewayConfig, engines: EngineFactories
) -> None:
    topic = engines(engine_name).new_topic()
    config = gateway_config(engine_name, shutdown_timeout=30)
    engine = engine_for(config)
    server = ServerThread(config, engine=engine).start()
    try:
        consumer = blpop_waiting(server, "shut:cons", topic)
        producer = Raw(server.port)  # connected before the signal, no producer yet
        producer.command("PING")
        producer.expect(b"+PONG\r\n")
        done = server.shutdown_async()
        # The waiting BLPOP answers at once.
        consumer.expect(b"-CONS Server shutdown\r\n")
        # Consumers are closing (held): existing and new connections are still served.
        producer.command("RPUSHX", f"topics:{topic}", "during-drain")
        producer.expect(b":1\r\n")
        with Raw(server.port) as late:
            late.command("PING")
            late.expect(b"+PONG\r\n")
            late.command("CLIENT", "SETNAME", "shut:late")
            late.expect(b"$2\r\nOK\r\n")
            late.command("BLPOP", f"topics:{topic}", "1")
            late.expect(b"-CONS Server shutdown\r\n")
            late.command("RPUSHX", f"topics:{topic}", "from-new-connection")
            late.expect(b":1\r\n")
            late.command("DUMP", "5000")
            late.expect(b":0\r\n")
        assert not done.done()
        server.call(_set(engine.release))
        done.result(30)
        consumer.assert_closed()
        producer.assert_closed()
        assert refused(server.port)
        stats = server.server.ctx.stats.snapshot()
        # Every record was delivered before the engine stopped: nothing left unflushed.
        assert stats[Stats.UNFLUSHED] == 0
        assert stats[Stats.DELIVERED] == 2
        assert stats[ServerStats.CONNECTIONS_CURRENT] == 0
    finally:
        server.stop()


async def _set(event: asyncio.Event) -> None:
    event.set()


def test_shutdown_is_bounded(
    engine_name: str, gateway_config: GatewayConfig, engines: EngineFactories
) -> None:
    topic = engines(engine_name).new_topic(1)
    config = gateway_config(engine_name, shutdown_timeout=1)
    engine = engine_for(config)
    server = ServerThread(config, engine=engine).start()
    consumer = blpop_waiting(server, "bound:cons", topic)
    started = time.monotonic()
    server.shutdown_async().result(20)  # the held consumer never closes by itself
    elapsed = time.monotonic() - started
    assert 0.9 < elapsed < 10
    consumer.expect(b"-CONS Server shutdown\r\n")
    consumer.assert_closed()
    assert refused(server.port)
    server.stop()


def test_closed_connection_is_released_and_exit_closes_the_listener(
    engine_name: str, gateway_config: GatewayConfig
) -> None:
    config = gateway_config(engine_name)
    with ServerThread(config) as server:
        with client(server) as c:
            assert c.ping()
        wait_until(lambda: server.server.connections == 0, 5, "the connection to close")
    assert refused(server.port)


class CountingStopEngine(HoldingEngine):
    """The configured engine, counting how often the server stops it."""

    stops = 0

    async def stop(self) -> None:
        self.stops += 1
        await super().stop()


def test_shutdown_twice_is_one_shutdown(engine_name: str, gateway_config: GatewayConfig) -> None:
    config = gateway_config(engine_name)
    engine = CountingStopEngine(configured_engine(config))
    server = ServerThread(config, engine=engine).start()
    futures = [server.shutdown_async() for _ in range(2)]
    for future in futures:
        future.result(30)
    assert refused(server.port)
    assert engine.stops == 1, f"the engine was stopped {engine.stops} times"
    server.stop()


class HeldTopicsEngine(HoldingEngine):
    """HoldingEngine whose KEYS metadata call also waits for `release`: a waiting command
    that outlives the shutdown bound, which a healthy broker answers too fast to observe."""

    async def topics(self) -> list[str]:
        await self.release.wait()
        return await self.inner.topics()


async def _monitor_state(server: ServerThread) -> tuple[int, list[str]]:
    current = asyncio.current_task()
    tasks = [t.get_name() for t in asyncio.all_tasks() if t is not current and not t.done()]
    return len(server.server.ctx.monitors), tasks


def test_abandoned_connection_releases_its_monitor(
    engine_name: str, gateway_config: GatewayConfig
) -> None:
    config = gateway_config(engine_name, shutdown_timeout=0.5)
    engine = HeldTopicsEngine(configured_engine(config))
    server = ServerThread(config, engine=engine).start()
    try:
        with Raw(server.port) as raw:
            raw.command("MONITOR")
            raw.expect(b"+OK\r\n")
            raw.command("KEYS", "topics:")  # held past the shutdown bound
            wait_until(lambda: server.server.waiting_commands == 1, 10, "KEYS to be waiting")
            server.shutdown_async().result(20)
            raw.read_line()  # the monitor line of KEYS itself
            raw.assert_closed()
        monitors, tasks = server.call(_monitor_state(server), 10)
        assert monitors == 0, "the abandoned connection is still a registered monitor"
        assert "monitor-writer" not in tasks, f"monitor writer left running: {tasks}"
    finally:
        server.call(_set(engine.release), 10)
        server.stop()
