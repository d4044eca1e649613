"""The Kafka engine against a real Tansu broker: metadata, and its life (threads, stop).

What is librdkafka's own is tested here and in test_producer.py and test_consumer.py;
what every engine must do is in tests/engines/test_contract.py, which runs on this
engine too.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from backends.base import (
    AckError,
    ConsumerCreationError,
    EngineOptions,
    MetadataClientError,
    MetadataError,
    ProduceError,
    ProducerCreationError,
    Stats,
)
from backends.kafka.engine import KafkaEngine
from backends.ports import free_port
from tests.support.consuming import WAIT, asyncio_test, new_group
from tests.support.kafka import kafka_settings, running_engine
from tests.support.tansu import TansuBroker
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.kafka


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


# --- life -----------------------------------------------------------------------------


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
    # One per consumer: the producer's callbacks are served on the loop.
    assert len(rafka_threads() - before) == 2
    await closed.close()
    assert len(rafka_threads() - before) == 1, "a closed consumer's thread is still running"
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
