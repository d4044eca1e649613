"""The Kafka engine's producing side against a real Tansu broker: librdkafka's texts,
per-handle flushing, configuration errors, and secrets kept out of its logs.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import structlog

from backends.base import MetadataClientError, ProduceError, ProducerCreationError, Stats
from backends.ports import free_port
from backends.settings import REDACTED
from tests.support.consuming import WAIT, asyncio_test, consume, new_group, timed
from tests.support.kafka import running_engine
from tests.support.tansu import TansuBroker
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.kafka


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
async def test_a_burst_of_failed_deliveries_is_counted_whole_and_logged_in_short(
    tansu: TansuBroker,
) -> None:
    """Delivery reports are served on the event loop: a burst of failures (records that
    expire together) logs ten of them and the count of the rest, not one line each."""
    missing = f"r-missing-{uuid.uuid4().hex[:6]}"
    async with running_engine(tansu.bootstrap) as engine:
        handle = engine.producer("s")
        with structlog.testing.capture_logs() as logs:
            # Not known yet, so accepted; all fail once librdkafka learns it is missing.
            handle.produce_many(missing, None, [b"v%d" % i for i in range(25)])
            assert await handle.flush(WAIT) == 0
        assert engine.stats.get(Stats.DELIVERY_ERRORS) == 25
        one_by_one = [e for e in logs if e["event"] == "Error delivering record"]
        summaries = [e for e in logs if e["event"] == "Error delivering records"]
        assert 0 < len(one_by_one) <= 10 * max(len(summaries), 1), logs
        assert len(one_by_one) + sum(e["more"] for e in summaries) == 25, logs
        assert all("Unknown topic" in e["error"] for e in one_by_one), one_by_one


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
