"""The Kafka engine as the tests configure it: the one configuration the tests, e2e and
benchmarks give it on Tansu, and a running engine on that configuration."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from backends.base import EngineOptions, Stats
from backends.kafka.consumer import BATCH
from backends.kafka.engine import KafkaEngine
from backends.kafka.settings import KafkaSettings, parse_settings
from backends.settings import json_decoder


def kafka_document(bootstrap: str) -> dict[str, dict[str, object]]:
    """Rafka's test configuration (spec §8.2), adapted to modern librdkafka and Tansu.

    As a configuration document's Kafka sections (the `go.*` keys are Rafka's, accepted
    and dropped). Group joins take half of session.timeout.ms on Tansu: 2000 keeps them
    near one second. The producer refuses unknown topics, and quickly (spec §15.2).
    """
    return {
        "general": {"bootstrap.servers": bootstrap, "log_level": 3},
        "consumer": {
            "session.timeout.ms": 2000,
            "heartbeat.interval.ms": 500,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "auto.commit.interval.ms": 500,
            "enable.auto.offset.store": False,
            "go.events.channel.enable": False,
            "go.application.rebalance.enable": False,
        },
        "producer": {
            "go.delivery.reports": True,
            "queue.buffering.max.ms": 0,
            "allow.auto.create.topics": False,
            "topic.metadata.propagation.max.ms": 200,
        },
    }


def kafka_settings(
    bootstrap: str, producer: dict[str, str] | None = None, consumer: dict[str, str] | None = None
) -> KafkaSettings:
    """The tests' Kafka settings (tests/support/kafka.py), with `producer` and `consumer`
    properties over them."""
    document = kafka_document(bootstrap)
    document["producer"].update(producer or {})
    document["consumer"].update(consumer or {})
    decoded = json_decoder().decode(json.dumps(document))  # as from a file
    return parse_settings(decoded)


@asynccontextmanager
async def running_engine(
    bootstrap: str,
    producer: dict[str, str] | None = None,
    consumer: dict[str, str] | None = None,
    metadata_timeout: float = 5.0,
    consume_batch: int = BATCH,
) -> AsyncIterator[KafkaEngine]:
    engine = KafkaEngine(
        Stats(),
        kafka_settings(bootstrap, producer, consumer),
        EngineOptions(metadata_timeout=metadata_timeout, consume_batch=consume_batch),
    )
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()
