"""The Kafka engine's consuming side against a real Tansu broker: consumer settings,
errors, batched fetching and rebalances.

Group joins cost half of session.timeout.ms on Tansu (about 1 s here), so tests reuse
their consumers and start the ones that are independent concurrently.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupState, KafkaError, Message
from confluent_kafka import Producer as RawProducer
from confluent_kafka.admin import AdminClient

from backends.base import (
    AckError,
    ConsumeError,
    ConsumerCreationError,
    EngineOptions,
    Record,
    Stats,
)
from backends.kafka.consumer import KafkaConsumer
from backends.kafka.engine import KafkaEngine
from backends.kafka.settings import KafkaSettings
from backends.settings import JsonNumber
from tests.support.consuming import WAIT, asyncio_test, consume, new_group
from tests.support.kafka import running_engine
from tests.support.tansu import TansuBroker

pytestmark = pytest.mark.kafka


def hold_loop_until(condition: Callable[[], bool]) -> None:
    """Block the event loop thread (on purpose) until another thread makes `condition` true.

    Lets a test act between a worker thread's result and the loop's noticing it.
    """
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"no progress within {WAIT}s"
        time.sleep(0.001)


# --- consuming ------------------------------------------------------------------------


@asyncio_test
async def test_consumer_overrides_apply_and_bad_ones_fail_creation(tansu: TansuBroker) -> None:
    topic, group = tansu.create_topic(1), new_group()
    async with running_engine(tansu.bootstrap) as engine:
        handle = engine.producer("s")
        handle.produce(topic, None, b"foo")
        assert await handle.flush(WAIT) == 0

        for overrides, text in [
            ({"foo": "bar"}, 'No such configuration property: "foo"'),
            (
                {"session.timeout.ms": "true"},
                'Invalid value for configuration property "session.timeout.ms"',
            ),
        ]:
            with pytest.raises(ConsumerCreationError) as failure:
                await engine.consumer(new_group(), "bad", [topic], overrides)
            assert str(failure.value) == text
        with pytest.raises(ConsumerCreationError, match="subscription"):
            await engine.consumer(new_group(), "bad", ["^["], {})  # an invalid regex
        # Settings arrive as decoded JSON: what is not a property value names its key.
        unusable: list[tuple[dict[str, object], str]] = [
            ({"x": {"y": 1}}, "x: nested objects and arrays are not allowed"),
            ({"x": [1]}, "x: nested objects and arrays are not allowed"),
            ({"x": None}, "x: must be a string, a number or a boolean, got null"),
        ]
        for settings, text in unusable:
            with pytest.raises(ConsumerCreationError) as failure:
                await engine.consumer(new_group(), "bad", [topic], settings)
            assert str(failure.value) == text

        # The server says earliest; this client says latest: `foo` is never delivered. A
        # boolean and a number (kept as its literal text) become property strings. The
        # session's group and name win over the client's group.id and client.id.
        latest = await engine.consumer(
            group,
            "c",
            [topic],
            {
                "auto.offset.reset": "latest",
                "enable.partition.eof": False,
                "session.timeout.ms": JsonNumber("2000"),
                "group.id": "not-the-group",
                "client.id": "not-the-name",
            },
        )
        # Records produced before the assignment are skipped too, so produce until one
        # arrives; it must be a new one.
        deadline = time.monotonic() + WAIT
        record = None
        while record is None:
            assert time.monotonic() < deadline, "no record reached the `latest` consumer"
            handle.produce(topic, None, b"bar")
            record = await latest.next(0.5)
        assert record.value == b"bar"
        latest.ack(record.topic, record.partition, record.offset)
        await latest.close()
        # The ack was committed for the session's group: its next member (earliest, as
        # the server says) starts after `bar`, not at `foo`.
        handle.produce(topic, None, b"baz")
        assert await handle.flush(WAIT) == 0
        after = await engine.consumer(group, "d", [topic], {})
        values: list[bytes | None] = []
        while b"baz" not in values:  # a `bar` produced twice above may come first
            values += [r.value for r in await consume(after, 1)]
        assert b"foo" not in values, f"the ack went to another group: {values}"
        await after.close()
        await handle.close(1)


@asyncio_test
async def test_a_real_error_is_raised_and_a_fetched_batch_survives_cancellation(
    tansu: TansuBroker,
) -> None:
    topic = tansu.create_topic(1)
    async with running_engine(tansu.bootstrap) as engine:
        consumer, failing = await asyncio.gather(
            engine.consumer(new_group(), "c", [topic], {}),
            # With no committed offset and reset `error`, librdkafka reports an error.
            engine.consumer(new_group(), "f", [topic], {"auto.offset.reset": "error"}),
        )
        with pytest.raises(ConsumeError, match="Local: No offset stored"):
            while await failing.next(WAIT) is None:
                pass
        assert await failing.next(0.2) is None, "the consumer stays usable after an error"

        handle = engine.producer("s")
        handle.produce(topic, None, b"warmup")
        assert await handle.flush(WAIT) == 0
        [warmup] = await consume(consumer, 1)  # joined: later records arrive in ms
        assert warmup.value == b"warmup"

        # Cancel a BLPOP once the worker thread has fetched records into the buffer while
        # the loop has not seen them yet: the whole batch must come out of the next
        # calls, in order, exactly once (the contract suite cancels at other points).
        for i in range(3):
            values = [f"r{i}-{n}".encode() for n in range(3)]
            for value in values:
                handle.produce(topic, None, value)
            assert await handle.flush(WAIT) == 0
            waiting = asyncio.create_task(consumer.next(None))
            await asyncio.sleep(0)  # let it submit its fetch
            hold_loop_until(lambda: consumer.buffered > 0)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            got = [r.value for r in await consume(consumer, 3)]
            assert got == values, f"round {i}"
        assert await consumer.next(0.3) is None, "a record was delivered twice"
        # Counted when handed out, not when fetched: the cancelled calls count nothing.
        assert engine.stats.get(Stats.CONSUMED) == 1 + 3 * 3
        await asyncio.gather(consumer.close(), failing.close())
        await handle.close(1)


# --- batched fetching -----------------------------------------------------------------


def produce_per_partition(broker: TansuBroker, topic: str, partitions: int, each: int) -> None:
    """`each` records on every partition, valued `p<partition>-<n>`, in order."""
    raw = RawProducer({"bootstrap.servers": broker.bootstrap, "queue.buffering.max.ms": "0"})
    for n in range(each):
        for partition in range(partitions):
            raw.produce(topic, f"p{partition}-{n}".encode(), partition=partition)
    assert raw.flush(WAIT) == 0


def in_partition_order(records: list[Record]) -> bool:
    """Each partition's records in increasing offset order."""
    last: dict[int, int] = {}
    for record in records:
        if record.offset <= last.get(record.partition, -1):
            return False
        last[record.partition] = record.offset
    return True


