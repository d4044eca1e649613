"""The consumer actor (spec §4) and its fixes (§10.10, §10.11, §10.13, §10.14).

Upstream scenarios 1-5 and 11-14 and 16, derived 31, plus exact topics, gap buffering,
the FETCH retry timer, seek and the retention-tail rule. The consumer under test talks to a
TestPeer (a real node on the test's inproc tower) that plays producer and store; the tests
at the end run a real producer over 127.0.0.1 tcp.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import zmq

from backends.dafka import proto
from backends.dafka.config import Config
from backends.dafka.consumer import Consumer, DafkaRecord
from backends.dafka.producer import Producer
from backends.dafka.test_peer import TestPeer
from backends.dafka.tower import Tower
from tests.support.waiting import wait_until

ConsumerFactory = Callable[..., Consumer]


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


def link(peer: TestPeer, consumer: Consumer) -> None:
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


def subscribe(peer: TestPeer, consumer: Consumer, topic: str, earliest: bool = True) -> None:
    """Subscribe and wait until the peer's XPUB forwards the topic's RECORDs and HEADs
    (upstream: "a subscription to topic T" + sleep)."""
    consumer.subscribe(topic)
    peer.wait_subscribed(b"M" + topic.encode() + b"\0")
    peer.wait_subscribed(b"H" + topic.encode() + b"\0")
    if earliest:
        get_heads = peer.recv_id(proto.GET_HEADS)
        assert get_heads.topic == topic.encode()


def direct(peer: TestPeer, consumer: Consumer, topic: str, seq: int, content: bytes) -> None:
    """A FETCH answer: DIRECT_RECORD of the peer's partition, routed to the consumer."""
    peer.send(
        proto.Message(
            proto.DIRECT_RECORD,
            consumer.address.encode(),
            address=peer.address,
            subject=topic,
            sequence=seq,
            content=content,
        )
    )


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
    make_consumer: ConsumerFactory, test_peer: TestPeer
) -> None:
    """Hello trigger (b) of spec §4.4: a store reader's SUB subscribing `W<reader uuid>` on
    the consumer's XPUB gets a CONSUMER_HELLO at once (here a plain SUB plays the reader)."""
    consumer = make_consumer()
    link(test_peer, consumer)
    subscribe(test_peer, consumer, "hello")
    reader = "0123456789ABCDEF0123456789ABCDEF"
    sub: zmq.Socket = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    try:
        sub.setsockopt(zmq.SUBSCRIBE, proto.subscription(proto.CONSUMER_HELLO, reader))
        sub.connect(f"tcp://127.0.0.1:{consumer.port}")
        assert sub.poll(5000), "no CONSUMER_HELLO after the W subscription"
        hello = proto.decode(sub.recv_multipart())
    finally:
        sub.close()
    assert hello.id == proto.CONSUMER_HELLO
    assert (hello.topic, hello.address, hello.subjects) == (
        reader.encode(),
        consumer.address,
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


def test_first_record_earliest_fetches_from_zero(
    make_consumer: ConsumerFactory, test_peer: TestPeer
) -> None:
    """Scenarios 4 and 13; with the gap buffer, the record that revealed the gap is
    delivered too, after record 0 (spec §10.14)."""
    consumer = make_consumer()
    link(test_peer, consumer)
    subscribe(test_peer, consumer, "hello")
    test_peer.send_record("hello", 1, b"CONTENT 1")
    expect_fetch(test_peer, consumer, 0)
    assert_nothing_more(consumer)  # 1 waits for 0
    test_peer.send_record("hello", 0, b"CONTENT")
    record = consumer.get(5)
    assert record == DafkaRecord("hello", test_peer.address, 0, b"CONTENT")
    assert take(consumer, 1) == [(1, b"CONTENT 1")]
    assert_nothing_more(consumer)


def test_first_record_latest_is_delivered_directly(
    make_consumer: ConsumerFactory, test_peer: TestPeer
) -> None:
    """Scenarios 5 and 14: no GET_HEADS, and the first record seen is delivered."""
    consumer = make_consumer("latest")
    link(test_peer, consumer)
    subscribe(test_peer, consumer, "hello", earliest=False)
    test_peer.send_record("hello", 2, b"CONTENT")
    assert consumer.get(5) == DafkaRecord("hello", test_peer.address, 2, b"CONTENT")
    test_peer.send_record("hello", 3, b"NEXT")
    assert take(consumer, 1) == [(3, b"NEXT")]
    with pytest.raises(TimeoutError):
        test_peer.recv_id(proto.GET_HEADS, 0.3)


def test_latest_head_delivers_only_the_newest_record(
    make_consumer: ConsumerFactory, test_peer: TestPeer
) -> None:
    """Latest mode: a HEAD(h) of an unknown partition FETCHes h, and nothing before it."""
    consumer = make_consumer("latest")
    link(test_peer, consumer)
    subscribe(test_peer, consumer, "hello", earliest=False)
    test_peer.send_head("hello", 7)
    expect_fetch(test_peer, consumer, 7)
    for seq in (5, 6, 7):
        direct(test_peer, consumer, "hello", seq, f"r{seq}".encode())
    assert take(consumer, 1) == [(7, b"r7")]
    assert_nothing_more(consumer)


# --- derived 31 and the fixes ------------------------------------------------------------


def test_duplicates_and_late_records_are_not_redelivered(
    make_consumer: ConsumerFactory, test_peer: TestPeer
) -> None:
    consumer = make_consumer("latest")
    link(test_peer, consumer)
    subscribe(test_peer, consumer, "hello", earliest=False)
    test_peer.send_record("hello", 0, b"a")
    test_peer.send_record("hello", 1, b"b")
    assert take(consumer, 2) == [(0, b"a"), (1, b"b")]
    test_peer.send_record("hello", 0, b"a again")
    direct(test_peer, consumer, "hello", 1, b"b again")
    test_peer.send_record("hello", 2, b"c")
    assert take(consumer, 1) == [(2, b"c")]
    assert_nothing_more(consumer)


def test_exact_topic_matching(make_consumer: ConsumerFactory, test_peer: TestPeer) -> None:
    """Spec §10.11: subscribing `hello` never delivers `hello2`, whether the message comes
    through the topic prefix or addressed to the consumer directly."""
    consumer = make_consumer()
    link(test_peer, consumer)
    subscribe(test_peer, consumer, "hello")
    test_peer.send_record("hello2", 0, b"wrong topic")
    test_peer.send_head("hello2", 5)
    direct(test_peer, consumer, "hello2", 0, b"wrong topic, direct")
    test_peer.send(
        proto.Message(
            proto.DIRECT_HEAD,
            consumer.address.encode(),
            address=test_peer.address,
            subject="hello2",
            sequence=3,
        )
    )
    test_peer.send_record("hello", 0, b"right topic")
    assert take(consumer, 1) == [(0, b"right topic")]
    assert_nothing_more(consumer)
    # Neither hello2 HEAD made the consumer FETCH anything.
    with pytest.raises(TimeoutError):
        test_peer.recv_id(proto.FETCH, 0.3)


def test_gap_records_are_buffered_and_delivered_in_order(
    make_consumer: ConsumerFactory, test_peer: TestPeer
) -> None:
    """Spec §10.14: records arriving during a gap wait for the FETCH answer."""
    consumer = make_consumer()
    link(test_peer, consumer)
    subscribe(test_peer, consumer, "hello")
    for seq in (1, 2, 3):
        test_peer.send_record("hello", seq, f"r{seq}".encode())
    expect_fetch(test_peer, consumer, 0)
    assert_nothing_more(consumer)
    direct(test_peer, consumer, "hello", 0, b"r0")
    assert take(consumer, 4) == [(0, b"r0"), (1, b"r1"), (2, b"r2"), (3, b"r3")]
    test_peer.send_record("hello", 4, b"r4")
    assert take(consumer, 1) == [(4, b"r4")]
    assert_nothing_more(consumer)


def test_gap_buffer_is_bounded_and_the_rest_is_fetched(
    make_consumer: ConsumerFactory, test_peer: TestPeer
) -> None:
    """Beyond `consumer/gap_buffer` records are dropped and FETCHed again later."""
    consumer = make_consumer(**{"consumer/gap_buffer": 2, "consumer/fetch_retry_interval": 100})
    link(test_peer, consumer)
    subscribe(test_peer, consumer, "hello")
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
    consumer = make_consumer(**{"consumer/fetch_retry_interval": 200})
    link(test_peer, consumer)
    subscribe(test_peer, consumer, "hello")
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
    consumer = make_consumer(**{"consumer/fetch_retry_interval": 600_000})
    link(test_peer, consumer)
    subscribe(test_peer, consumer, "hello")
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
    for seq in range(3):
        direct(test_peer, consumer, "hello", seq, f"r{seq}".encode())
    assert take(consumer, 3) == [(0, b"r0"), (1, b"r1"), (2, b"r2")]


# --- issue 7: earliest consumers ask the stores for heads again -----------------------------


def test_missed_partition_is_found_by_a_later_get_heads(
    make_consumer: ConsumerFactory, test_peer: TestPeer
) -> None:
    """The stores had nothing of a partition when they got the GET_HEADS sent at subscribe,
    and its producer's RECORDs and HEADs never reach us (it exited, or it is on another
    tower): a GET_HEADS sent later finds it, and every record is delivered."""
    consumer = make_consumer(**{"consumer/heads_interval": 200})
    link(test_peer, consumer)
    subscribe(test_peer, consumer, "hello")  # takes the first GET_HEADS: left unanswered
    again = test_peer.recv_id(proto.GET_HEADS, 3)
    assert (again.topic, again.address) == (b"hello", consumer.address)
    test_peer.send_direct_head(consumer.address, "hello", 2)
    expect_fetch(test_peer, consumer, 0)
    for seq in range(3):
        direct(test_peer, consumer, "hello", seq, f"r{seq}".encode())
    assert take(consumer, 3) == [(0, b"r0"), (1, b"r1"), (2, b"r2")]


def test_stale_head_then_a_later_get_heads_fetches_the_rest(
    make_consumer: ConsumerFactory, test_peer: TestPeer
) -> None:
    """The stores answered with a stale head (only record 0 committed) and served only
    record 0: caught up with what it was told, the consumer still asks again later and
    gets the records committed since, with no producer traffic reaching it."""
    consumer = make_consumer(
        **{"consumer/heads_interval": 200, "consumer/fetch_retry_interval": 100}
    )
    link(test_peer, consumer)
    subscribe(test_peer, consumer, "hello")
    test_peer.send_direct_head(consumer.address, "hello", 0)
    expect_fetch(test_peer, consumer, 0)
    direct(test_peer, consumer, "hello", 0, b"r0")
    assert take(consumer, 1) == [(0, b"r0")]
    test_peer.recv_id(proto.GET_HEADS, 3)  # asked again although nothing was missing
    test_peer.send_direct_head(consumer.address, "hello", 4)
    expect_fetch(test_peer, consumer, 1)
    for seq in range(1, 5):
        direct(test_peer, consumer, "hello", seq, f"r{seq}".encode())
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
    make_consumer: ConsumerFactory, test_peer: TestPeer
) -> None:
    """Earliest mode: a FETCH answer starting at s > 0 on a partition with nothing delivered
    means the stores keep nothing older, so delivery starts at s."""
    consumer = make_consumer()
    link(test_peer, consumer)
    subscribe(test_peer, consumer, "hello")
    test_peer.send_head("hello", 7)
    expect_fetch(test_peer, consumer, 0)
    for seq in (5, 6, 7):
        direct(test_peer, consumer, "hello", seq, f"r{seq}".encode())
    assert take(consumer, 3) == [(5, b"r5"), (6, b"r6"), (7, b"r7")]
    direct(test_peer, consumer, "hello", 4, b"r4")  # older than what was delivered
    assert_nothing_more(consumer)


