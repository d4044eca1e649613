"""The Python client (rafka_client) against a gateway on every engine and against a
plain redis-server, in RESP2 and RESP3: what a user of the client sees."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator

import pytest
import redis
from rafka_client import (
    ConsumeError,
    Consumer,
    FlushTimeout,
    NotHeld,
    ProduceError,
    Producer,
    RangeTooLarge,
    Reader,
    Record,
    UnknownPartition,
)

from backends.base import Stats
from gateway.runner import ServerThread
from tests.client.conftest import Backend, new_group, take
from tests.support.engines import MemoryEngineFactory
from tests.support.fixtures import EngineFactories
from tests.support.gateway import Raw, configured_engine
from tests.support.memory_engine import MemoryEngine, MemoryLog
from tests.support.redis_server import RedisServer


def by_partition(records: list[Record]) -> dict[int, list[int]]:
    offsets: dict[int, list[int]] = defaultdict(list)
    for record in records:
        offsets[record.partition].append(record.offset)
    return offsets


# --- producing and consuming ---------------------------------------------------------------


def test_records_produced_are_consumed_once_and_acked(backend: Backend, protocol: int) -> None:
    topic, group = backend.new_topic(2), new_group()
    values = [b"m%d" % n for n in range(10)]
    with Producer(backend.url, protocol=protocol, batch_size=4) as producer:
        for value in values[:9]:
            producer.produce(topic, value)
        assert producer.buffered == 1, "batches of 4 are sent as they fill up"
        producer.produce(topic, values[9].decode())  # str is sent as UTF-8
    # Flushed on exit: every record is in the log now.
    overrides = {"auto.offset.reset": "earliest"}
    with Consumer(
        group, "first", topic, url=backend.url, protocol=protocol, overrides=overrides
    ) as consumer:
        seen: list[Record] = []
        for record in consumer:  # each record is acked when the loop asks for the next
            seen.append(record)
            if len(seen) == len(values):
                consumer.ack(record)  # the last one, processed before leaving the loop
                break
    assert sorted(r.value or b"" for r in seen) == sorted(values)
    assert all(r.topic == topic and r.key is None for r in seen)
    for partition, offsets in by_partition(seen).items():
        assert offsets == sorted(set(offsets)), f"partition {partition}: {offsets}"
    if backend.double:
        # Plain Redis: the records were popped from the list `topics:<topic>`, the acks
        # pushed to the list `acks`, one per partition, the highest offset.
        assert [(r.partition, r.offset) for r in seen] == [(0, n) for n in range(10)]
        double = redis.Redis.from_url(backend.url)
        assert double.llen(f"topics:{topic}") == 0
        assert double.lrange("acks", -1, -1) == [f"{topic}:0:9".encode()]
        return

    # Everything was acked: the group's next member gets only what comes next.
    with Producer(backend.url, protocol=protocol) as producer:
        producer.produce(topic, b"after")
    with Consumer(group, "second", topic, url=backend.url, protocol=protocol) as successor:
        [after] = take(successor, 1)
        assert after.value == b"after", "acked records were delivered again"


def test_unacked_records_come_again_to_the_next_member(backend: Backend, protocol: int) -> None:
    topic, group = backend.new_topic(1), new_group()
    with Producer(backend.url, protocol=protocol) as producer:
        for n in range(5):
            producer.produce(topic, b"r%d" % n)
    with Consumer(group, "c1", topic, url=backend.url, protocol=protocol, auto_ack=False) as c1:
        first = take(c1, 3)
        c1.ack(first[0], first[1])  # one ack for the partition: offset of r1
        c1.commit()
    assert [r.value for r in first] == [b"r0", b"r1", b"r2"]
    with Consumer(group, "c2", topic, url=backend.url, protocol=protocol) as c2:
        rest = take(c2, 2 if backend.double else 3)
    if backend.double:
        # A Redis list forgets what BLPOP popped: nothing comes again on the double.
        assert [r.value for r in rest] == [b"r3", b"r4"]
        assert redis.Redis.from_url(backend.url).lrange("acks", -1, -1) == [f"{topic}:0:1".encode()]
    else:
        assert [(r.value, r.offset) for r in rest] == [(b"r2", 2), (b"r3", 3), (b"r4", 4)]


def test_one_rpushx_per_topic_and_key_batch(backend: Backend) -> None:
    topic = backend.new_topic(2)
    assert backend.url.startswith("redis://127.0.0.1:")
    port = int(backend.url.rsplit(":", 1)[1])
    with Raw(port) as monitor:
        monitor.command("MONITOR")
        monitor.expect(b"+OK\r\n")
        with Producer(backend.url, batch_size=100) as producer:
            for n in range(3):
                producer.produce(topic, b"a%d" % n, key="a")
                producer.produce(topic, b"x%d" % n)
            producer.produce(topic, b"b0", key=b"b")
            assert producer.send() == 7
        lines: list[bytes] = []
        while b'"DUMP"' not in (lines[-1] if lines else b""):
            lines.append(monitor.read_line())
    sent = [line.split(b"] ", 1)[1].strip() for line in lines if b'"RPUSHX"' in line]
    assert sorted(sent) == sorted(
        [
            f'"RPUSHX" "topics:{topic}:a" "a0" "a1" "a2"'.encode(),
            f'"RPUSHX" "topics:{topic}" "x0" "x1" "x2"'.encode(),
            f'"RPUSHX" "topics:{topic}:b" "b0"'.encode(),
        ]
    )
    if backend.double:
        # RPUSHX stores nothing in a list that does not exist; the client pushes again
        # with RPUSH, so the double holds every record, in order, per topic and key.
        double = redis.Redis.from_url(backend.url)
        assert double.lrange(f"topics:{topic}:a", 0, -1) == [b"a0", b"a1", b"a2"]
        assert double.lrange(f"topics:{topic}", 0, -1) == [b"x0", b"x1", b"x2"]
        assert double.lrange(f"topics:{topic}:b", 0, -1) == [b"b0"]
        return
    # Records of one key share a partition, in order (a consumer sees no keys: values).
    with Consumer(new_group(), "check", topic, url=backend.url) as consumer:
        stored = take(consumer, 7)
    assert sorted(r.value or b"" for r in stored) == sorted(
        [b"a0", b"a1", b"a2", b"x0", b"x1", b"x2", b"b0"]
    )
    keyed_a = [r for r in stored if (r.value or b"").startswith(b"a")]
    assert len({r.partition for r in keyed_a}) == 1, "key a on several partitions"
    assert [r.value for r in sorted(keyed_a, key=lambda r: r.offset)] == [b"a0", b"a1", b"a2"]


def test_refused_records_raise_and_bad_names_are_caught_early(engines: EngineFactories) -> None:
    """The in-memory engine refuses an unknown topic at once (the Kafka engine accepts
    the record and fails its delivery later, visible only in the stats)."""
    factory = engines("memory")
    topic = factory.new_topic(1)
    with ServerThread(factory.gateway_config()) as gateway:
        url = f"redis://127.0.0.1:{gateway.port}"
        with Producer(url) as producer:
            producer.produce(topic, b"fine")
            producer.produce("no-such-topic", b"lost", key="k")
            with pytest.raises(ProduceError) as refused:
                producer.send()
            assert str(refused.value) == "PROD Unknown topic"
            [failure] = refused.value.failures
            assert (failure.topic, failure.key, failure.records) == ("no-such-topic", b"k", 1)
            assert producer.buffered == 0
            for topic_name, key in (("a:b", None), ("", None), ("t", "k:1")):
                with pytest.raises(ValueError):
                    producer.produce(topic_name, b"x", key=key)
        with Reader(url) as reader:
            assert [r.value for r in reader.read(topic, 0)] == [b"fine"]
        with Consumer("grp", "only", topic, url=url), pytest.raises(ConsumeError) as taken:
            Consumer("grp", "only", topic, url=url)
        assert str(taken.value) == "CONS id grp:only is already taken"
        bad: list[tuple[str, str, str | list[str]]] = [
            ("", "n", topic),
            ("g:x", "n", topic),
            ("g", "a name", topic),
            ("g", "n", "a,b"),
            ("g", "n", []),
        ]
        for group, name, topics in bad:
            with pytest.raises(ValueError):
                Consumer(group, name, topics, url=url)


class HeldEngine(MemoryEngine):
    """The in-memory engine, with deliveries held back until `released`: records stay
    outstanding as long as a test wants."""

    released = False

    def _deliver(self) -> None:
        if self.released:
            super()._deliver()
        else:
            asyncio.get_running_loop().call_later(0.01, self._deliver)


@pytest.fixture
def held(engines: EngineFactories) -> Iterator[tuple[ServerThread, HeldEngine, str]]:
    factory = engines("memory")
    config = factory.gateway_config()
    plain = configured_engine(config)
    assert isinstance(plain, MemoryEngine)
    engine = HeldEngine(Stats(), plain.settings, config.engine_options())
    with ServerThread(config, engine=engine) as gateway:
        yield gateway, engine, factory.new_topic(1)


def test_flush_raises_while_records_stay_outstanding(
    held: tuple[ServerThread, HeldEngine, str],
) -> None:
    gateway, engine, topic = held
    url = f"redis://127.0.0.1:{gateway.port}"
    producer = Producer(url)
    for n in range(3):
        producer.produce(topic, b"h%d" % n)
    started = time.monotonic()
    with pytest.raises(FlushTimeout) as timeout:
        producer.flush(0.3)
    assert timeout.value.outstanding == 3
    assert time.monotonic() - started >= 0.3, "flush did not wait"
    engine.released = True
    producer.flush(10)  # now they are durable: no error
    producer.close()

    engine.released = False
    with pytest.raises(FlushTimeout) as on_exit, Producer(url, flush_timeout=0.2) as scoped:
        scoped.produce(topic, b"h3")
    assert on_exit.value.outstanding == 1, "the context manager flushes on exit"

    # A failing block: its records are still flushed on exit, its error is not hidden.
    with pytest.raises(RuntimeError) as failed, Producer(url, flush_timeout=0.2) as scoped:
        scoped.produce(topic, b"h4")
        raise RuntimeError("the block failed")
    assert str(failed.value) == "the block failed"
    [note] = failed.value.__notes__
    assert "the flush on exit failed too: FlushTimeout" in note
    engine.released = True
    with pytest.raises(RuntimeError), Producer(url) as scoped:
        scoped.produce(topic, b"h5")
        raise RuntimeError("failed, but its record is delivered")
    with Reader(url) as reader:
        values = [r.value for r in reader.read(topic, 0)]
    assert values == [b"h0", b"h1", b"h2", b"h3", b"h4", b"h5"]


def test_flush_on_plain_redis_never_waits(redis_server: RedisServer, protocol: int) -> None:
    url = redis_server.url
    topic = f"t-flush-{uuid.uuid4().hex[:8]}"
    with Producer(url, protocol=protocol) as producer:
        producer.produce(topic, b"v")
        started = time.monotonic()
        producer.flush(5)  # DUMP of a missing key is null on Redis: nothing outstanding
        assert time.monotonic() - started < 1
        redis.Redis.from_url(url).set("5000", b"a key DUMP 5000 serialises")
        producer.produce(topic, b"w")
        producer.flush(5)  # a bulk reply: still nothing outstanding
    assert redis.Redis.from_url(url).lrange(f"topics:{topic}", 0, -1) == [b"v", b"w"]
    redis.Redis.from_url(url).delete("5000")


# --- reads by offset ----------------------------------------------------------------------


def test_reader_reads_records_by_offset(backend: Backend, protocol: int) -> None:
    topic = backend.new_topic(2)
    values = [b"v%d" % n for n in range(6)]
    if backend.double:
        # The double of a partition: a list of its values, one per offset from 0.
        redis.Redis.from_url(backend.url).rpush(f"topics:{topic}:0", *values)
        partition = 0
    else:
        with Producer(backend.url, protocol=protocol) as producer:
            for value in values:
                producer.produce(topic, value, key="same")
    with Reader(backend.url, protocol=protocol) as reader:
        if not backend.double:
            nexts = [reader.next_offset(topic, p) for p in (0, 1)]
            partition = nexts.index(6)
            assert nexts[1 - partition] == 0
            assert reader.read(topic, 1 - partition) == [], "an empty partition"
        assert reader.next_offset(topic, partition) == 6
        everything = reader.read(topic, partition)
        assert [(r.offset, r.value) for r in everything] == list(enumerate(values))
        assert {(r.topic, r.partition) for r in everything} == {(topic, partition)}
        if backend.double:
            assert all(r.key is None and r.timestamp_ms is None for r in everything)
        else:
            assert backend.factory is not None
            stamped = backend.factory.has_timestamps  # Dafka's records carry no time
            assert all(r.key == b"same" for r in everything)
            assert all(
                (r.timestamp_ms or 0) > 0 if stamped else r.timestamp_ms is None for r in everything
            )
        assert [r.offset for r in reader.read(topic, partition, 2, 3)] == [2, 3]
        assert [r.offset for r in reader.read(topic, partition, -2, -1)] == [4, 5]
        assert [r.offset for r in reader.read(topic, partition, -100, 1)] == [0, 1]
        assert [r.value for r in reader.read(topic, partition, 4, 4)] == [b"v4"]
        assert reader.read(topic, partition, 6, 100) == [], "past the head"
        assert reader.read(topic, partition, 3, 2) == []
        if backend.double:
            assert reader.next_offset(topic, 7) == 0, "plain Redis: a missing list is empty"
            assert reader.read(topic, 7) == []
        else:
            with pytest.raises(UnknownPartition, match=f"^unknown topic or partition {topic}:7$"):
                reader.next_offset(topic, 7)
            with pytest.raises(UnknownPartition):
                reader.read(topic, 7, 0, 1)


def test_reader_errors_over_the_limit_and_below_retention(engines: EngineFactories) -> None:
    factory = engines("memory")
    assert isinstance(factory, MemoryEngineFactory)
    topic = factory.new_topic(1)
    with ServerThread(factory.gateway_config(max_range=4)) as gateway:
        url = f"redis://127.0.0.1:{gateway.port}"
        with Producer(url) as producer:
            for n in range(10):
                producer.produce(topic, b"v%d" % n)
        with Reader(url) as reader:
            with pytest.raises(RangeTooLarge) as over:
                reader.read(topic, 0)
            assert (over.value.count, over.value.limit) == (10, 4)
            assert [r.offset for r in reader.read(topic, 0, 4, 7)] == [4, 5, 6, 7]
            MemoryLog.named(factory.log_name).expire(topic, 0, 7)
            assert [r.offset for r in reader.read(topic, 0)] == [7, 8, 9]
            with pytest.raises(NotHeld) as gone:
                reader.read(topic, 0, 0, 3)
            assert gone.value.first_held == 7
            assert reader.next_offset(topic, 0) == 10


def test_polling_waits_for_records_produced_meanwhile(backend: Backend, protocol: int) -> None:
    topic, group = backend.new_topic(1), new_group()
    consumer = Consumer(group, "waiting", topic, url=backend.url, protocol=protocol)
    started = time.monotonic()
    assert consumer.poll(0.3) is None
    assert 0.3 <= time.monotonic() - started < 5
    with Producer(backend.url, protocol=protocol) as producer:
        producer.produce(topic, b"late")
    [record] = take(consumer, 1)
    assert record.value == b"late"
    consumer.close()
    consumer.close()  # idempotent
    with pytest.raises(ConsumeError):
        consumer.poll(0)
