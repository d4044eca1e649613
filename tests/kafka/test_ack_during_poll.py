"""An ack on the event loop while the same consumer's next() polls on its worker thread.

confluent-kafka lets one thread at a time into a consumer handle; a second caller waits
until the first call returns. An ack that called store_offsets on the loop during a
BLPOP-forever style next(None) therefore froze the loop until a record arrived: nothing
else on the server ran meanwhile. Here the only thing that can end such a poll is a
record that a watchdog thread produces after UNBLOCK seconds, so a frozen loop fails the
test with a message instead of hanging it.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka import Producer as RawProducer
from confluent_kafka.admin import AdminClient

from backends.base import AckError, Record, Stats
from backends.kafka.consumer import KafkaConsumer
from tests.support.consuming import WAIT, asyncio_test, consume, new_group
from tests.support.kafka import running_engine
from tests.support.tansu import TansuBroker
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.kafka

UNBLOCK = 5.0  # seconds before the watchdog ends the poll with a record of its own
PROMPT = 0.5  # seconds: a bound on three acks, which queue an offset each


def polling(label: str) -> bool:
    """Whether the worker thread of consumer `label` (group:name) is inside a fetch."""
    frames = sys._current_frames()
    for thread in threading.enumerate():
        frame = frames.get(thread.ident or -1)
        if thread.name.startswith(f"rafka-consumer-{label}_") and frame is not None:
            return frame.f_code is KafkaConsumer._fetch.__code__
    return False


class Watchdog:
    """Produces `value` to `topic` from a thread of its own after UNBLOCK seconds,
    unless cancelled first."""

    def __init__(self, bootstrap: str, topic: str, value: bytes) -> None:
        self.fired = threading.Event()
        self._bootstrap, self._topic, self._value = bootstrap, topic, value
        self._timer = threading.Timer(UNBLOCK, self._fire)

    def _fire(self) -> None:
        self.fired.set()
        producer = RawProducer({"bootstrap.servers": self._bootstrap})
        producer.produce(self._topic, self._value)
        producer.flush(WAIT)

    def __enter__(self) -> Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        self._timer.join(WAIT + UNBLOCK)


@asyncio_test
async def test_an_ack_while_next_polls_returns_at_once_and_is_committed(
    tansu: TansuBroker,
) -> None:
    topic, group = tansu.create_topic(1), new_group()
    async with running_engine(tansu.bootstrap) as engine:
        handle = engine.producer("s")
        for value in (b"a", b"b", b"c"):
            handle.produce(topic, None, value)
        assert await handle.flush(WAIT) == 0
        consumer = await engine.consumer(group, "c", [topic], {})
        records = await consume(consumer, 3)

        waiting = asyncio.create_task(consumer.next(None))  # as BLPOP with timeout 0
        await wait_until_async(lambda: polling(f"{group}:c"), WAIT, "the worker never polled")
        with Watchdog(tansu.bootstrap, topic, b"watchdog") as watchdog:
            started = time.monotonic()
            for record in records:
                consumer.ack(record.topic, record.partition, record.offset)
            elapsed = time.monotonic() - started
        assert not watchdog.fired.is_set(), (
            f"ack() froze the event loop for {elapsed:.1f}s while next() polled: only the "
            f"watchdog's record, produced after {UNBLOCK:g}s, ended the poll"
        )
        assert elapsed < PROMPT, f"three acks took {elapsed:.2f}s while next() polled"
        assert not waiting.done(), "next() returned although no record came"
        # Still refused at once, with librdkafka's text, for a partition not assigned.
        with pytest.raises(AckError, match=r"^Local: Erroneous state$"):
            consumer.ack(topic, 1, 0)
        assert engine.stats.get(Stats.ACKED) == len(records), "a refused ack was counted"

        # The poll goes on and gets the next record; the acks are committed by the close.
        handle.produce(topic, None, b"d")
        assert await handle.flush(WAIT) == 0
        got: Record | None = await asyncio.wait_for(waiting, WAIT)
        assert got is not None and got.value == b"d", got
        await consumer.close()
        after = await engine.consumer(group, "c2", [topic], {})
        [again] = await consume(after, 1)
        assert again.value == b"d", "the acks made during the poll were not committed"
        await after.close()


def committed(bootstrap: str, group: str, topic: str) -> int:
    """The group's committed offset of partition 0 of `topic` (negative: none)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0)])
    answer = admin.list_consumer_group_offsets([request])[group].result(WAIT)
    [partition] = answer.topic_partitions
    return int(partition.offset)


@asyncio_test
async def test_an_ack_with_no_next_in_flight_is_committed_without_another_call(
    tansu: TansuBroker,
) -> None:
    """The worker stores a lone ack at once: librdkafka's periodic commit takes it while
    the session makes no other call (a client that acks, then idles)."""
    topic, group = tansu.create_topic(1), new_group()
    async with running_engine(tansu.bootstrap) as engine:
        handle = engine.producer("s")
        handle.produce(topic, None, b"a")
        assert await handle.flush(WAIT) == 0
        consumer = await engine.consumer(group, "c", [topic], {})
        [record] = await consume(consumer, 1)
        consumer.ack(record.topic, record.partition, record.offset)
        await wait_until_async(
            lambda: committed(tansu.bootstrap, group, topic) == record.offset + 1,
            WAIT,
            f"offset {record.offset + 1} committed with no call after the ack",
            interval=0.2,
        )
        await consumer.close()


@asyncio_test
async def test_with_auto_offset_store_only_records_handed_out_are_committed(
    tansu: TansuBroker,
) -> None:
    """`enable.auto.offset.store` on (librdkafka's default when a configuration leaves
    it out; here a client's BLPOP settings): as with Rafka's one poll per BLPOP, the
    offsets stored are those of the records handed out, and an ack is refused as
    librdkafka refuses it (spec §2.4). librdkafka stored every record a batch fetched:
    handing out 1 of 10 and closing committed 10, and the 9 others were never
    delivered to anyone; the ack was answered :1 and refused later, in a log line."""
    topic = tansu.create_topic(1)
    group = new_group()
    values = [f"v{n}".encode() for n in range(10)]
    async with running_engine(tansu.bootstrap) as engine:
        producer = engine.producer("s")
        producer.produce_many(topic, None, values)
        assert await producer.flush(WAIT) == 0
        first = await engine.consumer(group, "c1", [topic], {"enable.auto.offset.store": True})
        [served] = await consume(first, 1)
        assert served.value == b"v0" and first.buffered == 9, "one fetch brought them all"
        with pytest.raises(AckError, match=r"^Local: Invalid argument or configuration$"):
            first.ack(served.topic, served.partition, served.offset)
        await first.close()
        assert await asyncio.to_thread(committed, tansu.bootstrap, group, topic) == 1
        second = await engine.consumer(group, "c2", [topic], {})
        rest = await consume(second, 9)
        assert [r.value for r in rest] == values[1:]
        await second.close()
        await producer.close(1)