class InjectErrors:
    """A mock, around a real librdkafka consumer: Tansu cannot be made to report a
    non-transient error at a chosen place among fetched records, so this inserts
    `errors` right after the `after`-th real record that poll()/consume() return."""

    def __init__(self, rd: Any, after: int, errors: list[Message]) -> None:
        self._rd = rd
        self._after = after
        self._errors = errors
        self._records = 0
        self._stash: list[Message] = []  # injected after the one message poll() returns

    def _through(self, messages: list[Message]) -> list[Message]:
        out: list[Message] = []
        for message in messages:
            out.append(message)
            if message.error() is None:
                self._records += 1
                if self._records == self._after:
                    out.extend(self._errors)
        return out

    def poll(self, timeout: float) -> Message | None:
        if self._stash:
            return self._stash.pop(0)
        message = self._rd.poll(timeout)
        if message is None:
            return None
        first, *self._stash = self._through([message])
        return first

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        out, self._stash = self._stash[:num_messages], self._stash[num_messages:]
        if len(out) < num_messages:
            more = self._rd.consume(num_messages=num_messages - len(out), timeout=timeout)
            out += self._through(more)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rd, name)


def test_consume_batch_must_be_positive() -> None:
    for bad in (0, -1, 1_000_001):
        with pytest.raises(ValueError, match="consume_batch"):
            KafkaEngine(Stats(), KafkaSettings({}, {}), EngineOptions(consume_batch=bad))


@asyncio_test
async def test_batches_keep_partition_order_and_close_returns_the_unserved_to_the_group(
    tansu: TansuBroker,
) -> None:
    topic = tansu.create_topic(2)
    produce_per_partition(tansu, topic, partitions=2, each=30)
    group = new_group()
    # Batches of 25: the 60 records take several fetches.
    async with running_engine(tansu.bootstrap, consume_batch=25) as engine:
        first = await engine.consumer(group, "c1", [topic], {})
        served = await consume(first, 1, ack=True)
        assert first.buffered > 0, "one fetch brought only one record: no batching"
        served += await consume(first, 9, ack=True)
        assert in_partition_order(served), [(r.partition, r.offset) for r in served]
        # Counted when handed out: the records waiting in the buffer are not consumed.
        assert engine.stats.get(Stats.CONSUMED) == 10
        unserved = first.buffered
        assert unserved > 0
        await first.close()
        assert first.buffered == 0, "close() keeps the buffer"

        # The buffered records were never acked: the next member gets them, and every
        # other record, exactly once, in partition order. End-of-partition events (on
        # here) arrive inside the batches, and are skipped as transient.
        second = await engine.consumer(group, "c2", [topic], {"enable.partition.eof": "true"})
        rest = await consume(second, 50)
        assert await second.next(0.3) is None, "a record was delivered twice"
        assert in_partition_order(rest), [(r.partition, r.offset) for r in rest]
        produced = {f"p{p}-{n}".encode() for p in range(2) for n in range(30)}
        assert {r.value for r in served} | {r.value for r in rest} == produced
        assert len(served) + len(rest) == len(produced)
        assert engine.stats.get(Stats.CONSUMED) == 60
        await second.close()


