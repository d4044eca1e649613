"""Upstream scenarios that need every actor at once (spec §8.2): producer, store, consumer
on one inproc tower. Scenario 20 (store serving a consumer alone) is in test_store.py."""

from __future__ import annotations

import zmq

from backends.dafka.config import Config
from backends.dafka.consumer import Consumer
from backends.dafka.producer import Producer
from backends.dafka.store import Store
from backends.dafka.tower import Tower


def test_producer_store_and_earliest_consumer_deliver_everything_in_order(
    dafka_config: Config, tower: Tower
) -> None:
    """Scenario 15: a record published before the consumer subscribed comes from the
    store (or the producer's memory) through heads and FETCH, then the live ones, in order."""
    ctx: zmq.Context = zmq.Context.instance()
    consumer_config = dafka_config.copy()
    consumer_config.set("consumer/offset/reset", "earliest")
    with Store(dafka_config, ctx):
        producer = Producer(dafka_config, "hello", ctx)
        consumer = Consumer(consumer_config, ctx)
        try:
            producer.publish(b"HELLO MATE")
            consumer.subscribe("hello")
            producer.publish(b"HELLO ATEM")
            producer.publish(b"HELLO TEMA")
            got: list[tuple[int, bytes]] = []
            for _ in range(3):
                record = consumer.get(timeout=10)
                assert record is not None, f"the consumer delivered only {got}"
                assert (record.subject, record.partition) == ("hello", producer.address)
                got.append((record.sequence, record.content))
            assert got == [(0, b"HELLO MATE"), (1, b"HELLO ATEM"), (2, b"HELLO TEMA")]
            assert consumer.get(0.3) is None
            consumer.unsubscribe("hello")
            assert consumer.subscriptions() == []
            # The store acknowledged everything, so the producer stops without waiting.
            assert producer.close(timeout=10) == 0
        finally:
            consumer.close()
            producer.close(timeout=0)
