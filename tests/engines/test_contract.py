"""The engine interface's contract (backends/base.py), run on every engine.

Each test runs once per engine of tests.support.engines.FACTORIES: Kafka on the
session's Tansu broker, the in-memory engine, and whichever engine is added there. They
check what base.py promises and what a client would see through the gateway, never an
engine's error texts or timing: group joins take about a second on Kafka, so every wait
is bounded by WAIT and says what did not happen.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from backends.base import (
    AckError,
    Consumer,
    ConsumerCreationError,
    Engine,
    MetadataError,
    ProduceError,
    ProducerCreationError,
    Record,
    Stats,
)
from tests.support.consuming import (
    WAIT,
    Keyed,
    asyncio_test,
    by_partition,
    consume,
    new_group,
    produce_all,
    timed,
)
from tests.support.engines import EngineFactory

PARTITION_LIMIT = 2**31
KEYS = [f"k{i}".encode() for i in range(8)]  # spread over the partitions of a topic
# Acks during an in-flight next(): made for ACKING seconds, ACK_PACE apart, and each must
# return within PROMPT_ACK (they only record an offset; a poll slice is 0.1 s on Kafka).
ACKING, ACK_PACE, PROMPT_ACK = 0.5, 0.02, 0.25


@asyncio_test
async def test_topics_lists_each_topic_once(engine_factory: EngineFactory) -> None:
    topic = engine_factory.new_topic(2)
    async with engine_factory.running() as engine:
        await produce_all(engine, topic, [(None, b"x")])
        names = await engine.topics()
        assert topic in names
        assert len(names) == len(set(names)), f"a topic listed twice: {names}"


@asyncio_test
async def test_producing_counts_each_record_once_and_flush_waits_for_them(
    engine_factory: EngineFactory,
) -> None:
    topic = engine_factory.new_topic(1)  # one partition: the log order is the produce order
    async with engine_factory.running() as engine:
        handle = engine.producer("s")
        first = [f"a{i}".encode() for i in range(300)]
        second = [f"b{i}".encode() for i in range(5)]
        assert handle.produce_many(topic, b"k", first) == 300
        assert handle.produce_many(topic, None, []) == 0
        handle.produce(topic, None, b"single")
        assert handle.produce_many(topic, None, second) == 5
        assert engine.stats.get(Stats.PRODUCED) == 306
        assert 0 <= handle.outstanding() <= 306
        left, elapsed = await timed(handle.flush(0))
        assert 0 <= left <= 306
        assert elapsed < 0.5, f"flush(0) waited {elapsed:.2f}s"
        assert await handle.flush(WAIT) == 0
        assert handle.outstanding() == 0
        assert engine.stats.get(Stats.DELIVERED) == 306
        assert engine.stats.get(Stats.DELIVERY_ERRORS) == 0

        consumer = await engine.consumer(new_group(), "c1", [topic], {})
        records = await consume(consumer, 306)
        assert [r.value for r in records] == [*first, b"single", *second]
        assert [r.key for r in records] == [b"k"] * 300 + [None] * 6
        assert engine.stats.get(Stats.CONSUMED) == 306
        await consumer.close()

        assert await handle.close(WAIT) == 0
        assert await handle.close(WAIT) == 0, "a second close returns 0 at once"
        with pytest.raises(ProduceError):
            handle.produce(topic, None, b"late")
        with pytest.raises(ProduceError):
            handle.produce_many(topic, None, [b"later"])
        assert engine.stats.get(Stats.PRODUCED) == 306
        assert engine.stats.get(Stats.UNFLUSHED) == 0


async def read_back(engine: Engine, expected: list[tuple[str, list[bytes], bytes | None]]) -> None:
    """Each (topic, values, key) of `expected`, read by a group of its own: exactly those
    values in order, each with that key, none delivered twice."""
    for topic, values, key in expected:
        consumer = await engine.consumer(new_group(), "c1", [topic], {})
        records = await consume(consumer, len(values))
        assert [r.value for r in records] == values, topic
        assert {r.key for r in records} == {key}, topic
        assert await consumer.next(0.3) is None, "a record was delivered twice"
        await consumer.close()


@asyncio_test
async def test_produce_runs_enqueues_each_run_as_produce_many_would(
    engine_factory: EngineFactory,
) -> None:
    """The runs of a pipeline over several topics in one call (what the gateway does
    with pipelined RPUSHX): every value once, in its run's order within each topic and
    key, keyed or not, counted once; values that look like an engine's own framing come
    back as they were sent."""
    first, second = engine_factory.new_topic(1), engine_factory.new_topic(1)
    framed = b"\xffRK\x01 looks like a Dafka envelope"
    runs: list[tuple[str, bytes | None, list[bytes]]] = [
        (first, None, [b"a0", b"a1"]),
        (second, b"k", [b"b0"]),
        (first, None, [framed]),
        (second, b"k", [b"b1", b"b2"]),
        (first, None, [b"a2"]),
    ]
    async with engine_factory.running() as engine:
        handle = engine.producer("s")
        assert handle.produce_runs(runs) == 7
        assert handle.produce_runs([]) == 0
        assert engine.stats.get(Stats.PRODUCED) == 7
        assert await handle.flush(WAIT) == 0
        assert engine.stats.get(Stats.DELIVERED) == 7, "flush returned before all were stored"
        await read_back(
            engine,
            [(first, [b"a0", b"a1", framed, b"a2"], None), (second, [b"b0", b"b1", b"b2"], b"k")],
        )
        await handle.close(WAIT)
        with pytest.raises(ProduceError) as refused:
            handle.produce_runs(runs)
        assert refused.value.enqueued == 0, "a closed handle takes none"


@asyncio_test
async def test_produce_grouped_enqueues_all_of_its_runs_or_none(
    engine_factory: EngineFactory,
) -> None:
    """Runs each to a topic of its own (a pipeline round-robin over topics, its values
    gathered by topic): taken all together, each topic's values in order and counted
    once, or none taken at all (an engine may always decline: the gateway then produces
    them in order). A closed handle takes none."""
    first, second = engine_factory.new_topic(1), engine_factory.new_topic(1)
    framed = b"\xffRK\x01 looks like a Dafka envelope"
    runs: list[tuple[str, bytes | None, list[bytes]]] = [
        (first, None, [b"a0", framed, b"a1"]),
        (second, b"k", [b"b0", b"b1"]),
    ]
    async with engine_factory.running() as engine:
        handle = engine.producer("s")
        if not handle.produce_grouped(runs):
            assert engine.stats.get(Stats.PRODUCED) == 0, "declined, yet records went in"
            assert handle.outstanding() == 0
        else:
            assert engine.stats.get(Stats.PRODUCED) == 5
            assert await handle.flush(WAIT) == 0
            assert engine.stats.get(Stats.DELIVERED) == 5, "flush returned before all were stored"
            await read_back(
                engine, [(first, [b"a0", framed, b"a1"], None), (second, [b"b0", b"b1"], b"k")]
            )
        produced = engine.stats.get(Stats.PRODUCED)
        await handle.close(WAIT)
        assert handle.produce_grouped(runs) is False, "a closed handle takes none"
        assert engine.stats.get(Stats.PRODUCED) == produced


@asyncio_test
async def test_keyed_records_share_a_partition_and_offsets_count_up_by_one(
    engine_factory: EngineFactory,
) -> None:
    topic = engine_factory.new_topic(4)
    keyed = [(key, key + b"-%d" % n) for n in range(5) for key in KEYS]
    plain: list[Keyed] = [(None, b"plain-%d" % n) for n in range(10)]
    async with engine_factory.running() as engine:
        await produce_all(engine, topic, [*keyed, *plain])
        consumer = await engine.consumer(new_group(), "c1", [topic], {})
        records = await consume(consumer, 50)
        assert await consumer.next(0.3) is None, "a record was delivered twice"
        assert sorted(r.value or b"" for r in records) == sorted(v for _, v in keyed + plain)
        for record in records:
            assert record.topic == topic
            assert 0 <= record.partition < PARTITION_LIMIT, record
            assert record.offset >= 0, record
            assert record.timestamp_ms is None or record.timestamp_ms > 0, record
        for key in KEYS:
            mine = [r for r in records if r.key == key]
            assert len({r.partition for r in mine}) == 1, f"key {key!r} on several partitions"
            assert [r.value for r in mine] == [v for k, v in keyed if k == key], "key order"
        for partition, handed_out in by_partition(records).items():
            offsets = [r.offset for r in handed_out]
            expected = list(range(offsets[0], offsets[0] + len(offsets)))
            assert offsets == expected, f"partition {partition}: offsets {offsets}"
        assert len(by_partition([r for r in records if r.key])) >= 2, "no spreading by key"
        assert engine.stats.get(Stats.CONSUMED) == 50

        first = records[0]
        consumer.ack(first.topic, first.partition, first.offset)
        assert engine.stats.get(Stats.ACKED) == 1
        with pytest.raises(AckError):
            consumer.ack(topic, 99, 0)  # the topic has no partition 99
        assert engine.stats.get(Stats.ACKED) == 1, "a refused ack was counted"

        await consumer.close()
        await consumer.close()  # idempotent
        assert engine.stats.get(Stats.COMMITTED) >= 1, "close did not commit the acked offset"
        with pytest.raises(AckError):
            consumer.ack(first.topic, first.partition, first.offset)
        assert await consumer.next(None) is None, "a closed consumer returns nothing"


@asyncio_test
async def test_acks_are_committed_on_close_and_unacked_records_come_back(
    engine_factory: EngineFactory,
) -> None:
    topic, elsewhere = engine_factory.new_topic(1), engine_factory.new_topic(1)
    group = new_group()
    async with engine_factory.running() as engine:
        await produce_all(engine, topic, [(None, b"foo")])
        first = await engine.consumer(group, "c1", [topic], {})
        [foo] = await consume(first, 1, ack=True)
        assert foo.value == b"foo"
        await first.close()
        assert engine.stats.get(Stats.COMMITTED) == 1

        await produce_all(engine, topic, [(None, b"bar")])
        await produce_all(engine, elsewhere, [(None, b"baz")])
        # A new member of the group resumes after the acked offset (spec E7); another
        # group, here on two topics, gets every record from the start.
        second, other = await asyncio.gather(
            engine.consumer(group, "c2", [topic], {}),
            engine.consumer(new_group(), "c3", [topic, elsewhere], {}),
        )
        [bar] = await consume(second, 1)  # not acked
        assert (bar.value, bar.partition, bar.offset) == (b"bar", foo.partition, foo.offset + 1)
        assert sorted(r.value or b"" for r in await consume(other, 3)) == [b"bar", b"baz", b"foo"]
        await asyncio.gather(second.close(), other.close())

        # `bar` was never acked: the group delivers it again, and only it (spec E13).
        third = await engine.consumer(group, "c4", [topic], {})
        [again] = await consume(third, 1)
        assert (again.value, again.offset) == (b"bar", bar.offset)
        assert await third.next(0.3) is None
        await third.close()


@asyncio_test
async def test_a_group_shares_partitions_and_a_leaving_member_hands_its_records_over(
    engine_factory: EngineFactory,
) -> None:
    topic, group = engine_factory.new_topic(4), new_group()
    produced: set[bytes] = set()
    seen: dict[str, list[Record]] = {"c1": [], "c2": []}

    async def produce_round(engine: Engine, tag: str) -> set[bytes]:
        values = {b"%s-%s" % (tag.encode(), key) for key in KEYS}
        await produce_all(engine, topic, [(v.rsplit(b"-", 1)[1], v) for v in values])
        produced.update(values)
        return values

    async def take(name: str, consumer: Consumer, timeout: float, ack: bool = True) -> None:
        record = await consumer.next(timeout)
        if record is not None:
            if ack:
                consumer.ack(record.topic, record.partition, record.offset)
            seen[name].append(record)

    def values(name: str) -> set[bytes]:
        return {r.value or b"" for r in seen[name]}

    async with engine_factory.running() as engine:
        await produce_round(engine, "warmup")
        c1 = await engine.consumer(group, "c1", [topic], {})
        await take("c1", c1, WAIT)  # c1 has joined and owns every partition
        c2 = await engine.consumer(group, "c2", [topic], {})
        # Both poll (a Kafka rebalance needs c1 to poll too) while records keep coming,
        # until c2 has partitions of its own.
        deadline = time.monotonic() + 3 * WAIT
        rounds = 0
        while not seen["c2"]:
            assert time.monotonic() < deadline, f"c2 never got a partition; c1: {values('c1')}"
            await produce_round(engine, f"round{rounds}")
            rounds += 1
            await asyncio.gather(take("c1", c1, 0.3), take("c2", c2, 0.3))
        while values("c1") | values("c2") != produced:
            lost = produced - values("c1") - values("c2")
            assert time.monotonic() < deadline, f"records lost: {sorted(lost)}"
            await asyncio.gather(take("c1", c1, 0.2), take("c2", c2, 0.2))
        # Acked records come back only if a rebalance raced a commit (spec E8).
        duplicates = len(seen["c1"]) + len(seen["c2"]) - len(produced)
        assert duplicates <= len(KEYS), f"{duplicates} records delivered twice"

        # c1 takes records of its partitions and leaves without acking them: the group
        # hands its partitions to c2 from the committed offsets, so c2 gets every record
        # of the round, those c1 had taken included.
        last = await produce_round(engine, "last")
        unacked: list[Record] = []
        deadline = time.monotonic() + WAIT
        while not unacked:
            assert time.monotonic() < deadline, "c1 got none of the last records"
            await take("c1", c1, 0.3, ack=False)
            unacked = [r for r in seen["c1"] if r.value in last]
        await c1.close()
        deadline = time.monotonic() + 3 * WAIT
        while not last <= values("c2"):
            missing = sorted(last - values("c2"))
            assert time.monotonic() < deadline, f"c2 never got {missing} (c1 took {unacked})"
            await take("c2", c2, 0.2)
        await c2.close()


@asyncio_test
async def test_next_times_out_and_a_cancelled_next_loses_no_record(
    engine_factory: EngineFactory,
) -> None:
    topic = engine_factory.new_topic(1)
    async with engine_factory.running() as engine:
        consumer = await engine.consumer(new_group(), "c", [topic], {})
        record, elapsed = await timed(consumer.next(0.3))
        assert record is None
        assert 0.3 <= elapsed < 2, f"next(0.3) took {elapsed:.2f}s"
        record, elapsed = await timed(consumer.next(0))
        assert record is None and elapsed < 0.5, f"next(0) took {elapsed:.2f}s"

        await produce_all(engine, topic, [(None, b"warmup")])
        [warmup] = await consume(consumer, 1)  # joined: later records come quickly
        assert warmup.value == b"warmup"
        # A BLPOP whose client goes away cancels its next(), at any point of its work:
        # the record it was getting, if any, comes out of the next calls, in order, once.
        for round_ in range(6):
            values = [b"r%d-%d" % (round_, n) for n in range(3)]
            await produce_all(engine, topic, [(None, v) for v in values])
            waiting = asyncio.create_task(consumer.next(None))
            for _ in range(round_):  # let it run `round_` steps before the cancel
                await asyncio.sleep(0)
            waiting.cancel()
            try:
                record = await waiting
                got = [] if record is None else [record.value]
            except asyncio.CancelledError:
                got = []
            got += [r.value for r in await consume(consumer, 3 - len(got))]
            assert got == values, f"round {round_}"
        assert await consumer.next(0.3) is None, "a record was delivered twice"
        # Counted when handed out: the cancelled calls count nothing.
        assert engine.stats.get(Stats.CONSUMED) == 1 + 6 * 3

        # close() ends a next() that waits forever.
        forever = asyncio.create_task(consumer.next(None))
        await asyncio.sleep(0)
        _, elapsed = await timed(consumer.close())
        assert await asyncio.wait_for(forever, WAIT) is None
        assert elapsed < 5, f"close took {elapsed:.1f}s"


@asyncio_test
async def test_settings_that_are_not_values_are_refused(engine_factory: EngineFactory) -> None:
    topic = engine_factory.new_topic(1)
    async with engine_factory.running() as engine:
        # The gateway hands BLPOP's JSON over as decoded; only scalars are settings.
        for value in ({"nested": 1}, [1], None):
            with pytest.raises(ConsumerCreationError) as refused:
                await engine.consumer(new_group(), "bad", [topic], {"auto.offset.reset": value})
            assert "auto.offset.reset" in str(refused.value), "the error names the setting"
        await produce_all(engine, topic, [(None, b"after")])
        consumer = await engine.consumer(new_group(), "good", [topic], {})
        assert [r.value for r in await consume(consumer, 1)] == [b"after"]
        await consumer.close()


@asyncio_test
async def test_stop_closes_what_was_left_open_and_refuses_new_work(
    engine_factory: EngineFactory,
) -> None:
    topic = engine_factory.new_topic()
    engine = engine_factory.create()
    await engine.start()
    handle = engine.producer("s")
    handle.produce(topic, None, b"x")
    consumer = await engine.consumer(new_group(), "c", [topic], {})
    await engine.stop()
    assert handle.outstanding() == 0, "stop() must deliver what was produced"
    assert engine.stats.get(Stats.DELIVERED) == 1
    assert await consumer.next(0) is None, "stop() must close the consumers left open"
    with pytest.raises(AckError):
        consumer.ack(topic, 0, 0)
    with pytest.raises(ProducerCreationError):
        engine.producer("late")
    with pytest.raises(ConsumerCreationError):
        await engine.consumer(new_group(), "late", [topic], {})
    with pytest.raises(MetadataError):
        await engine.topics()


@asyncio_test
async def test_a_restarted_engine_keeps_partitions_offsets_and_commits(
    engine_factory: EngineFactory,
) -> None:
    topic, group = engine_factory.new_topic(4), new_group()
    async with engine_factory.running() as engine:
        await produce_all(engine, topic, [(key, key + b"-1") for key in KEYS])
        consumer = await engine.consumer(group, "c", [topic], {})
        before = await consume(consumer, len(KEYS), ack=True)
        await consumer.close()
    # A new engine on the same deployment: a gateway restarted.
    async with engine_factory.running() as engine:
        await produce_all(engine, topic, [(key, key + b"-2") for key in KEYS])
        consumer = await engine.consumer(group, "c", [topic], {})
        after = await consume(consumer, len(KEYS))
        assert await consumer.next(0.3) is None, "acked records came back after the restart"
        await consumer.close()
    assert sorted(r.value or b"" for r in after) == sorted(key + b"-2" for key in KEYS)
    partition_of = {r.key: r.partition for r in before}
    assert {r.key: r.partition for r in after} == partition_of, "a key changed partition"
    old, new = by_partition(before), by_partition(after)
    for partition, records in new.items():
        first = min(r.offset for r in records)
        assert first == max(r.offset for r in old[partition]) + 1, f"partition {partition}"


@asyncio_test
async def test_engines_of_one_deployment_agree_on_partitions_and_offsets(
    engine_factory: EngineFactory,
) -> None:
    topic = engine_factory.new_topic(4)
    async with engine_factory.running() as one, engine_factory.running() as other:
        await produce_all(one, topic, [(key, key + b"-one") for key in KEYS])
        await produce_all(other, topic, [(key, key + b"-other") for key in KEYS])
        mine, theirs = await asyncio.gather(
            one.consumer(new_group(), "c", [topic], {}),
            other.consumer(new_group(), "c", [topic], {}),
        )
        seen_here, seen_there = await asyncio.gather(
            consume(mine, 2 * len(KEYS)), consume(theirs, 2 * len(KEYS))
        )
        await asyncio.gather(mine.close(), theirs.close())

    def positions(records: list[Record]) -> list[tuple[int, int, bytes | None, bytes | None]]:
        return sorted((r.partition, r.offset, r.key, r.value) for r in records)

    assert positions(seen_here) == positions(seen_there)
    for key in KEYS:
        keyed = [r for r in seen_here if r.key == key]
        if engine_factory.keys_share_partitions_across_gateways:
            assert len({r.partition for r in keyed}) == 1, key
        else:  # each gateway writes partitions of its own: one partition per gateway
            for tag in (b"-one", b"-other"):
                written = [r for r in keyed if (r.value or b"").endswith(tag)]
                assert len({r.partition for r in written}) == 1, (key, tag)


async def consume_batches(consumer: Consumer, count: int, limit: int) -> list[list[Record]]:
    """next_batch(limit) until `count` records came within WAIT; fails saying what came."""
    batches: list[list[Record]] = []
    deadline = time.monotonic() + WAIT
    while sum(map(len, batches)) < count:
        remaining = deadline - time.monotonic()
        batch = await consumer.next_batch(limit, remaining) if remaining > 0 else []
        if not batch:
            got = sum(map(len, batches))
            pytest.fail(f"expected {count} records in batches within {WAIT}s, got {got}")
        assert 1 <= len(batch) <= limit, f"a batch of {len(batch)} for a limit of {limit}"
        batches.append(list(batch))  # a list of Records or a RecordBatch: read alike
    return batches


@asyncio_test
async def test_batches_keep_order_count_once_and_unacked_records_come_back(
    engine_factory: EngineFactory,
) -> None:
    topic, group = engine_factory.new_topic(2), new_group()
    keyed: list[Keyed] = [(key, key + b"-%d" % n) for n in range(6) for key in KEYS]  # 48
    async with engine_factory.running() as engine:
        first = await engine.consumer(group, "c1", [topic], {})
        record, elapsed = await timed(first.next_batch(5, 0.3))
        assert record == [], "a batch came from an empty topic"
        assert 0.3 <= elapsed < 2, f"next_batch(5, 0.3) took {elapsed:.2f}s"
        assert first.take_ready(5) == []

        await produce_all(engine, topic, keyed)
        records = [r for batch in await consume_batches(first, len(keyed), 10) for r in batch]
        assert await first.next_batch(10, 0.3) == [], "a record was delivered twice"
        assert sorted(r.value or b"" for r in records) == sorted(v for _, v in keyed)
        assert engine.stats.get(Stats.CONSUMED) == len(keyed), "counted once per record"
        for record in records:  # every field as next() hands it out (Kafka: from columns)
            assert record.topic == topic and 0 <= record.partition < PARTITION_LIMIT, record
            assert record.timestamp_ms is None or record.timestamp_ms > 0, record
        for key in KEYS:
            mine = [r.value for r in records if r.key == key]
            assert mine == [v for k, v in keyed if k == key], f"order of key {key!r}"
        for partition, handed_out in by_partition(records).items():
            offsets = [r.offset for r in handed_out]
            assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), partition

        # Ack the first half of each partition only: a new member gets the rest again.
        unacked: set[bytes] = set()
        for handed_out in by_partition(records).values():
            half = len(handed_out) // 2
            last_acked = handed_out[half - 1]
            first.ack(last_acked.topic, last_acked.partition, last_acked.offset)
            unacked.update(r.value or b"" for r in handed_out[half:])
        await first.close()
        second = await engine.consumer(group, "c2", [topic], {})
        again = [r for batch in await consume_batches(second, len(unacked), 1000) for r in batch]
        assert {r.value for r in again} == unacked, "the unacked records, and only them"

        # A cancelled next_batch loses no record: they come out of the next calls, once.
        late: list[Keyed] = [(KEYS[0], b"late-%d" % n) for n in range(3)]
        await produce_all(engine, topic, late)
        waiting = asyncio.create_task(second.next_batch(10, None))
        await asyncio.sleep(0)
        waiting.cancel()
        try:
            got = [r.value for r in await waiting]
        except asyncio.CancelledError:
            got = []
        rest = [] if len(got) == 3 else await consume_batches(second, 3 - len(got), 10)
        got += [r.value for batch in rest for r in batch]
        assert got == [b"late-0", b"late-1", b"late-2"]
        assert await second.next_batch(10, 0.3) == [], "a record was delivered twice"
        await second.close()
        assert await second.next_batch(10, 0.3) == [], "a closed consumer hands out nothing"


@asyncio_test
async def test_acks_made_while_next_waits_return_at_once_and_are_committed(
    engine_factory: EngineFactory,
) -> None:
    """base.Consumer.ack never waits for an in-flight next(): a push subscription acks
    from its delivery tasks while its pump waits for the next record."""
    topic, group = engine_factory.new_topic(1), new_group()
    async with engine_factory.running() as engine:
        await produce_all(engine, topic, [(None, b"a"), (None, b"b"), (None, b"c")])
        first = await engine.consumer(group, "c1", [topic], {})
        records = await consume(first, 3)
        waiting = asyncio.create_task(first.next(WAIT))  # nothing to fetch: it waits
        slowest = 0.0
        started = time.monotonic()
        while time.monotonic() - started < ACKING:
            for record in records:
                begun = time.monotonic()
                first.ack(record.topic, record.partition, record.offset)
                slowest = max(slowest, time.monotonic() - begun)
            await asyncio.sleep(ACK_PACE)  # pacing only: the acks spread over the wait
        assert slowest < PROMPT_ACK, f"an ack took {slowest:.2f}s while next() waited"
        assert not waiting.done(), "next() returned with no record to give"

        # The wait goes on and gets the next record; close commits the acks.
        await produce_all(engine, topic, [(None, b"d")])
        got = await waiting
        assert got is not None and got.value == b"d", got
        await first.close()
        second = await engine.consumer(group, "c2", [topic], {})
        [again] = await consume(second, 1)
        assert again.value == b"d", "acks made while next() waited were not committed"
        await second.close()
