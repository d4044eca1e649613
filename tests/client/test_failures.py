"""rafka_client when things go wrong: a wait without end on an idle topic, a full gateway
queue, connections lost around a reconnect, values of the wrong type. Each was a bug
found in review, the test failing for the reason its docstring gives. Real gateways
(in-memory engine, Kafka engine without a broker) and a real redis-server, over real
sockets, as the other client tests."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from rafka_client import (
    ConnectionLost,
    Consumer,
    ProduceError,
    Producer,
    RafkaError,
    Reader,
    Record,
)

from gateway.runner import ServerThread
from tests.client.conftest import WAIT, new_group, proxied_consumer, take
from tests.gateway.test_backpressure import kafka_without_broker
from tests.support.fixtures import EngineFactories
from tests.support.gateway import running
from tests.support.proxy import TcpProxy
from tests.support.redis_server import RedisServer


@pytest.fixture(params=["memory", "redis"])
def target(request: pytest.FixtureRequest, engines: EngineFactories) -> Iterator[tuple[str, str]]:
    """(url, topic): a gateway on the in-memory engine, or the plain redis-server double."""
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        yield server.url, f"t-{new_group()}"
        return
    factory = engines("memory")
    topic = factory.new_topic(1)
    with ServerThread(factory.gateway_config()) as gateway:
        yield f"redis://127.0.0.1:{gateway.port}", topic


# --- 1. poll(None) ------------------------------------------------------------------------


def test_poll_without_timeout_waits_without_reconnecting(target: tuple[str, str]) -> None:
    """`poll(None)` is documented as "wait until one comes". The BLMPOP/BLPOP is sent with
    timeout 0 (forever) but its reply is read with the socket timeout, so every
    `socket_timeout` seconds of silence the read times out, the consumer drops its
    session (a new group member, a rebalance) and reconnects; since no BLPOP is answered
    in between, `reconnect_timeout` runs out and poll(None) raises ConnectionLost on an
    idle topic. With the defaults (30 s, 60 s): ConnectionLost after about 90 s."""
    url, topic = target
    consumer = Consumer(
        new_group(), "idle", topic, url=url, socket_timeout=0.5, reconnect_timeout=1.0
    )
    outcome: list[Record | BaseException | None] = []

    def wait_forever() -> None:
        try:
            outcome.append(consumer.poll(None))
        except BaseException as error:
            outcome.append(error)

    waiting = threading.Thread(target=wait_forever, daemon=True)
    waiting.start()
    # Bounded wait for the event "poll(None) returned": it must not happen while the
    # topic is idle (the bug: ConnectionLost after ~1.5 s here).
    waiting.join(3.0)
    assert waiting.is_alive(), f"poll(None) returned on an idle topic: {outcome!r}"
    assert consumer.reconnects == 0, (
        f"poll(None) reconnected {consumer.reconnects} times while simply waiting"
    )
    with Producer(url) as producer:
        producer.produce(topic, b"at last")
    waiting.join(WAIT)
    assert not waiting.is_alive(), "poll(None) never returned the record"
    [record] = outcome
    assert isinstance(record, Record) and record.value == b"at last", record
    consumer.close()


# --- 2. Queue full --------------------------------------------------------------------------


def test_a_full_queue_raises_produce_error_not_connection_lost() -> None:
    """README: when the gateway refuses a batch (`PROD Local: Queue full`) `send()`
    raises ProduceError with `failures`. The gateway first holds a full RPUSHX for
    `produce_block_timeout` (default 60 s), but the producer reads RPUSHX replies with
    the bare `socket_timeout` (default 30 s): it gives up first, raises ConnectionLost
    and drops the connection, while the gateway may still enqueue the batch (so the
    documented retry of a ConnectionLost duplicates it). Scaled down here: a gateway
    bound of 1.5 s, a socket timeout of 0.5 s (the defaults keep the same order)."""
    config = kafka_without_broker()  # Kafka engine, no broker: a queue of one record
    config = dataclasses.replace(config, produce_block_timeout=1.5)
    with running(config) as gateway:
        url = f"redis://127.0.0.1:{gateway.port}"
        producer = Producer(url, socket_timeout=0.5, batch_size=1)
        producer.produce("anything", b"fits", key="k")  # fills the queue (sent at once)
        started = time.monotonic()
        try:
            with pytest.raises(ProduceError) as refused:
                producer.produce("anything", b"no room", key="k")
        except BaseException as error:
            raise AssertionError(
                f"a full queue raised {error!r} after {time.monotonic() - started:.2f}s,"
                " not ProduceError('PROD Local: Queue full')"
            ) from error
        finally:
            producer._link.disconnect()
        assert str(refused.value) == "PROD Local: Queue full"
        [failure] = refused.value.failures
        assert (failure.topic, failure.key, failure.records) == ("anything", b"k", 1)


# --- 3. Reader errors ---------------------------------------------------------------------


def test_reader_raises_a_rafka_error_when_its_connection_is_lost(
    target: tuple[str, str],
) -> None:
    """README "Errors": all errors derive from RafkaError, except that a server that
    cannot be reached at all when a class is created or first used raises redis-py's
    ConnectionError. A Reader whose connection was lost after it worked raises
    redis-py's ConnectionError from read() / next_offset(): not a RafkaError (the
    Producer and the Consumer wrap the same failure)."""
    url, topic = target
    port = int(url.rsplit(":", 1)[1])
    with TcpProxy(port) as proxy:
        reader = Reader(f"redis://127.0.0.1:{proxy.port}")
        reader.read(topic, 0, 0, 0)  # first use: connected, works
        assert proxy.cut() == 1
        try:
            reader.read(topic, 0)
        except RafkaError:
            pass  # documented
        except redis.exceptions.RedisError as error:
            raise AssertionError(
                f"a lost connection raised redis-py's {error!r}, not a RafkaError"
            ) from error
        finally:
            reader.close()


# --- 4. Acks of records from before a reconnect -------------------------------------------


def test_acking_a_record_from_before_a_reconnect_is_ignored(engines: EngineFactories) -> None:
    """Consumer.ack: "Records handed out before a reconnect are ignored: they come
    again." The check is by partition only (`_handed`): once the new session hands out
    any record of the same partition, an old record's ack is sent and commits the
    partition up to it, so records the new session never delivered do not come again."""
    factory = engines("memory")
    topic, group = factory.new_topic(1), new_group()
    values = [b"r%d" % n for n in range(6)]
    with ServerThread(factory.gateway_config()) as gateway:
        url = f"redis://127.0.0.1:{gateway.port}"
        with Producer(url) as producer:
            for value in values:
                producer.produce(topic, value)
        with TcpProxy(gateway.port) as proxy:
            consumer = Consumer(
                group, "c", topic, url=f"redis://127.0.0.1:{proxy.port}", auto_ack=False, batch=1
            )
            before = take(consumer, 5)  # r0..r4 on the first session, none acked
            assert proxy.cut() == 1
            [again] = take(consumer, 1)  # the new session starts again at r0
            assert consumer.reconnects == 1 and again.value == b"r0"
            consumer.ack(before[4])  # from before the reconnect: to be ignored
            consumer.commit()
            consumer.close()
        with Consumer(group, "next", topic, url=url) as successor:
            got = take(successor, 1)
        assert got[0].value == b"r0", (
            f"the next member starts at {got[0].value!r}, not r0 (nothing of the new"
            " session was acked): the ack of r4, handed out before the reconnect, was"
            " sent and committed r0..r4, which the new session never delivered past r0"
        )


# --- 5. A reconnect that ends a poll leaves the consumer "still lost" -----------------------


def test_a_later_loss_reconnects_even_if_the_last_poll_ended_with_a_reconnect(
    target: tuple[str, str],
) -> None:
    """README: the consumer reconnects "at once the first time", and raises ConnectionLost
    only "after reconnect_timeout seconds without a working session". When a poll's
    deadline passes right after a successful reconnect, poll returns None without any
    BLPOP answered, so `_lost_since` (and the backoff) are never reset: the next loss,
    however much later, counts from the first one and poll raises ConnectionLost at once,
    without trying to reconnect to a server that is up."""
    url, topic = target
    port = int(url.rsplit(":", 1)[1])
    with TcpProxy(port) as proxy:
        consumer = proxied_consumer(proxy.port, topic)
        assert consumer.poll(0.1) is None  # a working session
        assert proxy.cut() == 1
        assert consumer.poll(0) is None  # the loss is noticed, reconnected at once
        assert consumer.reconnects == 1
        # The application works on something else for longer than reconnect_timeout,
        # meanwhile the session it has is fine. (Not a synchronisation: the time the
        # application spends between polls is the condition under test.)
        time.sleep(1.2)
        assert proxy.cut() == 1  # one more loss, with the server up
        try:
            assert consumer.poll(0.5) is None
        except ConnectionLost as error:
            raise AssertionError(
                f"poll gave up at once on a reachable server after one loss: {error!r}"
            ) from error
        assert consumer.reconnects == 2
        consumer.close()


# --- 6. Values that are neither bytes nor str -------------------------------------------


def test_a_value_that_is_not_bytes_or_str_is_refused(redis_server: RedisServer) -> None:
    """`produce(topic, value: bytes | str, key: bytes | str | None)`. An int is turned
    into that many zero bytes by `bytes(value)` and produced without a word (redis-py,
    which users of a Redis API know, would send b"3"; a client should refuse it)."""
    topic = f"t-{new_group()}"
    with Producer(redis_server.url) as producer:
        with contextlib.suppress(TypeError):  # the wanted outcome
            producer.produce(topic, 3)  # type: ignore[arg-type]
        producer.send()
    stored = redis.Redis.from_url(redis_server.url).lrange(f"topics:{topic}", 0, -1)
    assert stored == [], f"an int value was produced as {stored!r}"


def test_a_closed_producer_refuses_every_call(redis_server: RedisServer) -> None:
    """After close(), produce() raised ProduceError but send() and flush() opened a new
    connection that nothing closed (redis-py connects on its own)."""
    server = redis.Redis.from_url(redis_server.url)
    before = len(server.client_list())
    producer = Producer(redis_server.url)
    producer.produce(f"t-{new_group()}", b"v")
    producer.close()
    for call in (producer.send, producer.flush, lambda: producer.produce("t", b"v")):
        with pytest.raises(ProduceError, match="producer closed"):
            call()
    assert len(server.client_list()) == before, "a closed producer opened a connection"
