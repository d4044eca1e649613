"""The engine interface's reads by offset (`Engine.partition_offsets`, `Engine.read`; the
gateway's LLEN and LRANGE), run on every engine as test_contract.py: they answer the
records of a range and belong to no consumer group."""

from __future__ import annotations

import pytest

from backends.base import Engine, PartitionOffsets, ReadError, UnknownPartitionError
from tests.support.consuming import WAIT, asyncio_test, consume, new_group, produce_all
from tests.support.engines import EngineFactory


async def partition_of(engine: Engine, topic: str, partitions: int) -> tuple[int, int]:
    """(the partition holding records, one holding none) of a topic whose records all
    share one key."""
    nexts = {p: (await engine.partition_offsets(topic, p)).next for p in range(partitions)}
    full = [p for p, following in nexts.items() if following]
    empty = [p for p, following in nexts.items() if not following]
    assert len(full) == 1 and empty, f"next offsets per partition: {nexts}"
    return full[0], empty[0]


@asyncio_test
async def test_reads_by_offset_answer_the_records_of_a_range(
    engine_factory: EngineFactory,
) -> None:
    topic = engine_factory.new_topic(2)
    values = [b"v%d" % n for n in range(12)]
    async with engine_factory.running() as engine:
        # Several batches: the last one holds several records (Tansu's high watermark
        # is then too low; the engine must not believe it).
        await produce_all(engine, topic, [(b"one-key", v) for v in values[:5]])
        handle = engine.producer("batch")
        assert handle.produce_many(topic, b"one-key", values[5:]) == 7
        assert await handle.flush(WAIT) == 0
        await handle.close(WAIT)
        full, empty = await partition_of(engine, topic, 2)
        assert await engine.partition_offsets(topic, full) == PartitionOffsets(first=0, next=12)
        assert await engine.partition_offsets(topic, empty) == PartitionOffsets(first=0, next=0)

        everything = await engine.read(topic, full, 0, 11, 100)
        assert [r.value for r in everything] == values
        assert [r.offset for r in everything] == list(range(12))
        assert {(r.topic, r.partition, r.key) for r in everything} == {(topic, full, b"one-key")}
        assert all(r.timestamp_ms is None or r.timestamp_ms > 0 for r in everything)

        middle = await engine.read(topic, full, 3, 7, 100)
        assert [(r.offset, r.value) for r in middle] == [(n, values[n]) for n in range(3, 8)]
        one = await engine.read(topic, full, 11, 11, 100)
        assert [(r.offset, r.value) for r in one] == [(11, b"v11")]
        limited = await engine.read(topic, full, 2, 11, 4)
        assert [r.offset for r in limited] == [2, 3, 4, 5], "limit: the first ones"
        past_head = await engine.read(topic, full, 9, 1000, 100)
        assert [r.offset for r in past_head] == [9, 10, 11], "a range past the head"
        assert await engine.read(topic, full, 12, 20, 100) == [], "nothing at the head yet"
        assert await engine.read(topic, full, 5, 4, 100) == [], "start > stop"
        assert await engine.read(topic, empty, 0, 10, 100) == [], "an empty partition"

        # The log grows: the next offset follows, earlier answers stay the same.
        await produce_all(engine, topic, [(b"one-key", b"v12")])
        assert await engine.partition_offsets(topic, full) == PartitionOffsets(first=0, next=13)
        assert [r.value for r in await engine.read(topic, full, 11, 12, 100)] == [b"v11", b"v12"]
        assert await engine.read(topic, full, 0, 11, 100) == everything


@asyncio_test
async def test_reads_of_unknown_topics_and_partitions_are_refused(
    engine_factory: EngineFactory,
) -> None:
    topic = engine_factory.new_topic(2)
    async with engine_factory.running() as engine:
        for where in ((topic, 2), (topic, 99), ("no-such-topic-" + new_group(), 0)):
            with pytest.raises(UnknownPartitionError):
                await engine.partition_offsets(*where)
            with pytest.raises(UnknownPartitionError):
                await engine.read(*where, 0, 10, 10)
        assert await engine.partition_offsets(topic, 1) == PartitionOffsets(0, 0), "still answers"
    with pytest.raises(ReadError):
        await engine.partition_offsets(topic, 0)  # stopped
    with pytest.raises(ReadError):
        await engine.read(topic, 0, 0, 0, 1)


@asyncio_test
async def test_reads_by_offset_move_no_group_position_nor_commit(
    engine_factory: EngineFactory,
) -> None:
    topic, group = engine_factory.new_topic(1), new_group()
    values = [b"r%d" % n for n in range(6)]
    async with engine_factory.running() as engine:
        await produce_all(engine, topic, [(None, v) for v in values])
        member = await engine.consumer(group, "c1", [topic], {})
        taken = await consume(member, 3, ack=True)
        assert [r.value for r in taken] == values[:3]
        # Reads while the member holds the partition, over its position and past it.
        for _ in range(2):
            assert (await engine.partition_offsets(topic, 0)).next == 6
            assert [r.value for r in await engine.read(topic, 0, 0, 5, 100)] == values
            assert [r.value for r in await engine.read(topic, 0, 4, 5, 100)] == values[4:]
        [fourth] = await consume(member, 1)  # not acked
        assert fourth.value == b"r3", "the member's position moved"
        await member.close()
        assert [r.value for r in await engine.read(topic, 0, 2, 3, 100)] == [b"r2", b"r3"]
        # The group's committed offset is still the acked one: a new member starts there.
        successor = await engine.consumer(group, "c2", [topic], {})
        again = await consume(successor, 3)
        assert [r.value for r in again] == values[3:], "the committed offset moved"
        await successor.close()
        # A group that never consumed starts from the beginning, reads or not.
        stranger = await engine.consumer(new_group(), "c3", [topic], {})
        assert [r.value for r in await consume(stranger, 6)] == values
        await stranger.close()
