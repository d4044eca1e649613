"""Fixtures of the Dafka engine tests: a fresh inproc tower per test, loopback only; a
store, and a test peer linked to it, for the store tests; consumers for the consumer
tests."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

from backends.dafka.config import Config
from backends.dafka.consumer import Consumer, DafkaRecord
from backends.dafka.store import Store
from backends.dafka.test_peer import TestPeer
from backends.dafka.tower import Tower
from tests.dafka.consumers import ConsumerFactory, subscribed_consumer
from tests.dafka.stores import link_with_sentinel


def make_config(tmp_path: Path) -> Config:
    """A config for one test: its own inproc tower endpoints, fast timers, loopback only."""
    name = uuid.uuid4().hex
    sub = f"inproc://dafka-{name}-tower-sub"
    pub = f"inproc://dafka-{name}-tower-pub"
    return Config(
        {
            "tower/sub_address": sub,
            "tower/pub_address": pub,
            "beacon/sub_address": sub,
            "beacon/pub_address": pub,
            "beacon/interval": 50,
            "beacon/address": "127.0.0.1",  # never advertise (or bind) another interface
            "beacon/ready_timeout": 5000,
            "producer/head_interval": 100,
            "store/db": str(tmp_path / "storedb"),
        }
    )


@pytest.fixture
def dafka_config(tmp_path: Path) -> Config:
    return make_config(tmp_path)


@pytest.fixture
def tower(dafka_config: Config) -> Iterator[Tower]:
    """A running tower on the inproc endpoints of `dafka_config` (shared context)."""
    with Tower(dafka_config, zmq.Context.instance()) as tower:
        yield tower


@pytest.fixture
def test_peer(dafka_config: Config, tower: Tower) -> Iterator[TestPeer]:
    """A fake node on the test's tower (spec §8)."""
    with TestPeer(dafka_config, zmq.Context.instance()) as peer:
        yield peer


@pytest.fixture
def store_config(dafka_config: Config) -> Config:
    dafka_config.set("store/fetch_retry_interval", 100)
    return dafka_config


@pytest.fixture
def store(store_config: Config, tower: Tower) -> Iterator[Store]:
    with Store(store_config, zmq.Context.instance()) as running:
        yield running


@pytest.fixture
def linked(test_peer: TestPeer, store: Store) -> TestPeer:
    link_with_sentinel(test_peer, store)
    return test_peer


@pytest.fixture
def make_consumer(dafka_config: Config, tower: Tower) -> Iterator[ConsumerFactory]:
    """Consumers on the test's tower (`reset` = consumer/offset/reset), closed at the end."""
    made: list[Consumer] = []

    def make(
        reset: str = "earliest",
        sink: Callable[[DafkaRecord], object] | None = None,
        **values: str | int,
    ) -> Consumer:
        config = dafka_config.copy()
        config.set("consumer/offset/reset", reset)
        for key, value in values.items():
            config.set(key, value)
        consumer = Consumer(config, zmq.Context.instance(), sink=sink)
        made.append(consumer)
        return consumer

    yield make
    for consumer in made:
        consumer.close()


@pytest.fixture
def earliest(make_consumer: ConsumerFactory, test_peer: TestPeer) -> Consumer:
    """A consumer in earliest mode linked to the test peer, subscribed to "hello" (its
    GET_HEADS taken)."""
    return subscribed_consumer(make_consumer, test_peer)


@pytest.fixture
def latest(make_consumer: ConsumerFactory, test_peer: TestPeer) -> Consumer:
    """A consumer in latest mode linked to the test peer, subscribed to "hello"."""
    return subscribed_consumer(make_consumer, test_peer, "latest")