def test_seek_before_the_partition_is_known(
    make_consumer: ConsumerFactory, test_peer: TestPeer
) -> None:
    """seek() on an unknown partition applies when it is first seen; nothing before it is
    delivered, and the retention-tail rule does not override it."""
    consumer = make_consumer()
    link(test_peer, consumer)
    subscribe(test_peer, consumer, "hello")
    consumer.seek("hello", test_peer.address, 5)
    test_peer.send_record("hello", 7, b"r7")
    expect_fetch(test_peer, consumer, 5)
    direct(test_peer, consumer, "hello", 6, b"r6")  # not the start: it waits for 5
    for seq in (3, 4):
        direct(test_peer, consumer, "hello", seq, f"r{seq}".encode())
    assert_nothing_more(consumer)
    direct(test_peer, consumer, "hello", 5, b"r5")
    assert take(consumer, 3) == [(5, b"r5"), (6, b"r6"), (7, b"r7")]
    assert_nothing_more(consumer)


def test_seek_on_a_known_partition_fetches_from_there(
    make_consumer: ConsumerFactory, test_peer: TestPeer
) -> None:
    consumer = make_consumer("latest")
    link(test_peer, consumer)
    subscribe(test_peer, consumer, "hello", earliest=False)
    test_peer.send_record("hello", 0, b"r0")
    assert take(consumer, 1) == [(0, b"r0")]
    consumer.seek("hello", test_peer.address, 10)
    expect_fetch(test_peer, consumer, 10)
    test_peer.send_record("hello", 1, b"r1")  # before the seek position: never delivered
    direct(test_peer, consumer, "hello", 10, b"r10")
    assert take(consumer, 1) == [(10, b"r10")]
    assert_nothing_more(consumer)
    with pytest.raises(ValueError):
        consumer.seek("hello", test_peer.address, -1)


