"""Topic administration on Dafka (rafka-topics' Admin) with gateways' engines on one
in-process network (a tower and a store): the catalog is followed, records spread over
the created count, describe, delete, and the errors."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator

import pytest
import zmq

from backends.base import (
    AdminError,
    EngineOptions,
    GroupOffsets,
    TopicExistsError,
    TopicPartitionOffsets,
    UnknownTopicError,
)
from backends.dafka.admin import DafkaAdmin
from backends.dafka.config import Config
from backends.dafka.engine import DafkaEngine
from backends.dafka.partitions import make_partitioner
from backends.dafka.store import Store
from backends.dafka.tower import Tower
from tests.dafka.test_engine import engine_on, settings_for, take
from tests.support.waiting import wait_until_async

WAIT = 10.0


@pytest.fixture
def network(dafka_config: Config, tower: Tower) -> Iterator[tuple[Config, Store]]:
    store = Store(dafka_config, zmq.Context.instance())
    try:
        yield dafka_config, store
    finally:
        store.close()


def admin_on(config: Config, timeout: float = 5.0) -> DafkaAdmin:
    return DafkaAdmin(settings_for(config), EngineOptions(metadata_timeout=timeout))


def run(coroutine: object) -> None:
    asyncio.run(asyncio.wait_for(coroutine, 60))  # type: ignore[arg-type]


async def produce_keys(engine: DafkaEngine, topic: str, keys: int) -> None:
    producer = engine.producer("s")
    for key in range(keys):
        producer.produce(topic, b"key-%d" % key, b"value-%d" % key)
    assert await producer.flush(WAIT) == 0, "records not durable"


def test_created_partitions_are_used_by_running_and_new_gateways(
    network: tuple[Config, Store],
) -> None:
    config, _ = network

    async def body() -> None:
        async with engine_on(config) as before:
            assert before.partition_count("orders") == 2, "the settings' count (partitions 2)"
            async with admin_on(config) as admin:
                await admin.create_topic("orders", 5, {"retention.ms": "3600000"})
                assert "orders" in await admin.list_topics()
                with pytest.raises(TopicExistsError, match="'orders' already exists"):
                    await admin.create_topic("orders", 3, {})
            await wait_until_async(
                lambda: before.partition_count("orders") == 5,
                WAIT,
                "the running gateway did not follow the catalog",
            )
            async with engine_on(config, node=1) as after:
                assert after.partition_count("orders") == 5
                await produce_keys(before, "orders", 40)
                await produce_keys(after, "orders", 40)
                member = await before.consumer("g", "m", ["orders"], {})
                records = await take(member, 80)
                await member.close()
        numbers = {record.partition for record in records}
        # Node 0 writes partitions 0..4, node 1 writes 5..9: 5 each, as created.
        assert {n for n in numbers if n < 5} == set(range(5))
        assert {n for n in numbers if n >= 5} == set(range(5, 10))

    run(body())


def test_a_topic_deleted_and_created_again_is_written_with_its_new_count(
    network: tuple[Config, Store],
) -> None:
    """A gateway that produced to a topic before (under the settings' count) spreads its
    records over the count the topic is created with after its deletion: each key to the
    partition the partitioner picks among the new count, the keys written before too."""
    config, _ = network

    async def body() -> None:
        async with admin_on(config) as admin, engine_on(config, partitions=1) as engine:
            await produce_keys(engine, "phoenix", 3)
            await admin.delete_topic("phoenix")
            await admin.create_topic("phoenix", 3, {})
            await wait_until_async(
                lambda: engine.partition_count("phoenix") == 3,
                WAIT,
                "the gateway did not follow the catalog",
            )
            await produce_keys(engine, "phoenix", 30)
            member = await engine.consumer("g", "m", ["phoenix"], {})
            records = await take(member, 30)
            await member.close()
        assert {record.partition for record in records} == {0, 1, 2}
        partition = make_partitioner("consistent_random")  # the settings' partitioner
        for record in records:
            assert record.key is not None
            assert record.partition == partition(record.key, 3), record

    run(body())


def test_describe_shows_offsets_retention_and_group_lag(network: tuple[Config, Store]) -> None:
    config, _ = network

    async def body() -> None:
        async with admin_on(config) as admin:
            await admin.create_topic("lagging", 1, {"retention.bytes": "1000000"})
            async with engine_on(config) as engine:
                await wait_until_async(
                    lambda: engine.partition_count("lagging") == 1, WAIT, "catalog not followed"
                )
                await produce_keys(engine, "lagging", 12)
                member = await engine.consumer("billing", "m", ["lagging"], {})
                await take(member, 10)
                await member.close()  # commits 10
            described = await admin.describe("lagging")
            # Several at once (the gateway's metrics), a topic that does not exist left out.
            assert await admin.describe_many(["lagging", "never-made"]) == [described]
        assert described.partitions == (TopicPartitionOffsets(0, 0, 12),)
        assert described.config["retention.bytes"] == "1000000"
        assert described.groups == (GroupOffsets("billing", 0, 10, 2),)

    run(body())


def test_delete_removes_records_offsets_and_the_topic(network: tuple[Config, Store]) -> None:
    config, store = network

    async def body() -> None:
        async with admin_on(config) as admin:
            async with engine_on(config, partitions=1) as engine:
                await produce_keys(engine, "doomed", 5)
                member = await engine.consumer("g", "m", ["doomed"], {})
                await take(member, 5)
                await member.close()
                assert "doomed" in await engine.topics()
                await admin.delete_topic("doomed")
                assert list(store.storage.read(b"doomed", _address(engine), 0, 10)) == []
                assert "doomed" not in await admin.list_topics()
                await wait_until_async(
                    lambda: engine.offsets.committed("g", "doomed") == {},
                    WAIT,
                    "the gateway kept the deleted topic's offsets",
                )
                assert "doomed" not in await engine.topics()
                with pytest.raises(UnknownTopicError):
                    await admin.describe("doomed")
                with pytest.raises(UnknownTopicError):
                    await admin.delete_topic("doomed")
                # Written again: it is back, its offsets continue, a group reads it anew.
                await produce_keys(engine, "doomed", 2)
                member = await engine.consumer("g", "m", ["doomed"], {})
                again = await take(member, 2)
                await member.close()
            assert [record.offset for record in again] == [5, 6]
            described = await admin.describe("doomed")
            assert described.partitions == (TopicPartitionOffsets(0, 5, 7),)
            await admin.create_topic("reborn", 2, {})
            await admin.delete_topic("reborn")
            await admin.create_topic("reborn", 3, {})
            reborn = await admin.describe("reborn")
            assert reborn.partitions[-1] == TopicPartitionOffsets(2, 0, 0)
            # The commits before the deletion stay forgotten when described together.
            assert await admin.describe_many(["doomed", "reborn"]) == [
                await admin.describe("doomed"),
                reborn,
            ]

    run(body())


def _address(engine: DafkaEngine) -> bytes:
    return engine.writer("doomed", 0).address.encode()


def test_bad_input_and_an_unreachable_network(network: tuple[Config, Store]) -> None:
    config, _ = network

    async def body() -> None:
        async with admin_on(config) as admin:
            with pytest.raises(AdminError, match="not supported on Dafka"):
                await admin.create_topic("t", 1, {"cleanup.policy": "compact"})
            with pytest.raises(AdminError, match="integer >= -1"):
                await admin.create_topic("t", 1, {"retention.ms": "soon"})
            with pytest.raises(AdminError, match=r"partitions must be 1\.\.1024"):
                await admin.create_topic("t", 0, {})
            with pytest.raises(AdminError, match="Rafka's own"):
                await admin.create_topic("__rafka_offsets", 1, {})
            with pytest.raises(UnknownTopicError, match="'nothing' does not exist"):
                await admin.describe("nothing")
            assert await admin.list_topics() == [], "bad input created nothing"
        nowhere = dataclasses.replace(
            settings_for(config),
            tower_sub_address="tcp://127.0.0.1:1",
            tower_pub_address="tcp://127.0.0.1:2",
            settings={"beacon/address": "127.0.0.1"},
        )
        async with DafkaAdmin(nowhere, EngineOptions(metadata_timeout=0.5)) as lost:
            with pytest.raises(AdminError, match=r"cannot reach .*tcp://127\.0\.0\.1:1"):
                await lost.list_topics()

    run(body())
