"""Topic administration on Kafka (rafka-topics' Admin) against the session's Tansu
broker: create, list, describe (offsets where Tansu's high watermark is too low, retention,
a group's commits and lag), delete, and the errors."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator

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
from tests.support.kafka_proxy import KafkaProxy
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
            with pytest.raises(AdminError, match="partitions must be 1 to 2147483647"):
                await admin.create_topic(name, 0, {})
            assert name not in await admin.list_topics(), "bad input created nothing"

    run(body())


def test_unreachable_cluster_is_a_clear_error() -> None:
    async def body() -> None:
        async with admin_on(f"127.0.0.1:{free_port()}", timeout=1.0) as admin:
            with pytest.raises(AdminError, match=r"cannot reach the Kafka cluster at 127\.0\.0\.1"):
                await admin.list_topics()

    run(body())


# Kafka API keys of the requests a held broker never answers (tests.support.kafka_proxy).
CREATE_TOPICS, DELETE_TOPICS, LIST_GROUPS, DESCRIBE_CONFIGS = 19, 20, 16, 32


@pytest.fixture
def held() -> Iterator[tuple[TansuBroker, KafkaProxy]]:
    """A broker whose clients all go through a proxy that can hold requests unanswered."""
    port = free_port()
    proxy = KafkaProxy(port).start()
    broker = TansuBroker(port=port, advertised=proxy.port)
    broker.start()
    try:
        yield broker, proxy
    finally:
        broker.stop()
        proxy.close()


def test_a_broker_that_never_answers_is_an_admin_error_not_a_traceback(
    held: tuple[TansuBroker, KafkaProxy],
) -> None:
    """A create or delete the broker never answers raised concurrent.futures'
    TimeoutError (rafka-topics: a traceback); one DescribeConfigs it never answers now
    leaves the settings unknown, as on a broker without it."""
    broker, proxy = held
    topic = broker.create_topic(1)

    async def body() -> None:
        async with admin_on(broker.bootstrap, timeout=1.0) as admin:
            proxy.drop.add(DESCRIBE_CONFIGS)
            described = await admin.describe(topic)
            assert described.config == {}
            assert [p.partition for p in described.partitions] == [0]
            proxy.drop.update({CREATE_TOPICS, DELETE_TOPICS})
            with pytest.raises(AdminError, match=r"^cannot create topic new-one: "):
                await admin.create_topic("new-one", 1, {})
            with pytest.raises(AdminError, match=rf"^cannot delete topic {topic}: "):
                await admin.delete_topic(topic)

    run(body())
    assert set(proxy.dropped) == {DESCRIBE_CONFIGS, CREATE_TOPICS, DELETE_TOPICS}


def test_groups_that_cannot_be_listed_are_an_error_not_left_out(
    held: tuple[TansuBroker, KafkaProxy],
) -> None:
    """list_consumer_groups reports a broker's failure in its result, not by raising:
    the description came without the group and its lag, with exit status 0."""
    broker, proxy = held
    topic = broker.create_topic(1)
    consumer = RawConsumer({"bootstrap.servers": broker.bootstrap, "group.id": "committed"})
    consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    consumer.close()

    async def body() -> None:
        async with admin_on(broker.bootstrap, timeout=1.0) as admin:
            shown = await admin.describe(topic)
            assert [g.group for g in shown.groups] == ["committed"]
            proxy.drop.add(LIST_GROUPS)
            with pytest.raises(AdminError, match=r"^cannot list the consumer groups: "):
                await admin.describe(topic)

    run(body())
    assert LIST_GROUPS in proxy.dropped
