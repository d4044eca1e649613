"""The Kafka producer's batched path (backends.kafka.pending) against a real Tansu broker:
records accepted in one loop pass reach librdkafka together, and nothing a user sees of
produce() changes: refusals at once with the same texts and counts, order, DUMP, stop.
"""

from __future__ import annotations

import pytest

from backends.base import ProduceError, QueueFullError, Stats
from backends.kafka.engine import KafkaEngine
from backends.kafka.producer import ProducerHandle
from backends.kafka.sticky import UNASSIGNED, StickyPartitions
from tests.support.consuming import WAIT, asyncio_test, consume, new_group
from tests.support.kafka import running_engine
from tests.support.tansu import TansuBroker
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.kafka


async def known(engine: KafkaEngine, handle: ProducerHandle, topic: str) -> None:
    """Deliver one record to `topic`, after which its records take the batched path (a
    topic not known yet goes through produce() alone: librdkafka refuses a missing topic
    there); checked, else these tests would test the path of one produce() per record."""
    handle.produce(topic, None, b"first")
    assert await handle.flush(WAIT) == 0
    assert topic in engine._shared_producer().pending.known, "the topic was not learned"


@asyncio_test
async def test_a_full_queue_refuses_batched_records_at_once_and_keeps_order(
    tansu: TansuBroker,
) -> None:
    topic = tansu.create_topic(1)
    # Room for 3 records, held 1 s: the calls below all find the queue as they left it.
    small = {"queue.buffering.max.messages": "3", "queue.buffering.max.ms": "1000"}
    async with running_engine(tansu.bootstrap, producer=small) as engine:
        handle = engine.producer("s")
        await known(engine, handle, topic)
        with pytest.raises(QueueFullError) as full:
            handle.produce_many(topic, None, [b"a", b"b", b"c", b"d", b"e"])
        assert str(full.value) == "Local: Queue full"
        assert full.value.enqueued == 3, "the values before the refused one stay queued"
        with pytest.raises(QueueFullError, match=r"^Local: Queue full$"):
            handle.produce(topic, None, b"f")
        assert engine.stats.get(Stats.PRODUCED) == 4
        assert handle.outstanding() == 3
        assert await handle.flush(WAIT) == 0, "DUMP answered before the records were delivered"
        assert engine.stats.get(Stats.DELIVERED) == 4
        # Room again: accepted, and after the others.
        handle.produce(topic, None, b"g")
        assert await handle.flush(WAIT) == 0
        consumer = await engine.consumer(new_group(), "c1", [topic], {})
        got = [record.value for record in await consume(consumer, 5)]
        assert got == [b"first", b"a", b"b", b"c", b"g"]
        await consumer.close()
        await handle.close(1)


@asyncio_test
async def test_records_of_many_handles_keep_their_order_and_flushes(tansu: TansuBroker) -> None:
    topic = tansu.create_topic(1)
    async with running_engine(tansu.bootstrap) as engine:
        first, second = engine.producer("s1"), engine.producer("s2")
        await known(engine, first, topic)
        # One pass: both handles' records interleaved, single and many values.
        for i in range(50):
            first.produce(topic, None, b"1-%d" % i)
            second.produce_many(topic, None, [b"2-%d-a" % i, b"2-%d-b" % i])
        assert first.outstanding() == 50 and second.outstanding() == 100
        assert engine.stats.get(Stats.PRODUCED) == 151, "records counted when accepted"
        assert await second.flush(WAIT) == 0
        assert second.outstanding() == 0
        assert await first.flush(WAIT) == 0
        assert engine.stats.get(Stats.DELIVERED) == 151
        consumer = await engine.consumer(new_group(), "c1", [topic], {})
        got = [record.value or b"" for record in await consume(consumer, 151)]
        await consumer.close()
        assert got[0] == b"first"
        assert [v for v in got if v.startswith(b"1-")] == [b"1-%d" % i for i in range(50)]
        expected = [v for i in range(50) for v in (b"2-%d-a" % i, b"2-%d-b" % i)]
        assert [v for v in got if v.startswith(b"2-")] == expected


