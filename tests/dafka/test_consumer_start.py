"""Where the consumer actor starts a partition: GET_HEADS again for partitions an earliest
consumer missed (issue 7), the retention-tail rule, and seek. The consumer talks to a
TestPeer (a real node on the test's inproc tower) that plays producer and store.
"""

from __future__ import annotations

import contextlib
import time

import pytest

from backends.dafka import proto
from backends.dafka.consumer import Consumer
from backends.dafka.test_peer import TestPeer
from tests.dafka.consumers import (
    ConsumerFactory,
    assert_nothing_more,
    direct,
    direct_each,
    expect_fetch,
    link,
    subscribed_consumer,
    take,
)

# --- issue 7: earliest consumers ask the stores for heads again -----------------------------


def test_missed_partition_is_found_by_a_later_get_heads(
    make_consumer: ConsumerFactory, test_peer: TestPeer
) -> None:
    """The stores had nothing of a partition when they got the GET_HEADS sent at subscribe,
    and its producer's RECORDs and HEADs never reach us (it exited, or it is on another
    tower): a GET_HEADS sent later finds it, and every record is delivered."""
    # Subscribing takes the first GET_HEADS: left unanswered.
    consumer = subscribed_consumer(make_consumer, test_peer, **{"consumer/heads_interval": 200})
    again = test_peer.recv_id(proto.GET_HEADS, 3)
    assert (again.topic, again.address) == (b"hello", consumer.address)
    test_peer.send_direct_head(consumer.address, "hello", 2)
    expect_fetch(test_peer, consumer, 0)
    direct_each(test_peer, consumer, "hello", range(3))
    assert take(consumer, 3) == [(0, b"r0"), (1, b"r1"), (2, b"r2")]


def test_stale_head_then_a_later_get_heads_fetches_the_rest(
    make_consumer: ConsumerFactory, test_peer: TestPeer
) -> None:
    """The stores answered with a stale head (only record 0 committed) and served only
    record 0: caught up with what it was told, the consumer still asks again later and
    gets the records committed since, with no producer traffic reaching it."""
    consumer = subscribed_consumer(
        make_consumer,
        test_peer,
        **{"consumer/heads_interval": 200, "consumer/fetch_retry_interval": 100},
    )
    test_peer.send_direct_head(consumer.address, "hello", 0)
    expect_fetch(test_peer, consumer, 0)
    direct(test_peer, consumer, "hello", 0, b"r0")
    assert take(consumer, 1) == [(0, b"r0")]
    test_peer.recv_id(proto.GET_HEADS, 3)  # asked again although nothing was missing
    test_peer.send_direct_head(consumer.address, "hello", 4)
    expect_fetch(test_peer, consumer, 1)
    direct_each(test_peer, consumer, "hello", range(1, 5))
    assert take(consumer, 4) == [(seq, f"r{seq}".encode()) for seq in range(1, 5)]
    assert_nothing_more(consumer)


def test_get_heads_backoff_grows_to_the_interval(
    make_consumer: ConsumerFactory, test_peer: TestPeer
) -> None:
    """After subscribe, GET_HEADS comes again after 100, 200, 400 ms, then every 400 ms
    (the interval): a bounded cost per topic. Only lower bounds are asserted, on the time
    since subscribe (a loaded machine delivers later, never earlier; a gap between two
    deliveries can shrink when the first was late), with 50 ms for timer rounding."""
    consumer = make_consumer(**{"consumer/heads_interval": 400})
    link(test_peer, consumer)
    subscribed = time.monotonic()
    consumer.subscribe("hello")
    test_peer.recv_id(proto.GET_HEADS)
    since = []
    for _ in range(5):
        test_peer.recv_id(proto.GET_HEADS, 3)
        since.append(time.monotonic() - subscribed)
    for got, due in zip(since, (0.1, 0.3, 0.7, 1.1, 1.5), strict=True):
        assert got >= due - 0.05, (since, due)


@pytest.mark.parametrize(("reset", "expected"), [("earliest", 1), ("latest", 0)])
def test_no_more_get_heads_when_off_or_in_latest_mode(
    make_consumer: ConsumerFactory, test_peer: TestPeer, reset: str, expected: int
) -> None:
    """`consumer/heads_interval` = 0 asks only at subscribe, as C does; latest mode never
    asks (upstream scenarios 5 and 14), whatever the interval."""
    interval = 0 if reset == "earliest" else 50
    consumer = make_consumer(reset, **{"consumer/heads_interval": interval})
    link(test_peer, consumer)
    consumer.subscribe("hello")
    test_peer.wait_subscribed(b"Hhello\0")
    asked = 0
    with contextlib.suppress(TimeoutError):
        while True:
            test_peer.recv_id(proto.GET_HEADS, 0.6)
            asked += 1
    assert asked == expected


def test_retention_tail_starts_a_fresh_partition_at_the_oldest_record(
    earliest: Consumer, test_peer: TestPeer
) -> None:
    """Earliest mode: a FETCH answer starting at s > 0 on a partition with nothing delivered
    means the stores keep nothing older, so delivery starts at s."""
    test_peer.send_head("hello", 7)
    expect_fetch(test_peer, earliest, 0)
    direct_each(test_peer, earliest, "hello", (5, 6, 7))
    assert take(earliest, 3) == [(5, b"r5"), (6, b"r6"), (7, b"r7")]
    direct(test_peer, earliest, "hello", 4, b"r4")  # older than what was delivered
    assert_nothing_more(earliest)


def test_seek_before_the_partition_is_known(earliest: Consumer, test_peer: TestPeer) -> None:
    """seek() on an unknown partition applies when it is first seen; nothing before it is
    delivered, and the retention-tail rule does not override it."""
    earliest.seek("hello", test_peer.address, 5)
    test_peer.send_record("hello", 7, b"r7")
    expect_fetch(test_peer, earliest, 5)
    direct(test_peer, earliest, "hello", 6, b"r6")  # not the start: it waits for 5
    direct_each(test_peer, earliest, "hello", (3, 4))
    assert_nothing_more(earliest)
    direct(test_peer, earliest, "hello", 5, b"r5")
    assert take(earliest, 3) == [(5, b"r5"), (6, b"r6"), (7, b"r7")]
    assert_nothing_more(earliest)


def test_seek_on_a_known_partition_fetches_from_there(
    latest: Consumer, test_peer: TestPeer
) -> None:
    test_peer.send_record("hello", 0, b"r0")
    assert take(latest, 1) == [(0, b"r0")]
    latest.seek("hello", test_peer.address, 10)
    expect_fetch(test_peer, latest, 10)
    test_peer.send_record("hello", 1, b"r1")  # before the seek position: never delivered
    direct(test_peer, latest, "hello", 10, b"r10")
    assert take(latest, 1) == [(10, b"r10")]
    assert_nothing_more(latest)
    with pytest.raises(ValueError):
        latest.seek("hello", test_peer.address, -1)
