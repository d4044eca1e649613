"""The fixtures every test directory shares (a pytest plugin, loaded by conftest.py).

`pytest --no-broker` (`make test-fast`) skips every test that needs a Kafka broker: those
marked `kafka`, and those that ask for the `tansu` fixture, however indirectly (an
engine factory asks for it only when the Kafka engine's turn comes).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import pytest

from backends.registry import ENGINES, EngineEntry
from gateway.config import Config
from tests.support.engines import FACTORIES, EngineFactory
from tests.support.redis_server import RedisServer
from tests.support.tansu import TansuBroker

NO_BROKER = "needs a Kafka broker (--no-broker)"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--no-broker", action="store_true", help="skip the tests that need a Kafka broker"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("no_broker"):
        for item in items:
            if item.get_closest_marker("kafka") is not None:
                item.add_marker(pytest.mark.skip(reason=NO_BROKER))


@pytest.fixture(scope="session")
def tansu(request: pytest.FixtureRequest) -> Iterator[TansuBroker]:
    """One Tansu broker for the whole run; tests use their own random topic names."""
    if request.config.getoption("no_broker"):
        pytest.skip(NO_BROKER)
    with TansuBroker() as broker:
        yield broker


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A plain redis-server (the client's test double) for the whole run; tests use keys
    of their own."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session", autouse=True)
def memory_engine_registered() -> Iterator[None]:
    """The in-memory engine under the name "memory", as an installed engine would be."""
    ENGINES["memory"] = EngineEntry("memory", "tests.support.memory_engine")
    yield
    del ENGINES["memory"]


@pytest.fixture(params=list(FACTORIES))
def engine_factory(request: pytest.FixtureRequest) -> Iterator[EngineFactory]:
    """Each engine in turn, in a deployment of its own (Kafka: on the session broker)."""
    factory = FACTORIES[request.param](request)
    yield factory
    factory.close()


class EngineFactories(Protocol):
    def __call__(self, engine: str, /) -> EngineFactory: ...


@pytest.fixture(scope="session")
def engines(request: pytest.FixtureRequest) -> Iterator[EngineFactories]:
    """`engines(name)`: the session's deployment of engine `name` (made on first use)."""
    made: dict[str, EngineFactory] = {}

    def factory(engine: str, /) -> EngineFactory:
        if engine not in made:
            made[engine] = FACTORIES[engine](request)
        return made[engine]

    yield factory
    for each in made.values():
        each.close()


class GatewayConfig(Protocol):
    def __call__(self, engine: str, /, **gateway: Any) -> Config: ...


@pytest.fixture(scope="session")
def gateway_config(engines: EngineFactories) -> GatewayConfig:
    """`gateway_config(engine, **gateway_settings)`: a Config for a gateway on 127.0.0.1,
    a free port and the session's deployment of `engine` (topics: `engines(engine)`)."""

    def config(engine: str, /, **gateway: Any) -> Config:
        return engines(engine).gateway_config(**gateway)

    return config
