"""The consumer actor with a real producer actor over 127.0.0.1 tcp."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from backends.dafka.config import Config
from backends.dafka.consumer import Consumer, DafkaRecord
from backends.dafka.producer import Producer
from backends.dafka.tower import Tower
from tests.dafka.consumers import take
from tests.support.waiting import wait_until

# --- with a real producer over 127.0.0.1 tcp ---------------------------------------------


@pytest.fixture
def tcp_config(dafka_config: Config) -> Iterator[Config]:
    """A tower on 127.0.0.1 tcp ports, and a config pointing at it."""
    config = dafka_config.copy()
    config.set("tower/sub_address", "tcp://127.0.0.1:*")
    config.set("tower/pub_address", "tcp://127.0.0.1:*")
    tower = Tower(config)
    config.set("beacon/sub_address", tower.sub_endpoint)
    config.set("beacon/pub_address", tower.pub_endpoint)
    try:
        yield config
    finally:
        tower.close()


def tcp_node_config(config: Config, **values: str | int) -> Config:
    copy = config.copy()
    for key, value in values.items():
        copy.set(key, value)
    return copy


def test_latest_consumer_with_producer_first_record_is_the_next_one(tcp_config: Config) -> None:
    """Scenario 16: a latest consumer does not get what was published before it
    subscribed. (HEADs are slowed down: a HEAD would, correctly, reveal the newest
    record; here the partition is revealed by the next RECORD.)"""
    producer = Producer(
        tcp_node_config(
            tcp_config, **{"producer/head_interval": 60_000, "producer/terminate_unacked": 1}
        ),
        "hello",
    )
    producer.publish(b"HELLO MATE")
    # publish() only queues: the consumer may exist only once the record is on the wire,
    # or its subscription could reach the producer first (and it would rightly get it).
    wait_until(lambda: producer.sent_count() == 1, 5, "HELLO MATE was never sent")
    consumer = Consumer(tcp_node_config(tcp_config, **{"consumer/offset/reset": "latest"}))
    try:
        consumer.subscribe("hello")
        # The subscription needs the beacon round trip: publish until one arrives.
        deadline = time.monotonic() + 10
        record = None
        while record is None:
            assert time.monotonic() < deadline, "the consumer never received HELLO ATEM"
            producer.publish(b"HELLO ATEM")
            record = consumer.get(0.1)
        assert record.content == b"HELLO ATEM"
        assert record.sequence >= 1
        assert (record.subject, record.partition) == ("hello", producer.address)
        while (more := consumer.get(0.3)) is not None:
            assert more.content == b"HELLO ATEM"
    finally:
        consumer.close()
        assert producer.close() >= 2  # nothing acknowledged: no store


def test_earliest_consumer_gets_unacked_records_from_the_producer(tcp_config: Config) -> None:
    """Without a store, an earliest consumer still gets records published before it
    existed: the producer's HEAD reveals the partition and its memory answers the FETCH."""
    producer = Producer(tcp_node_config(tcp_config, **{"producer/terminate_unacked": 1}), "hello")
    consumer = Consumer(tcp_node_config(tcp_config, **{"consumer/offset/reset": "earliest"}))
    try:
        for i in range(3):
            producer.publish(f"early {i}".encode())
        consumer.subscribe("hello")
        assert take(consumer, 3, timeout=10) == [(i, f"early {i}".encode()) for i in range(3)]
        producer.publish(b"live")
        assert take(consumer, 1) == [(3, b"live")]
    finally:
        consumer.close()
        producer.close()


def test_100k_records_from_producer_to_consumer_in_order(tcp_config: Config) -> None:
    """Every one of 100,000 records of 100 bytes arrives once and in order over tcp."""
    producer = Producer(tcp_node_config(tcp_config, **{"producer/terminate_unacked": 1}), "perf")
    received: list[int] = []
    done = threading.Event()

    def sink(record: DafkaRecord) -> None:
        received.append(record.sequence)
        if len(received) == 100_000:
            done.set()

    consumer = Consumer(
        tcp_node_config(tcp_config, **{"consumer/offset/reset": "earliest"}), sink=sink
    )
    try:
        consumer.subscribe("perf")
        payload = b"x" * 100
        started = time.perf_counter()
        for _ in range(100_000):
            producer.publish(payload)
        assert done.wait(30), f"only {len(received)} of 100000 records arrived"
        elapsed = time.perf_counter() - started
        assert received == list(range(100_000))
        print(f"producer -> consumer: {100_000 / elapsed:,.0f} records/s")
    finally:
        consumer.close()
        producer.close()
