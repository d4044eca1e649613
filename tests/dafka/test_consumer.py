"""The consumer actor (spec §4) and its fixes (§10.10, §10.11, §10.13, §10.14).

Upstream scenarios 1-5 and 11-14 and 16, derived 31, plus exact topics, gap buffering,
the FETCH retry timer, unsubscribe, the sink, malformed input and close. The consumer
under test talks to a TestPeer (a real node on the test's inproc tower) that plays
producer and store. Where a partition starts is in test_consumer_start.py; a real
producer over tcp in test_consumer_tcp.py.
"""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from backends.dafka import proto
from backends.dafka.consumer import Consumer, DafkaRecord
from backends.dafka.test_peer import TestPeer
from tests.dafka.consumers import (
    ConsumerFactory,
    assert_nothing_more,
    direct,
    direct_each,
    expect_fetch,
    link,
    subscribe,
    subscribed_consumer,
    take,
)
from tests.support.waiting import wait_until

# --- upstream scenarios ------------------------------------------------------------------


def test_store_hello_without_subscription(
    make_consumer: ConsumerFactory, test_peer: TestPeer
) -> None:
    """Scenarios 1 and 11: STORE_HELLO is answered by a CONSUMER_HELLO with no subjects."""
    consumer = make_consumer()
    assert consumer.subscriptions() == []
    link(test_peer, consumer)
    test_peer.send_store_hello(consumer.address)
    hello = test_peer.recv_id(proto.CONSUMER_HELLO)
    assert hello.topic == test_peer.address.encode()  # routed to the store reader
    assert hello.address == consumer.address
    assert hello.subjects == []


def test_store_hello_with_subscription(make_consumer: ConsumerFactory, test_peer: TestPeer) -> None:
    """Scenarios 2 and 12: the CONSUMER_HELLO lists the subscription (earliest mode)."""
    consumer = make_consumer()
    link(test_peer, consumer)
    assert consumer.subscriptions() == []
    subscribe(test_peer, consumer, "hello")
    assert consumer.subscriptions() == ["hello"]
    test_peer.send_store_hello(consumer.address)
    hello = test_peer.recv_id(proto.CONSUMER_HELLO)
    while not hello.subjects:  # a late answer to link()'s STORE_HELLOs
        hello = test_peer.recv_id(proto.CONSUMER_HELLO)
    assert hello.subjects == ["hello"]
    # STORE_HELLO carries no partition: it must not invent one (spec §10.13).
    test_peer.send_record("hello", 0, b"first")
    assert take(consumer, 1) == [(0, b"first")]


def test_store_reader_subscription_triggers_consumer_hello(
    earliest: Consumer, test_peer: TestPeer
) -> None:
    """Hello trigger (b) of spec §4.4: a store reader's SUB subscribing `W<reader uuid>` on
    the consumer's XPUB gets a CONSUMER_HELLO at once (here a plain SUB plays the reader)."""
    reader = "0123456789ABCDEF0123456789ABCDEF"
    sub: zmq.Socket = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    try:
        sub.setsockopt(zmq.SUBSCRIBE, proto.subscription(proto.CONSUMER_HELLO, reader))
        sub.connect(f"tcp://127.0.0.1:{earliest.port}")
        assert sub.poll(5000), "no CONSUMER_HELLO after the W subscription"
        hello = proto.decode(sub.recv_multipart())
    finally:
        sub.close()
    assert hello.id == proto.CONSUMER_HELLO
    assert (hello.topic, hello.address, hello.subjects) == (
        reader.encode(),
        earliest.address,
        ["hello"],
    )


def test_get_heads_sent_when_subscribing_in_earliest_mode(
    make_consumer: ConsumerFactory, test_peer: TestPeer
) -> None:
    """Scenario 3."""
    consumer = make_consumer()
    link(test_peer, consumer)
    consumer.subscribe("hello")
    get_heads = test_peer.recv_id(proto.GET_HEADS)
    assert get_heads.topic == b"hello"
    assert get_heads.address == consumer.address


def test_first_record_earliest_fetches_from_zero(earliest: Consumer, test_peer: TestPeer) -> None:
    """Scenarios 4 and 13; with the gap buffer, the record that revealed the gap is
    delivered too, after record 0 (spec §10.14)."""
    test_peer.send_record("hello", 1, b"CONTENT 1")
    expect_fetch(test_peer, earliest, 0)
    assert_nothing_more(earliest)  # 1 waits for 0
    test_peer.send_record("hello", 0, b"CONTENT")
    record = earliest.get(5)
    assert record == DafkaRecord("hello", test_peer.address, 0, b"CONTENT")
    assert take(earliest, 1) == [(1, b"CONTENT 1")]
    assert_nothing_more(earliest)


