"""What every node of ours shares (`node.Node`): a SUB that keeps every subscription it is
given, however many at once. A SUB drops the subscriptions past its send high-water mark
(1,000 by default): the gateway's reader, told about 500+ topics at once (a BLPOP key
listing them), lost some of its M/H subscriptions for good, and with them the live
records and heads of those topics."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from backends.dafka.config import Config
from backends.dafka.reader import Event, Reader
from backends.dafka.test_peer import TestPeer
from backends.dafka.tower import Tower

TOPICS = 1500  # M and H each: 3,000 subscriptions


@pytest.fixture
def reader(dafka_config: Config, tower: Tower) -> Iterator[Reader]:
    def sink(events: list[Event]) -> None:
        pass  # no partition is started: nothing is delivered

    reader = Reader(dafka_config, sink, zmq.Context.instance())
    try:
        yield reader
    finally:
        reader.close()


def test_a_reader_told_many_topics_at_once_keeps_every_subscription(
    reader: Reader, test_peer: TestPeer
) -> None:
    test_peer.wait_connected(reader.address)
    test_peer.wait_subscribed(b"L" + reader.address.encode())  # the reader's SUB joined
    for number in range(TOPICS):
        reader.subscribe(f"topic-{number:04d}")
    last = f"topic-{TOPICS - 1:04d}".encode()
    test_peer.wait_subscribed(b"M" + last, timeout=10)
    test_peer.wait_subscribed(b"H" + last, timeout=10)
