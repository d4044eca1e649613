"""Fixtures of the gateway tests that run against one server per module and engine.

A module overrides `engine_name` for other engines (the memory engine too) or `server`
for another configuration.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from gateway.runner import ServerThread
from tests.support.engines import GATEWAY_ENGINES
from tests.support.fixtures import EngineFactories, GatewayConfig
from tests.support.gateway import running


@pytest.fixture(scope="module", params=GATEWAY_ENGINES)
def engine_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="module")
def server(engine_name: str, gateway_config: GatewayConfig) -> Iterator[ServerThread]:
    """A gateway on `engine_name` with the default test configuration."""
    with running(gateway_config(engine_name)) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def new_topic(engine_name: str, engines: EngineFactories) -> Callable[[int], str]:
    """A fresh topic of the server's engine, with that many partitions."""
    return engines(engine_name).new_topic