def test_first_record_latest_is_delivered_directly(latest: Consumer, test_peer: TestPeer) -> None:
    """Scenarios 5 and 14: no GET_HEADS, and the first record seen is delivered."""
    test_peer.send_record("hello", 2, b"CONTENT")
    assert latest.get(5) == DafkaRecord("hello", test_peer.address, 2, b"CONTENT")
    test_peer.send_record("hello", 3, b"NEXT")
    assert take(latest, 1) == [(3, b"NEXT")]
    with pytest.raises(TimeoutError):
        test_peer.recv_id(proto.GET_HEADS, 0.3)


def test_latest_head_delivers_only_the_newest_record(latest: Consumer, test_peer: TestPeer) -> None:
    """Latest mode: a HEAD(h) of an unknown partition FETCHes h, and nothing before it."""
    test_peer.send_head("hello", 7)
    expect_fetch(test_peer, latest, 7)
    direct_each(test_peer, latest, "hello", (5, 6, 7))
    assert take(latest, 1) == [(7, b"r7")]
    assert_nothing_more(latest)


# --- derived 31 and the fixes ------------------------------------------------------------


def test_duplicates_and_late_records_are_not_redelivered(
    latest: Consumer, test_peer: TestPeer
) -> None:
    test_peer.send_record("hello", 0, b"a")
    test_peer.send_record("hello", 1, b"b")
    assert take(latest, 2) == [(0, b"a"), (1, b"b")]
    test_peer.send_record("hello", 0, b"a again")
    direct(test_peer, latest, "hello", 1, b"b again")
    test_peer.send_record("hello", 2, b"c")
    assert take(latest, 1) == [(2, b"c")]
    assert_nothing_more(latest)


def test_exact_topic_matching(earliest: Consumer, test_peer: TestPeer) -> None:
    """Spec §10.11: subscribing `hello` never delivers `hello2`, whether the message comes
    through the topic prefix or addressed to the consumer directly."""
    test_peer.send_record("hello2", 0, b"wrong topic")
    test_peer.send_head("hello2", 5)
    direct(test_peer, earliest, "hello2", 0, b"wrong topic, direct")
    test_peer.send(
        proto.Message(
            proto.DIRECT_HEAD,
            earliest.address.encode(),
            address=test_peer.address,
            subject="hello2",
            sequence=3,
        )
    )
    test_peer.send_record("hello", 0, b"right topic")
    assert take(earliest, 1) == [(0, b"right topic")]
    assert_nothing_more(earliest)
    # Neither hello2 HEAD made the consumer FETCH anything.
    with pytest.raises(TimeoutError):
        test_peer.recv_id(proto.FETCH, 0.3)


def test_gap_records_are_buffered_and_delivered_in_order(
    earliest: Consumer, test_peer: TestPeer
) -> None:
    """Spec §10.14: records arriving during a gap wait for the FETCH answer."""
    for seq in (1, 2, 3):
        test_peer.send_record("hello", seq, f"r{seq}".encode())
    expect_fetch(test_peer, earliest, 0)
    assert_nothing_more(earliest)
    direct(test_peer, earliest, "hello", 0, b"r0")
    assert take(earliest, 4) == [(0, b"r0"), (1, b"r1"), (2, b"r2"), (3, b"r3")]
    test_peer.send_record("hello", 4, b"r4")
    assert take(earliest, 1) == [(4, b"r4")]
    assert_nothing_more(earliest)


def test_gap_buffer_is_bounded_and_the_rest_is_fetched(
    make_consumer: ConsumerFactory, test_peer: TestPeer
) -> None:
    """Beyond `consumer/gap_buffer` records are dropped and FETCHed again later."""
    consumer = subscribed_consumer(
        make_consumer, test_peer, **{"consumer/gap_buffer": 2, "consumer/fetch_retry_interval": 100}
    )
    for seq in (1, 2, 3, 4):
        test_peer.send_record("hello", seq, f"r{seq}".encode())
    expect_fetch(test_peer, consumer, 0)
    direct(test_peer, consumer, "hello", 0, b"r0")
    assert take(consumer, 3) == [(0, b"r0"), (1, b"r1"), (2, b"r2")]
    expect_fetch(test_peer, consumer, 3)  # the retry timer asks for what was dropped
    direct(test_peer, consumer, "hello", 3, b"r3")
    direct(test_peer, consumer, "hello", 4, b"r4")
    assert take(consumer, 2) == [(3, b"r3"), (4, b"r4")]
    assert_nothing_more(consumer)


def test_unanswered_fetch_is_retried(make_consumer: ConsumerFactory, test_peer: TestPeer) -> None:
    """Spec §10.14: a FETCH that got no answer is sent again while the gap stays open."""
    consumer = subscribed_consumer(
        make_consumer, test_peer, **{"consumer/fetch_retry_interval": 200}
    )
    test_peer.send_record("hello", 1, b"r1")
    expect_fetch(test_peer, consumer, 0)  # lost: the peer does not answer it
    started = time.monotonic()
    expect_fetch(test_peer, consumer, 0, timeout=3)
    # At the latest in the next second (the fetch filter allows one FETCH per second).
    assert time.monotonic() - started < 2.5
    direct(test_peer, consumer, "hello", 0, b"r0")
    assert take(consumer, 2) == [(0, b"r0"), (1, b"r1")]


