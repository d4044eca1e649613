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
from pathlib import Path
from typing import Any, ClassVar

import pytest

from backends.base import Engine, EngineOptions, Stats
from backends.dafka.config import Config as DafkaConfig
from backends.dafka.embedded import EmbeddedNetwork
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
    # Whether one key lands on one partition whichever gateway produces it. Not on Dafka,
    # where each gateway writes partitions of its own (docs/dafka-engine.md).
    keys_share_partitions_across_gateways: ClassVar[bool] = True

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


class DafkaEngineFactory(EngineFactory):
    """A Dafka network of its own (a tower and a store as processes, loopback only, in a
    temporary directory); each engine joins it as one gateway with a node of its own, the
    lowest one no running engine of this factory holds, so a restarted gateway writes the
    partitions it wrote before."""

    name = "dafka"
    keys_share_partitions_across_gateways = False

    def __init__(self, tmp_dir: Path) -> None:
        self._tmp_dir = tmp_dir
        self._network: EmbeddedNetwork | None = None
        self._engines: dict[int, Engine] = {}
        self._node: int | None = None

    def _tower(self) -> DafkaConfig:
        if self._network is None:
            self._network = EmbeddedNetwork(self._tmp_dir / "dafka", stores=1)
            self._network.start()
        return self._network.config

    def gateway_config(self, **gateway: Any) -> Config:
        """A gateway as node 0, as a lone gateway is: its topics' partitions are numbered
        from 0, as on Kafka. Gateways of one deployment that write one topic at the same
        time must be made with engines of their own nodes instead (`create`)."""
        self._node = 0
        try:
            return super().gateway_config(**gateway)
        finally:
            self._node = None

    def document(self) -> dict[str, Any]:
        tower = self._tower()
        return {
            "dafka": {
                "tower_sub_address": tower.get("beacon/sub_address"),
                "tower_pub_address": tower.get("beacon/pub_address"),
                # new_topic(n) names start with "p<n>-": known to engines made before.
                "topic_partitions": {f"p{n}-*": n for n in range(1, 17)},
                "commit_interval": 0.2,
                "node": self._free_node() if self._node is None else self._node,
                "settings": {"beacon/address": "127.0.0.1", "beacon/interval": "200"},
            }
        }

    def _free_node(self) -> int:
        running = {n for n, e in self._engines.items() if not getattr(e, "stopped", True)}
        return next(n for n in range(len(running) + 1) if n not in running)

    def create(self, options: EngineOptions | None = None, stats: Stats | None = None) -> Engine:
        node = self._free_node()
        engine = super().create(options, stats)
        self._engines[node] = engine
        return engine

    def new_topic(self, partitions: int = 4) -> str:
        return f"p{partitions}-{uuid.uuid4().hex[:6]}"

    def close(self) -> None:
        if self._network is not None:
            self._network.stop()
            self._network = None


# The engines the gateway's engine-agnostic tests run on: both real ones.
GATEWAY_ENGINES = ["dafka", "kafka"]

# The engines every contract test runs on. The Kafka one uses the session's Tansu broker.
FACTORIES: Mapping[str, Callable[[pytest.FixtureRequest], EngineFactory]] = {
    "kafka": lambda request: KafkaEngineFactory(request.getfixturevalue("tansu")),
    "memory": lambda request: MemoryEngineFactory(),
    "dafka": lambda request: DafkaEngineFactory(
        request.getfixturevalue("tmp_path_factory").mktemp("dafka")
    ),
}
