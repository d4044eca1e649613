"""Fixtures of the end-to-end tests that run a `rafka` process on each engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.helpers import DafkaDeployment, Deployment, KafkaDeployment
from tests.support.engines import GATEWAY_ENGINES
from tests.support.rafka_process import RafkaProcess


@pytest.fixture(scope="module", params=GATEWAY_ENGINES)
def deployment(request: pytest.FixtureRequest) -> Deployment:
    """What the module's gateways run on: once per engine (Kafka on the session's Tansu)."""
    if request.param == "kafka":
        return KafkaDeployment(request.getfixturevalue("tansu"))
    return DafkaDeployment()


@pytest.fixture
def rafka(deployment: Deployment, tmp_path: Path) -> Iterator[RafkaProcess]:
    """A gateway whose restarts keep its port and configuration (Dafka: its data dir),
    killed at the end. Modules that share one gateway define their own `rafka`."""
    server = RafkaProcess(deployment.write_config(tmp_path / "rafka.json"))
    server.start()
    yield server
    server.kill()
