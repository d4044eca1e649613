"""Helpers of the consumer tests: a test peer linked to a consumer, and what it sends and
expects (the fixture `make_consumer` is in conftest.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from backends.dafka import proto
from backends.dafka.consumer import Consumer
from backends.dafka.node import Node
from backends.dafka.reader import Reader
from backends.dafka.test_peer import TestPeer

ConsumerFactory = Callable[..., Consumer]


def link(peer: TestPeer, consumer: Node) -> None:
    """Wait until both directions between the peer and the consumer carry messages.

    The consumer's subscription on the peer's XPUB proves peer → consumer; a STORE_HELLO
    answered by a CONSUMER_HELLO proves consumer → peer (a handshake alone does not: the
    peer's subscription may still be on its way to the consumer's XPUB, which drops what
    no one subscribed yet).
    """
    peer.wait_subscribed(b"L" + consumer.address.encode())
    deadline = time.monotonic() + 5
    while True:
        peer.send_store_hello(consumer.address)
        try:
            peer.recv_id(proto.CONSUMER_HELLO, 0.2)
            return
        except TimeoutError:
            assert time.monotonic() < deadline, "the consumer never answered a STORE_HELLO"


def subscribe(
    peer: TestPeer, consumer: Consumer | Reader, topic: str, earliest: bool = True
) -> None:
    """Subscribe and wait until the peer's XPUB forwards the topic's RECORDs and HEADs
    (upstream: "a subscription to topic T" + sleep)."""
    consumer.subscribe(topic)
    peer.wait_subscribed(b"M" + topic.encode() + b"\0")
    peer.wait_subscribed(b"H" + topic.encode() + b"\0")
    if earliest:
        get_heads = peer.recv_id(proto.GET_HEADS)
        assert get_heads.topic == topic.encode()


def subscribed_consumer(
    make_consumer: ConsumerFactory, peer: TestPeer, reset: str = "earliest", /, **options: object
) -> Consumer:
    """A consumer (`make_consumer(reset, **options)`) linked to the peer and subscribed to
    "hello"; an earliest one's GET_HEADS is taken."""
    consumer = make_consumer(reset, **options)
    link(peer, consumer)
    subscribe(peer, consumer, "hello", earliest=reset == "earliest")
    return consumer


def direct(peer: TestPeer, consumer: Consumer, topic: str, seq: int, content: bytes) -> None:
    """A FETCH answer: DIRECT_RECORD of the peer's partition, routed to the consumer."""
    peer.send_direct_record(consumer.address, topic, seq, content)


def direct_each(peer: TestPeer, consumer: Consumer, topic: str, sequences: Iterable[int]) -> None:
    """A DIRECT_RECORD `r<seq>` for each of `sequences`."""
    for seq in sequences:
        direct(peer, consumer, topic, seq, f"r{seq}".encode())


def expect_fetch(peer: TestPeer, consumer: Consumer, sequence: int, timeout: float = 5.0) -> None:
    fetch = peer.recv_id(proto.FETCH, timeout)
    assert fetch.topic == peer.address.encode()  # routed to the partition's producer
    assert fetch.address == consumer.address  # answers go to D<consumer>
    assert (fetch.subject, fetch.sequence) == ("hello", sequence)
    assert fetch.count == 100_000 - sequence  # the rest of the 100k bucket


def take(consumer: Consumer, count: int, timeout: float = 5.0) -> list[tuple[int, bytes]]:
    """(sequence, content) of the next `count` records, failing if they do not come."""
    result: list[tuple[int, bytes]] = []
    for _ in range(count):
        record = consumer.get(timeout)
        assert record is not None, f"only {len(result)} of {count} records came: {result}"
        result.append((record.sequence, record.content))
    return result


def assert_nothing_more(consumer: Consumer) -> None:
    extra = consumer.get(0.3)
    assert extra is None, f"unexpected record {extra}"
