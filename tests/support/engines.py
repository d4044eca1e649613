"""Each engine under test with the deployment it runs in: the contract suite runs on
every one of them, and the gateway tests pick one by name.

Adding an engine to the tests: an `EngineFactory` for it, and one line in `FACTORIES`.
"""

from __future__ import annotations

import json
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import pytest

from backends.base import Engine, EngineOptions, Stats
from backends.registry import engine_entry
from backends.settings import json_decoder
from gateway.config import Config, from_dict
from tests.support.kafka import kafka_document
from tests.support.memory_engine import MemoryLog
from tests.support.tansu import TansuBroker


class EngineFactory(ABC):
    """Makes engines of one deployment (one broker, one log): several engines made here
    are several gateways in front of the same records, groups and commits."""

    name: ClassVar[str]  # the engine's name in backends.registry

    @abstractmethod
    def document(self) -> dict[str, Any]:
        """The engine's sections of a configuration document for this deployment. New
        consumer groups start at the earliest record."""

    @abstractmethod
    def new_topic(self, partitions: int = 4) -> str:
        """A fresh topic, ready for records, with `partitions` partitions."""

    @abstractmethod
    def close(self) -> None:
        """Release what the deployment holds for this factory."""

    def create(self, options: EngineOptions | None = None, stats: Stats | None = None) -> Engine:
        """A new engine, not started, made as the gateway makes it."""
        entry = engine_entry(self.name)
        # Through JSON, as from a file: the engine gets numbers as JsonNumber.
        document = json_decoder().decode(json.dumps(self.document()))
        settings = entry.parse_settings(document)
        return entry.create(settings, stats or Stats(), options or EngineOptions())

    @asynccontextmanager
    async def running(self, **options: Any) -> AsyncIterator[Engine]:
        """A started engine (EngineOptions from `options`), stopped at the end."""
        engine = self.create(EngineOptions(**options))
        await engine.start()
        try:
            yield engine
        finally:
            await engine.stop()

    def gateway_config(self, **gateway: Any) -> Config:
        """A gateway on this engine, on 127.0.0.1 and a free port; `gateway` are
        settings of the `gateway` section."""
        section = {"engine": self.name, "host": "127.0.0.1", "port": 0, **gateway}
        return from_dict({**self.document(), "gateway": section})


class KafkaEngineFactory(EngineFactory):
    name = "kafka"

    def __init__(self, broker: TansuBroker) -> None:
        self.broker = broker

    def document(self) -> dict[str, Any]:
        return kafka_document(self.broker.bootstrap)

    def new_topic(self, partitions: int = 4) -> str:
        return self.broker.create_topic(partitions)

    def close(self) -> None:
        """The broker is the session's: its topics have names of their own."""


class MemoryEngineFactory(EngineFactory):
    name = "memory"

    def __init__(self) -> None:
        self.log_name = f"test-{uuid.uuid4().hex}"

    def document(self) -> dict[str, Any]:
        return {"memory": {"log": self.log_name, "auto.offset.reset": "earliest"}}

    def new_topic(self, partitions: int = 4) -> str:
        name = f"r-{uuid.uuid4().hex[:6]}"
        MemoryLog.named(self.log_name).create_topic(name, partitions)
        return name

    def close(self) -> None:
        MemoryLog.forget(self.log_name)


# The engines every contract test runs on. The Kafka one uses the session's Tansu broker.
FACTORIES: Mapping[str, Callable[[pytest.FixtureRequest], EngineFactory]] = {
    "kafka": lambda request: KafkaEngineFactory(request.getfixturevalue("tansu")),
    "memory": lambda request: MemoryEngineFactory(),
}
