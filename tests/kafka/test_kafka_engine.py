"""The Kafka engine against a real Tansu broker (the session fixture `tansu`): what is
librdkafka's own (error texts, properties, batching, threads). What every engine must
do is in tests/engines/test_contract.py, which runs on this engine too.

Group joins cost half of session.timeout.ms on Tansu (about 1 s here), so tests reuse
their consumers and start the ones that are independent concurrently.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

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
from backends.kafka.settings import KafkaSettings, parse_settings
from backends.settings import REDACTED, JsonNumber, json_decoder
from tests.support.consuming import WAIT, asyncio_test, consume, new_group, timed
from tests.support.kafka import kafka_document
from tests.support.tansu import TansuBroker, free_port
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.kafka


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


# --- metadata -------------------------------------------------------------------------


@asyncio_test
async def test_unreachable_broker_gives_metadata_error_and_counts_unknown_events() -> None:
    async with running_engine(f"127.0.0.1:{free_port()}", metadata_timeout=0.3) as engine:
        with pytest.raises(MetadataError) as failure:
            await engine.topics()
        # librdkafka's own text, without confluent-kafka's "Failed to get metadata: ".
        assert str(failure.value).startswith("Local: "), str(failure.value)
        # "Connect ... failed: Connection refused" / "all brokers down" reach error_cb.
        await wait_until_async(
            lambda: engine.stats.get(Stats.UNKNOWN_EVENTS) >= 1, WAIT, "an unknown producer event"
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
        await wait_until_async(
            lambda: engine.stats.get(Stats.DELIVERY_ERRORS) == 2, WAIT, "two delivery errors"
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


@asyncio_test
async def test_closing_and_stopping_leave_no_thread_running(tansu: TansuBroker) -> None:
    topic = tansu.create_topic()
    before = rafka_threads()
    engine = KafkaEngine(Stats(), kafka_settings(tansu.bootstrap), EngineOptions())
    await engine.start()
    handle = engine.producer("s")
    handle.produce(topic, None, b"x")
    closed, left_open = await asyncio.gather(
        engine.consumer(new_group(), "closed", [topic], {}),
        engine.consumer(new_group(), "open", [topic], {}),
    )
    # The producer's poll thread, one per consumer.
    assert len(rafka_threads() - before) == 3
    await closed.close()
    assert len(rafka_threads() - before) == 2, "a closed consumer's thread is still running"
    await engine.stop()
    assert rafka_threads() == before
    assert handle.outstanding() == 0, "stop() must flush the shared producer"
    with pytest.raises(ProducerCreationError, match=r"^Engine stopped$"):
        engine.producer("late")
    with pytest.raises(ConsumerCreationError, match=r"^Engine stopped$"):
        await engine.consumer(new_group(), "late", [topic], {})
    with pytest.raises(MetadataClientError, match=r"^Engine stopped$"):
        await engine.topics()
    with pytest.raises(AckError, match=r"^Consumer closed$"):
        left_open.ack(topic, 0, 0)


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