def test_unsubscribe_stops_delivery_and_keeps_the_offset(
    make_consumer: ConsumerFactory, test_peer: TestPeer
) -> None:
    consumer = make_consumer("latest")
    link(test_peer, consumer)
    subscribe(test_peer, consumer, "hello", earliest=False)
    consumer.subscribe("hello")  # a second subscribe is a no-op
    consumer.subscribe("other")
    assert consumer.subscriptions() == ["hello", "other"]
    test_peer.send_record("hello", 0, b"r0")
    assert take(consumer, 1) == [(0, b"r0")]
    consumer.unsubscribe("hello")
    consumer.unsubscribe("never subscribed")
    assert consumer.subscriptions() == ["other"]
    test_peer.send_record("hello", 1, b"r1")
    assert_nothing_more(consumer)
    consumer.subscribe("hello")
    wait_until(
        lambda: test_peer.subscriptions().count(b"Mhello\0") == 2,
        5,
        "the second subscription to hello did not reach the peer",
    )
    test_peer.send_record("hello", 1, b"r1 again")  # continues after the kept offset 0
    assert take(consumer, 1) == [(1, b"r1 again")]


def test_sink_receives_records_in_order_on_the_consumer_thread(
    make_consumer: ConsumerFactory, test_peer: TestPeer
) -> None:
    received: list[tuple[str, int, bytes]] = []
    consumer = make_consumer(
        "latest",
        sink=lambda r: received.append((threading.current_thread().name, r.sequence, r.content)),
    )
    link(test_peer, consumer)
    subscribe(test_peer, consumer, "hello", earliest=False)
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

    consumer = make_consumer("latest", sink=sink)
    link(test_peer, consumer)
    subscribe(test_peer, consumer, "hello", earliest=False)
    test_peer.send_record("hello", 0, b"r0")
    test_peer.send_record("hello", 1, b"r1")  # after the unsubscribe: not delivered
    wait_until(lambda: consumer.subscriptions() == [], 5, "the sink's unsubscribe did not run")
    assert seen == [(0, ["hello"])]


def test_malformed_messages_are_dropped(
    make_consumer: ConsumerFactory, test_peer: TestPeer
) -> None:
    consumer = make_consumer("latest")
    link(test_peer, consumer)
    subscribe(test_peer, consumer, "hello", earliest=False)
    good = proto.encode(
        proto.Message(
            proto.RECORD, b"hello", address=test_peer.address, subject="hello", sequence=0
        )
    )
    test_peer.send_frames([good[0][:-3], b"truncated"])
    test_peer.send_frames([good[0]])  # no content frame
    test_peer.send_frames([b"Mhello\0\x02" + good[0][8:], b"version 2"])
    test_peer.send_record("hello", 0, b"fine")
    assert take(consumer, 1) == [(0, b"fine")]
    assert_nothing_more(consumer)


def test_close_is_idempotent_and_get_returns_none_after(make_consumer: ConsumerFactory) -> None:
    consumer = make_consumer()
    assert len(consumer.address) == 32
    consumer.close()
    consumer.close()
    assert consumer.get(0.1) is None
    with pytest.raises(RuntimeError, match="closed"):
        consumer.subscribe("hello")


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