@asyncio_test
async def test_records_accepted_just_before_stop_are_delivered(tansu: TansuBroker) -> None:
    topic = tansu.create_topic(1)
    async with running_engine(tansu.bootstrap) as engine:
        handle = engine.producer("s")
        await known(engine, handle, topic)
        handle.produce_many(topic, None, [b"last-%d" % i for i in range(20)])
        # No DUMP, no loop pass: the engine stops at once, with them still deferred.
    assert engine.stats.get(Stats.DELIVERED) == 21
    async with running_engine(tansu.bootstrap) as reader:
        consumer = await reader.consumer(new_group(), "c1", [topic], {})
        got = [record.value for record in await consume(consumer, 21)]
        await consumer.close()
    assert got == [b"first", *(b"last-%d" % i for i in range(20))]


@asyncio_test
async def test_a_handle_outliving_the_engine_is_refused_on_a_known_topic(
    tansu: TansuBroker,
) -> None:
    """As tests/kafka/test_engine.py's, on a topic whose records would be batched: still
    refused at once, not accepted and lost."""
    topic = tansu.create_topic()
    async with running_engine(tansu.bootstrap) as engine:
        handle = engine.producer("s")
        await known(engine, handle, topic)
    with pytest.raises(ProduceError, match="Producer has been closed"):
        handle.produce(topic, None, b"x")
    with pytest.raises(ProduceError, match="Producer has been closed"):
        handle.produce_many(topic, None, [b"y", b"z"])
    assert handle.outstanding() == 0, "refused records must not stay outstanding"
    assert engine.stats.get(Stats.PRODUCED) == 1
    assert engine.stats.get(Stats.DELIVERY_ERRORS) == 0


@asyncio_test
async def test_grouped_runs_are_deferred_whole_or_declined(tansu: TansuBroker) -> None:
    """produce_grouped (a pipeline round-robin over topics, its values gathered by topic)
    takes every run at once on topics librdkafka knows, with room for all; it takes none
    when a topic is not known yet (librdkafka may refuse it at produce() time) or when
    the queue has room for only some: the gateway then produces them in order, and the
    one refused says where."""
    first, second, unknown = tansu.create_topic(1), tansu.create_topic(1), tansu.create_topic(1)
    # Room for 4 records, held 1 s: the calls below all find the queue as they left it.
    small = {"queue.buffering.max.messages": "4", "queue.buffering.max.ms": "1000"}
    async with running_engine(tansu.bootstrap, producer=small) as engine:
        handle = engine.producer("s")
        await known(engine, handle, first)
        await known(engine, handle, second)
        assert not handle.produce_grouped([(first, None, [b"x"]), (unknown, None, [b"y"])])
        assert not handle.produce_grouped(
            [(first, None, [b"a0", b"a1", b"a2"]), (second, b"k", [b"b0", b"b1"])]
        ), "5 records taken where librdkafka has room for 4"
        assert engine.stats.get(Stats.PRODUCED) == 2, "declined, yet records went in"
        assert handle.outstanding() == 0
        assert handle.produce_grouped([(first, None, [b"a0", b"a1"]), (second, b"k", [b"b0"])])
        assert engine.stats.get(Stats.PRODUCED) == 5
        assert handle.outstanding() == 3
        assert await handle.flush(WAIT) == 0, "DUMP answered before the records were delivered"
        assert engine.stats.get(Stats.DELIVERED) == 5
        for topic, expected in ((first, [b"first", b"a0", b"a1"]), (second, [b"first", b"b0"])):
            consumer = await engine.consumer(new_group(), "c1", [topic], {})
            records = await consume(consumer, len(expected))
            await consumer.close()
            assert [r.value for r in records] == expected
        assert records[1].key == b"k"
        await handle.close(1)


def sticky_of(engine: KafkaEngine) -> StickyPartitions:
    return engine._shared_producer().pending.sticky