@asyncio_test
async def test_an_error_inside_a_batch_is_raised_at_its_place(tansu: TansuBroker) -> None:
    topic = tansu.create_topic(1)
    produce_per_partition(tansu, topic, partitions=1, each=5)
    async with running_engine(tansu.bootstrap) as engine:
        consumer = await engine.consumer(new_group(), "c", [topic], {})
        errors = [
            Message(topic=topic, partition=0, error=KafkaError(KafkaError._TRANSPORT)),
            Message(
                topic=topic, partition=0, error=KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
            ),
        ]
        # Installed before the first fetch, which happens inside next().
        setattr(consumer, "_rd", InjectErrors(consumer._rd, after=2, errors=errors))  # noqa: B010

        before = [r.value for r in await consume(consumer, 2)]
        assert before == [b"p0-0", b"p0-1"], "the records before the error come first"
        # The transient error is skipped; the other ends this call, with its own text.
        with pytest.raises(ConsumeError) as failure:
            await consumer.next(WAIT)
        assert str(failure.value) == "Broker: Topic authorization failed"
        after = [r.value for r in await consume(consumer, 3)]
        assert after == [b"p0-2", b"p0-3", b"p0-4"], "the records after the error follow"
        assert await consumer.next(0.3) is None
        assert engine.stats.get(Stats.CONSUMED) == 5
        await consumer.close()


@pytest.mark.slow  # about 6 s: a join, a rebalance, and a re-form before the last leave
@asyncio_test
async def test_a_rebalance_drops_buffered_records_of_revoked_partitions(
    tansu: TansuBroker,
) -> None:
    topic = tansu.create_topic()
    produce_per_partition(tansu, topic, partitions=4, each=40)
    produced = {f"p{p}-{n}".encode() for p in range(4) for n in range(40)}
    group = new_group()
    seen: dict[str, list[Record]] = {"c1": [], "c2": []}
    refused: list[str] = []

    async def take(name: str, consumer: KafkaConsumer, timeout: float) -> None:
        record = await consumer.next(timeout)
        if record is None:
            return
        seen[name].append(record)
        try:  # at once, as a client would: the member must still own the partition
            consumer.ack(record.topic, record.partition, record.offset)
        except AckError as error:
            refused.append(f"{name} {record.partition}:{record.offset}: {error}")

    def values() -> set[bytes | None]:
        return {r.value for r in seen["c1"] + seen["c2"]}

    async with running_engine(tansu.bootstrap) as engine:
        c1 = await engine.consumer(group, "c1", [topic], {})
        await take("c1", c1, WAIT)
        assert c1.buffered > 0, "c1 has records fetched and not handed out"
        # c2 joins while c1's buffer is full: the rebalance takes partitions from c1,
        # whose buffered records of them must never be handed out.
        c2 = await engine.consumer(group, "c2", [topic], {})
        deadline = time.monotonic() + 3 * WAIT
        while not seen["c2"] or values() != produced:
            assert time.monotonic() < deadline, f"lost: {sorted(produced - values())[:20]}"
            await asyncio.gather(take("c1", c1, 0.2), take("c2", c2, 0.2))
        assert not refused, f"records of partitions no longer owned were handed out: {refused}"
        assert seen["c1"] and seen["c2"]

        # One at a time (a Tansu group-coordinator bug, see test_gateway_kafka): c2
        # polls until the group has re-formed without c1, then leaves too.
        await c1.close()
        admin = AdminClient({"bootstrap.servers": tansu.bootstrap})

        def group_state() -> ConsumerGroupState:
            # As tests.gateway_support.group_state, without importing the gateway here.
            state: ConsumerGroupState = (
                admin.describe_consumer_groups([group])[group].result(WAIT).state
            )
            return state

        async def stable() -> bool:
            await take("c2", c2, 0.1)
            return await asyncio.to_thread(group_state) == ConsumerGroupState.STABLE

        deadline = time.monotonic() + WAIT
        while not await stable():
            assert time.monotonic() < deadline, f"group {group} did not re-form without c1"
        await c2.close()
        assert not refused, refused