def test_head_after_unanswered_fetch_fetches_again(
    make_consumer: ConsumerFactory, test_peer: TestPeer
) -> None:
    """Spec §10.10 (derived 31): in earliest mode "nothing delivered" is -1, so every HEAD
    ahead of the offset asks again, not only the first one (retry timer off here)."""
    consumer = subscribed_consumer(
        make_consumer, test_peer, **{"consumer/fetch_retry_interval": 600_000}
    )
    test_peer.send_head("hello", 2)
    expect_fetch(test_peer, consumer, 0)
    # The fetch filter allows one FETCH per second: HEADs keep coming until one passes.
    deadline = time.monotonic() + 3
    while True:
        test_peer.send_head("hello", 2)
        try:
            expect_fetch(test_peer, consumer, 0, timeout=0.1)
            break
        except TimeoutError:
            assert time.monotonic() < deadline, "a later HEAD never triggered a new FETCH"
    direct_each(test_peer, consumer, "hello", range(3))
    assert take(consumer, 3) == [(0, b"r0"), (1, b"r1"), (2, b"r2")]


# --- the user's side ------------------------------------------------------------------------


def test_unsubscribe_stops_delivery_and_keeps_the_offset(
    latest: Consumer, test_peer: TestPeer
) -> None:
    latest.subscribe("hello")  # a second subscribe is a no-op
    latest.subscribe("other")
    assert latest.subscriptions() == ["hello", "other"]
    test_peer.send_record("hello", 0, b"r0")
    assert take(latest, 1) == [(0, b"r0")]
    latest.unsubscribe("hello")
    latest.unsubscribe("never subscribed")
    assert latest.subscriptions() == ["other"]
    test_peer.send_record("hello", 1, b"r1")
    assert_nothing_more(latest)
    latest.subscribe("hello")
    wait_until(
        lambda: test_peer.subscriptions().count(b"Mhello\0") == 2,
        5,
        "the second subscription to hello did not reach the peer",
    )
    test_peer.send_record("hello", 1, b"r1 again")  # continues after the kept offset 0
    assert take(latest, 1) == [(1, b"r1 again")]


def test_sink_receives_records_in_order_on_the_consumer_thread(
    make_consumer: ConsumerFactory, test_peer: TestPeer
) -> None:
    received: list[tuple[str, int, bytes]] = []
    consumer = subscribed_consumer(
        make_consumer,
        test_peer,
        "latest",
        sink=lambda r: received.append((threading.current_thread().name, r.sequence, r.content)),
    )
    for seq in range(5):
        test_peer.send_record("hello", seq, f"r{seq}".encode())
    wait_until(lambda: len(received) == 5, 5, f"the sink got {received}")
    assert [(seq, content) for _, seq, content in received] == [
        (seq, f"r{seq}".encode()) for seq in range(5)
    ]
    assert {name for name, _, _ in received} == {"dafka-consumer"}
    with pytest.raises(RuntimeError, match="sink"):
        consumer.get(0)


def test_sink_may_call_the_consumer(make_consumer: ConsumerFactory, test_peer: TestPeer) -> None:
    """A sink runs on the consumer thread; calling the consumer from it must not deadlock."""
    seen: list[tuple[int, list[str]]] = []
    consumer: Consumer | None = None

    def sink(record: DafkaRecord) -> None:
        assert consumer is not None
        seen.append((record.sequence, consumer.subscriptions()))
        consumer.unsubscribe("hello")

    consumer = subscribed_consumer(make_consumer, test_peer, "latest", sink=sink)
    test_peer.send_record("hello", 0, b"r0")
    test_peer.send_record("hello", 1, b"r1")  # after the unsubscribe: not delivered
    wait_until(lambda: consumer.subscriptions() == [], 5, "the sink's unsubscribe did not run")
    assert seen == [(0, ["hello"])]


def test_malformed_messages_are_dropped(latest: Consumer, test_peer: TestPeer) -> None:
    good = proto.encode(
        proto.Message(
            proto.RECORD, b"hello", address=test_peer.address, subject="hello", sequence=0
        )
    )
    test_peer.send_frames([good[0][:-3], b"truncated"])
    test_peer.send_frames([good[0]])  # no content frame
    test_peer.send_frames([b"Mhello\0\x02" + good[0][8:], b"version 2"])
    test_peer.send_record("hello", 0, b"fine")
    assert take(latest, 1) == [(0, b"fine")]
    assert_nothing_more(latest)


def test_close_is_idempotent_and_get_returns_none_after(make_consumer: ConsumerFactory) -> None:
    consumer = make_consumer()
    assert len(consumer.address) == 32
    consumer.close()
    consumer.close()
    assert consumer.get(0.1) is None
    with pytest.raises(RuntimeError, match="closed"):
        consumer.subscribe("hello")