@asyncio_test
async def test_keyless_batches_go_to_the_partition_learned_while_it_sticks(
    tansu: TansuBroker,
) -> None:
    """Keyless records handed over together go with the partition learned for the topic,
    for as long as librdkafka's own choice would stick (sticky.partitioning.linger.ms, a
    minute here), in order. librdkafka would keep them on the partition of the topic's
    first record for that minute; the one learned is set by hand to another, so that only
    the learned partition can put them there."""
    topic = tansu.create_topic(4)
    sticky = {"sticky.partitioning.linger.ms": "60000"}
    async with running_engine(tansu.bootstrap, producer=sticky) as engine:
        handle = engine.producer("s")
        await known(engine, handle, topic)
        consumer = await engine.consumer(new_group(), "c1", [topic], {})
        [first] = await consume(consumer, 1)
        learned = (first.partition + 1) % 4
        sticky_of(engine).learn(topic, learned)
        sent = []
        for batch in range(5):
            values = [b"%d-%d" % (batch, i) for i in range(10)]
            handle.produce_many(topic, None, values)
            sent.extend(values)
            assert await handle.flush(WAIT) == 0
        records = await consume(consumer, 50)
        await consumer.close()
        assert {r.partition for r in records} == {learned}
        assert [r.value for r in records] == sent


@asyncio_test
async def test_an_unassigned_batch_teaches_the_partition_librdkafka_chose(
    tansu: TansuBroker,
) -> None:
    topic = tansu.create_topic(4)
    sticky = {"sticky.partitioning.linger.ms": "60000"}
    async with running_engine(tansu.bootstrap, producer=sticky) as engine:
        handle = engine.producer("s")
        await known(engine, handle, topic)
        assert sticky_of(engine).partition(topic) == UNASSIGNED
        handle.produce_many(topic, None, [b"a", b"b"])
        assert await handle.flush(WAIT) == 0
        learned = sticky_of(engine).partition(topic)
        consumer = await engine.consumer(new_group(), "c1", [topic], {})
        records = await consume(consumer, 3)
        await consumer.close()
        assert learned == records[-1].partition, "not where librdkafka put the batch"


@asyncio_test
async def test_keyless_batches_move_on_when_librdkafka_would_choose_again(
    tansu: TansuBroker,
) -> None:
    """With a linger of 1 ms, librdkafka chooses again for the batch after each: a
    stream of keyless batches spreads over the topic's partitions, instead of staying on
    the first one learned. (librdkafka chooses at random among 4: all 30 choices alike
    would happen once in 4**29 runs.)"""
    topic = tansu.create_topic(4)
    async with running_engine(
        tansu.bootstrap, producer={"sticky.partitioning.linger.ms": "1"}
    ) as engine:
        handle = engine.producer("s")
        await known(engine, handle, topic)
        for batch in range(30):
            handle.produce_many(topic, None, [b"%d-%d" % (batch, i) for i in range(5)])
            assert await handle.flush(WAIT) == 0
            # The next batch after the learned partition's linger (librdkafka's, begun
            # before that was learned, has ended too).
            await wait_until_async(
                lambda: sticky_of(engine).partition(topic) == UNASSIGNED,
                WAIT,
                "the learned partition's linger to end",
                interval=0.001,
            )
        consumer = await engine.consumer(new_group(), "c1", [topic], {})
        records = [r for r in await consume(consumer, 151) if r.value != b"first"]
        await consumer.close()
        assert len({r.partition for r in records}) >= 2, "every batch stayed on one partition"


@asyncio_test
async def test_records_refused_on_a_partition_learned_before_go_where_librdkafka_puts_them(
    tansu: TansuBroker,
) -> None:
    """A partition learned that the topic no longer has (recreated with fewer: that
    cannot be staged against a broker within one linger, so the learned partition is set
    by hand, a mock of that failure): librdkafka refuses it at once, and the records go
    where its partitioner puts them, all delivered, none counted as failed."""
    topic = tansu.create_topic(2)
    sticky = {"sticky.partitioning.linger.ms": "60000"}
    async with running_engine(tansu.bootstrap, producer=sticky) as engine:
        handle = engine.producer("s")
        await known(engine, handle, topic)
        sticky_of(engine).learn(topic, 7)
        values = [b"v-%d" % i for i in range(10)]
        assert handle.produce_many(topic, None, values) == 10
        assert await handle.flush(WAIT) == 0
        assert engine.stats.get(Stats.DELIVERED) == 11
        assert engine.stats.get(Stats.DELIVERY_ERRORS) == 0
        assert sticky_of(engine).partition(topic) in (0, 1), "librdkafka's choice, learned"
        consumer = await engine.consumer(new_group(), "c1", [topic], {})
        records = await consume(consumer, 11)
        await consumer.close()
        assert sorted(r.value or b"" for r in records) == sorted([b"first", *values])
        assert {r.partition for r in records} <= {0, 1}
