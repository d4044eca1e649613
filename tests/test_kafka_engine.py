"""The Kafka engine against a real Tansu broker (the session fixture `tansu`).

Group joins cost half of session.timeout.ms on Tansu (about 1 s here), so tests reuse
their consumers and start the ones that are independent concurrently.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ParamSpec

import pytest
import structlog
from confluent_kafka import ConsumerGroupState, KafkaError, Message
from confluent_kafka import Producer as RawProducer
from confluent_kafka.admin import AdminClient

from backends.base import (
    AckError,
    ConsumeError,
    ConsumerCreationError,
    EngineOptions,
    MetadataClientError,
    MetadataError,
    ProduceError,
    ProducerCreationError,
    Record,
    Stats,
)
from backends.kafka.consumer import BATCH, KafkaConsumer
from backends.kafka.engine import KafkaEngine
from backends.kafka.settings import KafkaSettings
from backends.settings import REDACTED, JsonNumber
from tests.support.tansu import TansuBroker, free_port

pytestmark = pytest.mark.kafka

P = ParamSpec("P")

# The original's test configuration (spec §8.2), adapted to Tansu and modern librdkafka.
CONSUMER = {
    "session.timeout.ms": "2000",
    "heartbeat.interval.ms": "500",
    "enable.auto.commit": "true",
    "auto.commit.interval.ms": "1000",
    "enable.auto.offset.store": "false",
    "auto.offset.reset": "earliest",
    "log_level": "3",
}
PRODUCER = {
    "queue.buffering.max.ms": "0",
    # Unknown topics must fail, and quickly (spec §15.2).
    "allow.auto.create.topics": "false",
    "topic.metadata.propagation.max.ms": "200",
    "log_level": "3",
}
WAIT = 10.0  # seconds: the bound of every wait for something that should happen


def asyncio_test(test: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    """Run an async test on a fresh event loop (pytest sees the original signature)."""

    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


def new_group() -> str:
    return f"g-{uuid.uuid4().hex[:6]}"


def kafka_settings(
    bootstrap: str, producer: dict[str, str] | None = None, consumer: dict[str, str] | None = None
) -> KafkaSettings:
    return KafkaSettings(
        consumer={**CONSUMER, "bootstrap.servers": bootstrap, **(consumer or {})},
        producer={**PRODUCER, "bootstrap.servers": bootstrap, **(producer or {})},
    )


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


async def consume(consumer: KafkaConsumer, count: int, ack: bool = False) -> list[Record]:
    """`count` records within WAIT seconds, acked if asked; fails saying what arrived."""
    records: list[Record] = []
    deadline = time.monotonic() + WAIT
    while len(records) < count:
        remaining = deadline - time.monotonic()
        record = await consumer.next(remaining) if remaining > 0 else None
        if record is None:
            got = [r.value for r in records]
            pytest.fail(f"expected {count} records within {WAIT}s, got {len(got)}: {got}")
        if ack:
            consumer.ack(record.topic, record.partition, record.offset)
        records.append(record)
    return records


async def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {WAIT}s")
        await asyncio.sleep(0.02)


def hold_loop_until(condition: Callable[[], bool]) -> None:
    """Block the event loop thread (on purpose) until another thread makes `condition` true.

    Lets a test act between a worker thread's result and the loop's noticing it.
    """
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"no progress within {WAIT}s"
        time.sleep(0.001)


def rafka_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("rafka-")}


async def timed(awaitable: Awaitable[Any]) -> tuple[Any, float]:
    start = time.monotonic()
    result = await awaitable
    return result, time.monotonic() - start


# --- metadata -------------------------------------------------------------------------


@asyncio_test
async def test_topics_lists_a_created_topic(tansu: TansuBroker) -> None:
    topic = tansu.create_topic()
    async with running_engine(tansu.bootstrap) as engine:
        assert topic in await engine.topics()


@asyncio_test
async def test_unreachable_broker_gives_metadata_error_and_counts_unknown_events() -> None:
    async with running_engine(f"127.0.0.1:{free_port()}", metadata_timeout=0.3) as engine:
        with pytest.raises(MetadataError) as failure:
            await engine.topics()
        # librdkafka's own text, without confluent-kafka's "Failed to get metadata: ".
        assert str(failure.value).startswith("Local: "), str(failure.value)
        # "Connect ... failed: Connection refused" / "all brokers down" reach error_cb.
        await wait_until(
            lambda: engine.stats.get(Stats.UNKNOWN_EVENTS) >= 1, "an unknown producer event"
        )


# --- producing ------------------------------------------------------------------------


@asyncio_test
async def test_flush_waits_only_for_the_handles_own_records(tansu: TansuBroker) -> None:
    topic = tansu.create_topic()
    missing = f"r-missing-{uuid.uuid4().hex[:6]}"
    # A record for a missing topic stays outstanding until librdkafka gives up on the
    # topic: 1.5 s here, long enough to show that the other handle does not wait for it.
    slow = {"topic.metadata.propagation.max.ms": "1500"}
    async with running_engine(tansu.bootstrap, producer=slow) as engine:
        stuck, quick = engine.producer("stuck"), engine.producer("quick")
        leaving = engine.producer("leaving")
        stuck.produce(missing, None, b"lost")
        leaving.produce(missing, b"k", b"v")
        for i in range(5):
            quick.produce(topic, None, f"v{i}".encode())

        # Closing with records still in flight reports and counts them as unflushed.
        assert await leaving.close(0) == 1
        assert engine.stats.get(Stats.UNFLUSHED) == 1
        assert await leaving.close(5) == 0, "a second close returns 0 at once"
        with pytest.raises(ProduceError):
            leaving.produce(topic, None, b"after close")

        left, elapsed = await timed(quick.flush(5))
        assert left == 0
        assert elapsed < 1.0, f"flush waited {elapsed:.2f}s, for records not its own?"
        assert stuck.outstanding() == 1
        assert await stuck.flush(0) == 1, "a flush with timeout 0 must not wait"
        assert engine.stats.get(Stats.DELIVERED) == 5

        # The delivery failure ends the wait: DUMP answers 0 (done, not succeeded).
        left, elapsed = await timed(stuck.flush(WAIT))
        assert left == 0
        assert elapsed < 5, f"flush did not return when the last record failed ({elapsed:.1f}s)"
        await wait_until(
            lambda: engine.stats.get(Stats.DELIVERY_ERRORS) == 2, "two delivery errors"
        )

        # Now librdkafka knows the topic is missing: refused at once (spec E6).
        with pytest.raises(ProduceError) as refused:
            stuck.produce(missing, None, b"again")
        assert str(refused.value) == "Local: Unknown topic"
        assert stuck.outstanding() == 0, "a refused record must not count as outstanding"
        assert engine.stats.get(Stats.PRODUCED) == 7
        assert engine.stats.get(Stats.UNFLUSHED) == 1, "only close() counts unflushed"
        await quick.close(5)
        await stuck.close(5)


@asyncio_test
async def test_unknown_topic_first_produce_is_a_delivery_error(tansu: TansuBroker) -> None:
    async with running_engine(tansu.bootstrap) as engine:
        handle = engine.producer("s")
        handle.produce("idontexist", None, b"x")  # accepted: the topic is not known yet
        assert await handle.flush(WAIT) == 0
        assert engine.stats.get(Stats.DELIVERY_ERRORS) == 1
        assert engine.stats.get(Stats.DELIVERED) == 0
        with pytest.raises(ProduceError, match=r"^Local: Unknown topic$"):
            handle.produce("idontexist", None, b"x")
        assert "idontexist" not in await engine.topics(), "the topic was auto-created"


@asyncio_test
async def test_produce_is_refused_at_once_with_librdkafkas_text(tansu: TansuBroker) -> None:
    topic = tansu.create_topic()
    async with running_engine(tansu.bootstrap) as engine:
        handle = engine.producer("s")
        with pytest.raises(ProduceError) as too_big:
            handle.produce(topic, None, b"x" * 2_000_000)  # message.max.bytes is ~1 MB
        assert str(too_big.value) == "Broker: Message size too large"
        assert handle.outstanding() == 0
    # A queue of one record that lingers: the second record does not fit.
    tiny = {"queue.buffering.max.messages": "1", "queue.buffering.max.ms": "10000"}
    async with running_engine(tansu.bootstrap, producer=tiny) as engine:
        handle = engine.producer("s")
        handle.produce(topic, None, b"first")
        with pytest.raises(ProduceError) as full:
            handle.produce(topic, None, b"second")
        assert str(full.value) == "Local: Queue full"
        assert handle.outstanding() == 1
        assert engine.stats.get(Stats.PRODUCED) == 1


@asyncio_test
async def test_produce_many_keeps_order_and_counts_each_record_once(tansu: TansuBroker) -> None:
    topic = tansu.create_topic(1)  # one partition: the log order is the produce order
    async with running_engine(tansu.bootstrap) as engine:
        handle = engine.producer("s")
        first = [f"a{i}".encode() for i in range(300)]
        second = [f"b{i}".encode() for i in range(5)]
        assert handle.produce_many(topic, b"k", first) == 300
        assert handle.produce_many(topic, None, []) == 0
        handle.produce(topic, None, b"single")
        assert handle.produce_many(topic, None, second) == 5
        assert engine.stats.get(Stats.PRODUCED) == 306
        assert await handle.flush(WAIT) == 0
        # Deliveries are applied in batches, but each record is counted exactly once.
        assert engine.stats.get(Stats.DELIVERED) == 306
        assert engine.stats.get(Stats.DELIVERY_ERRORS) == 0

        consumer = await engine.consumer(new_group(), "c1", [topic], {})
        records = await consume(consumer, 306)
        assert [r.value for r in records] == [*first, b"single", *second]
        assert [r.key for r in records] == [b"k"] * 300 + [None] * 6
        await consumer.close()

        await handle.close(1)
        with pytest.raises(ProduceError, match=r"^Producer closed$"):
            handle.produce_many(topic, None, [b"late"])
        assert engine.stats.get(Stats.PRODUCED) == 306


@asyncio_test
async def test_produce_many_refusal_keeps_the_records_before_it(tansu: TansuBroker) -> None:
    topic = tansu.create_topic(1)
    async with running_engine(tansu.bootstrap) as engine:
        handle = engine.producer("s")
        huge = b"x" * 2_000_000  # over message.max.bytes: refused inside produce()
        with pytest.raises(ProduceError) as refused:
            handle.produce_many(topic, None, [b"before-1", b"before-2", huge, b"after"])
        assert str(refused.value) == "Broker: Message size too large"
        # The two before it are enqueued and counted; the refused one and the rest are not.
        assert engine.stats.get(Stats.PRODUCED) == 2
        assert handle.outstanding() <= 2
        assert await handle.flush(WAIT) == 0, "DUMP must not wait for unsent records"
        assert engine.stats.get(Stats.DELIVERED) == 2

        # A refusal of the very first record enqueues nothing and leaves nothing behind.
        with pytest.raises(ProduceError, match=r"^Broker: Message size too large$"):
            handle.produce_many(topic, None, [huge, b"never"])
        assert handle.outstanding() == 0
        assert engine.stats.get(Stats.PRODUCED) == 2

        handle.produce(topic, None, b"end")  # marks the end: nothing else may come first
        assert await handle.flush(WAIT) == 0
        consumer = await engine.consumer(new_group(), "c1", [topic], {})
        assert [r.value for r in await consume(consumer, 3)] == [b"before-1", b"before-2", b"end"]
        await consumer.close()
        assert engine.stats.get(Stats.DELIVERED) == 3
        await handle.close(1)


@asyncio_test
async def test_bad_producer_config_raises_and_the_next_call_tries_again(
    tansu: TansuBroker, tmp_path: Path
) -> None:
    async with running_engine(tansu.bootstrap, producer={"foo": "bar"}) as engine:
        with pytest.raises(ProducerCreationError) as failure:
            engine.producer("s")
        assert str(failure.value) == 'No such configuration property: "foo"'
        # KEYS lists topics through the producer: the failure says so (Rafka's text).
        with pytest.raises(MetadataClientError) as listing:
            await engine.topics()
        assert str(listing.value) == 'No such configuration property: "foo"'

    # A failure that goes away: the CA directory does not exist yet. The broker address
    # is a closed port, since TLS against Tansu's plain listener would only add noise.
    ca_dir = tmp_path / "ca"
    tls = {"security.protocol": "ssl", "ssl.ca.location": str(ca_dir)}
    async with running_engine(f"127.0.0.1:{free_port()}", producer=tls) as engine:
        with pytest.raises(ProducerCreationError, match=r"ssl\.ca\.location"):
            engine.producer("s")
        ca_dir.mkdir()
        handle = engine.producer("s")  # not cached as failed: created now
        assert handle.outstanding() == 0
        assert engine.producer("t") is not handle


@asyncio_test
async def test_the_engines_logs_hide_the_secrets_the_start_up_log_hides() -> None:
    secret = {"sasl.oauthbearer.extensions": "ext=s1", "ssl.key.password": "s2"}
    with structlog.testing.capture_logs() as logs:
        async with running_engine(f"127.0.0.1:{free_port()}", producer=secret) as engine:
            engine.producer("s")
    [started] = [line for line in logs if line["event"] == "producer started"]
    shown = started["config"]
    assert {name: shown[name] for name in secret} == dict.fromkeys(secret, REDACTED)
    assert shown["queue.buffering.max.ms"] == "0", "only secrets are hidden"


# --- consuming ------------------------------------------------------------------------


@asyncio_test
async def test_keyed_records_land_on_one_partition_and_all_are_consumed(
    tansu: TansuBroker,
) -> None:
    topic = tansu.create_topic()
    before = rafka_threads()
    async with running_engine(tansu.bootstrap) as engine:
        handle = engine.producer("s")
        keyed = {f"k{i}".encode() for i in range(30)}
        plain = {f"p{i}".encode() for i in range(10)}
        for value in sorted(keyed):
            handle.produce(topic, b"foo", value)
        for value in sorted(plain):
            handle.produce(topic, None, value)
        assert await handle.flush(WAIT) == 0

        consumer = await engine.consumer(new_group(), "c1", [topic], {})
        records = await consume(consumer, 40)
        assert {r.value for r in records} == keyed | plain
        assert len(records) == 40, "a record was delivered twice"
        assert {r.partition for r in records if r.key == b"foo"} == {
            next(r.partition for r in records if r.key == b"foo")
        }, "equal keys must map to one partition"
        assert all(r.topic == topic and r.timestamp_ms for r in records)
        stats = engine.stats
        assert stats.get(Stats.PRODUCED) == stats.get(Stats.DELIVERED) == 40
        assert stats.get(Stats.CONSUMED) == 40

        first = records[0]
        consumer.ack(first.topic, first.partition, first.offset)
        assert stats.get(Stats.ACKED) == 1
        with pytest.raises(AckError) as refused:
            consumer.ack(topic, 99, 0)  # no such partition, so not assigned
        assert str(refused.value) == "Local: Erroneous state"  # librdkafka >= 1.9 (§15.2)
        assert stats.get(Stats.ACKED) == 1

        await consumer.close()
        await consumer.close()  # idempotent
        assert stats.get(Stats.COMMITTED) >= 1, "close did not commit the acked offset"
        with pytest.raises(AckError, match="Consumer closed"):
            consumer.ack(first.topic, first.partition, first.offset)
        assert await consumer.next(None) is None, "a closed consumer returns nothing"
        assert await handle.close(1) == 0
    assert rafka_threads() == before, "a consumer or producer thread was left running"


@asyncio_test
async def test_acks_are_committed_on_close_and_unacked_records_come_back(
    tansu: TansuBroker,
) -> None:
    topic = tansu.create_topic(1)
    group = new_group()
    async with running_engine(tansu.bootstrap) as engine:
        handle = engine.producer("s")
        handle.produce(topic, None, b"foo")
        assert await handle.flush(WAIT) == 0

        # group.id and client.id from the session win over the client's JSON.
        first = await engine.consumer(group, "c1", [topic], {"group.id": "not-the-group"})
        [foo] = await consume(first, 1, ack=True)
        assert (foo.value, foo.offset) == (b"foo", 0)
        await first.close()
        assert engine.stats.get(Stats.COMMITTED) == 1

        handle.produce(topic, None, b"bar")
        assert await handle.flush(WAIT) == 0
        # A new member of the group resumes after the acked offset (spec E7); another
        # group gets every record from the start.
        second, other = await asyncio.gather(
            engine.consumer(group, "c2", [topic], {}),
            engine.consumer(new_group(), "c3", [topic], {}),
        )
        [bar] = await consume(second, 1)  # not acked
        assert (bar.value, bar.offset) == (b"bar", 1)
        assert [r.value for r in await consume(other, 2)] == [b"foo", b"bar"]
        await asyncio.gather(second.close(), other.close())

        # `bar` was never acked: the group delivers it again, and only it (spec E13).
        third = await engine.consumer(group, "c4", [topic], {})
        [again] = await consume(third, 1)
        assert (again.value, again.offset) == (b"bar", 1)
        assert await third.next(0.3) is None
        await third.close()
        await handle.close(1)


@asyncio_test
async def test_two_members_of_a_group_share_partitions_without_loss(
    tansu: TansuBroker,
) -> None:
    topic = tansu.create_topic()
    raw = RawProducer({"bootstrap.servers": tansu.bootstrap, "queue.buffering.max.ms": "0"})
    produced: set[bytes] = set()

    def one_per_partition(tag: str) -> None:
        for partition in range(4):
            value = f"{tag}-p{partition}".encode()
            raw.produce(topic, value, partition=partition)
            produced.add(value)
        assert raw.flush(WAIT) == 0

    group = new_group()
    seen: dict[str, list[bytes]] = {"c1": [], "c2": []}

    async def take(name: str, consumer: KafkaConsumer, timeout: float) -> None:
        record = await consumer.next(timeout)
        if record is not None:
            consumer.ack(record.topic, record.partition, record.offset)
            assert record.value is not None
            seen[name].append(record.value)

    async with running_engine(tansu.bootstrap) as engine:
        one_per_partition("warmup")
        c1 = await engine.consumer(group, "c1", [topic], {})
        await take("c1", c1, WAIT)  # c1 has joined and owns every partition
        c2 = await engine.consumer(group, "c2", [topic], {})
        # Both poll (a rebalance needs c1 to poll too) while records keep coming, until
        # the rebalance has given c2 partitions of its own.
        deadline = time.monotonic() + 2 * WAIT
        round_ = 0
        while not seen["c2"]:
            assert time.monotonic() < deadline, f"c2 never got a partition: {seen}"
            one_per_partition(f"round{round_}")
            round_ += 1
            await asyncio.gather(take("c1", c1, 0.3), take("c2", c2, 0.3))
        while len(set(seen["c1"]) | set(seen["c2"])) < len(produced):
            lost = produced - set(seen["c1"]) - set(seen["c2"])
            assert time.monotonic() < deadline, f"records lost: {sorted(lost)}"
            await asyncio.gather(take("c1", c1, 0.2), take("c2", c2, 0.2))
        assert set(seen["c1"]) | set(seen["c2"]) == produced
        assert seen["c1"] and seen["c2"]
        # Acked records can only come back if a rebalance raced a commit (spec E8).
        duplicates = len(seen["c1"]) + len(seen["c2"]) - len(produced)
        assert duplicates <= 4, f"{duplicates} records delivered twice: {seen}"
        await asyncio.gather(c1.close(), c2.close())


@asyncio_test
async def test_consumer_overrides_apply_and_bad_ones_fail_creation(tansu: TansuBroker) -> None:
    topic = tansu.create_topic(1)
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
        # boolean and a number (kept as its literal text) become property strings.
        latest = await engine.consumer(
            new_group(),
            "c",
            [topic],
            {
                "auto.offset.reset": "latest",
                "enable.partition.eof": False,
                "session.timeout.ms": JsonNumber("2000"),
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
        await latest.close()
        await handle.close(1)


@asyncio_test
async def test_next_times_out_raises_real_errors_and_survives_cancellation(
    tansu: TansuBroker,
) -> None:
    topic = tansu.create_topic(1)
    async with running_engine(tansu.bootstrap) as engine:
        consumer, failing = await asyncio.gather(
            engine.consumer(new_group(), "c", [topic], {}),
            # With no committed offset and reset `error`, librdkafka reports an error.
            engine.consumer(new_group(), "f", [topic], {"auto.offset.reset": "error"}),
        )
        record, elapsed = await timed(consumer.next(0.3))
        assert record is None
        assert 0.3 <= elapsed < 1.0, f"next(0.3) took {elapsed:.2f}s"
        record, elapsed = await timed(consumer.next(0))
        assert record is None and elapsed < 0.3

        with pytest.raises(ConsumeError, match="Local: No offset stored"):
            while await failing.next(WAIT) is None:
                pass
        assert await failing.next(0.2) is None, "the consumer stays usable after an error"

        handle = engine.producer("s")
        handle.produce(topic, None, b"warmup")
        assert await handle.flush(WAIT) == 0
        [warmup] = await consume(consumer, 1)  # joined: later records arrive in ms
        assert warmup.value == b"warmup"

        # Cancel a BLPOP whose fetch is in flight: its whole batch must come out of the
        # next calls, in order, exactly once. Odd rounds cancel once the worker thread
        # has fetched records into the buffer while the loop has not seen them yet; even
        # rounds cancel at once.
        for i in range(6):
            values = [f"r{i}-{n}".encode() for n in range(3)]
            for value in values:
                handle.produce(topic, None, value)
            assert await handle.flush(WAIT) == 0
            waiting = asyncio.create_task(consumer.next(None))
            await asyncio.sleep(0)  # let it submit its fetch
            if i % 2:
                hold_loop_until(lambda: consumer.buffered > 0)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            got = [r.value for r in await consume(consumer, 3)]
            assert got == values, f"round {i}"
        assert await consumer.next(0.3) is None, "a record was delivered twice"
        # Counted when handed out, not when fetched: the cancelled calls count nothing.
        assert engine.stats.get(Stats.CONSUMED) == 1 + 6 * 3

        # close() ends a poll that waits forever, within one poll slice.
        forever = asyncio.create_task(consumer.next(None))
        await asyncio.sleep(0)
        _, elapsed = await timed(consumer.close())
        assert await forever is None
        assert elapsed < 2, f"close took {elapsed:.1f}s"
        await failing.close()
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


@asyncio_test
async def test_stop_closes_what_the_gateway_left_open(tansu: TansuBroker) -> None:
    topic = tansu.create_topic()
    before = rafka_threads()
    engine = KafkaEngine(Stats(), kafka_settings(tansu.bootstrap), EngineOptions())
    await engine.start()
    handle = engine.producer("s")
    handle.produce(topic, None, b"x")
    consumer = await engine.consumer(new_group(), "c", [topic], {})
    assert len(rafka_threads() - before) == 2  # the producer's poll thread, the consumer's
    await engine.stop()
    assert rafka_threads() == before
    assert handle.outstanding() == 0, "stop() must flush the shared producer"
    assert engine.stats.get(Stats.DELIVERED) == 1
    with pytest.raises(ProducerCreationError, match="Engine stopped"):
        engine.producer("late")
    with pytest.raises(ConsumerCreationError, match="Engine stopped"):
        await engine.consumer(new_group(), "late", [topic], {})
    with pytest.raises(AckError):
        consumer.ack(topic, 0, 0)


@asyncio_test
async def test_a_consumer_still_being_created_when_stop_runs_is_closed(
    tansu: TansuBroker,
) -> None:
    topic = tansu.create_topic()
    before = rafka_threads()
    engine = KafkaEngine(Stats(), kafka_settings(tansu.bootstrap), EngineOptions())
    await engine.start()
    creating = asyncio.create_task(engine.consumer(new_group(), "c", [topic], {}))
    await asyncio.sleep(0)  # one step: the task submits the creation and awaits it
    assert rafka_threads() - before, "the creation did not start"
    assert not creating.done()
    await engine.stop()  # marks the engine stopped before the creation's result is seen
    # stop() could not close what did not exist yet: the creation must not hand out
    # a live group member (and its thread) that nobody owns any more.
    with pytest.raises(ConsumerCreationError, match="Engine stopped"):
        await creating
    assert rafka_threads() == before


@asyncio_test
async def test_produce_on_a_handle_outliving_the_engine_is_refused_and_not_counted(
    tansu: TansuBroker,
) -> None:
    topic = tansu.create_topic()
    engine = KafkaEngine(Stats(), kafka_settings(tansu.bootstrap), EngineOptions())
    await engine.start()
    handle = engine.producer("s")
    await engine.stop()  # the shared producer is closed under the handle
    with pytest.raises(ProduceError, match="Producer has been closed"):
        handle.produce(topic, None, b"x")
    with pytest.raises(ProduceError, match="Producer has been closed"):
        handle.produce_many(topic, None, [b"y", b"z"])
    assert handle.outstanding() == 0, "refused records must not stay outstanding"
    assert await handle.close(WAIT) == 0
    assert engine.stats.get(Stats.PRODUCED) == 0
    assert engine.stats.get(Stats.UNFLUSHED) == 0
