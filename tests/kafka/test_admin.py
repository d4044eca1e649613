"""Topic administration on Kafka (rafka-topics' Admin) against the session's Tansu
broker: create, list, describe (offsets where Tansu's high watermark is too low, retention,
a group's commits and lag), delete, and the errors."""

from __future__ import annotations

import asyncio
import secrets

import pytest
from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import Producer as RawProducer
from confluent_kafka import TopicPartition

from backends.base import (
    AdminError,
    EngineOptions,
    GroupOffsets,
    TopicExistsError,
    TopicPartitionOffsets,
    UnknownTopicError,
)
from backends.kafka.admin import KafkaAdmin
from backends.ports import free_port
from tests.support.kafka import kafka_settings
from tests.support.tansu import TansuBroker

pytestmark = pytest.mark.kafka


def admin_on(bootstrap: str, timeout: float = 5.0) -> KafkaAdmin:
    return KafkaAdmin(kafka_settings(bootstrap), EngineOptions(metadata_timeout=timeout))


def run(coroutine: object) -> None:
    asyncio.run(asyncio.wait_for(coroutine, 60))  # type: ignore[arg-type]


def test_create_describe_delete(tansu: TansuBroker) -> None:
    name = f"admin-{secrets.token_hex(3)}"
    group = f"g-{secrets.token_hex(3)}"

    async def body() -> None:
        async with admin_on(tansu.bootstrap) as admin:
            await admin.create_topic(name, 3, {"retention.ms": "3600000"})
            assert name in await admin.list_topics()
            with pytest.raises(TopicExistsError, match=f"'{name}' already exists"):
                await admin.create_topic(name, 3, {})
            # One batch: Tansu's high watermark says 1 for it.
            producer = RawProducer({"bootstrap.servers": tansu.bootstrap, "linger.ms": 50})
            for index in range(12):
                producer.produce(name, value=b"v%d" % index, partition=1)
            assert producer.flush(10) == 0
            consumer = RawConsumer({"bootstrap.servers": tansu.bootstrap, "group.id": group})
            consumer.commit(offsets=[TopicPartition(name, 1, 10)], asynchronous=False)
            consumer.close()
            described = await admin.describe(name)
            assert described.partitions == (
                TopicPartitionOffsets(0, 0, 0),
                TopicPartitionOffsets(1, 0, 12),
                TopicPartitionOffsets(2, 0, 0),
            )
            assert described.retention_ms == "3600000"
            assert GroupOffsets(group, 1, 10, 2) in described.groups
            # Several at once (the gateway's metrics), a topic that does not exist left out.
            assert await admin.describe_many([name, f"no-{name}"]) == [described]
            await admin.delete_topic(name)
            assert name not in await admin.list_topics()
            with pytest.raises(UnknownTopicError, match=f"'{name}' does not exist"):
                await admin.describe(name)
            with pytest.raises(UnknownTopicError):
                await admin.delete_topic(name)
            with pytest.raises(AdminError, match="invalid topic name"):
                await admin.create_topic("a:b", 1, {})
            with pytest.raises(AdminError, match="partitions must be at least 1"):
                await admin.create_topic(name, 0, {})
            assert name not in await admin.list_topics(), "bad input created nothing"

    run(body())


def test_unreachable_cluster_is_a_clear_error() -> None:
    async def body() -> None:
        async with admin_on(f"127.0.0.1:{free_port()}", timeout=1.0) as admin:
            with pytest.raises(AdminError, match=r"cannot reach the Kafka cluster at 127\.0\.0\.1"):
                await admin.list_topics()

    run(body())
