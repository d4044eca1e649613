"""The producer actor (spec §3): upstream scenarios 6, 7, 10 and derived 30.

The producer under test talks to a TestPeer (a real node on the same inproc tower) that
plays the consumer or store side; the throughput check uses a raw SUB over 127.0.0.1 tcp.
"""

from __future__ import annotations

import contextlib
import struct
import threading
import time
from collections.abc import Iterator

import pytest
import zmq

from backends.dafka import proto
from backends.dafka.config import Config
from backends.dafka.producer import Producer
from backends.dafka.test_peer import TestPeer
from backends.dafka.tower import Tower
from tests.support.waiting import wait_until


def make_producer(
    config: Config, topic: str = "hello", values: dict[str, str | int] | None = None
) -> Producer:
    copy = config.copy()
    for key, value in (values or {}).items():
        copy.set(key, value)
    return Producer(copy, topic, zmq.Context.instance())


@pytest.fixture
def producer(dafka_config: Config, tower: Tower) -> Iterator[Producer]:
    """A producer for `hello` that stops at once on close (scenario setup of spec §8.1)."""
    producer = make_producer(dafka_config, values={"producer/terminate_unacked": 1})
    try:
        yield producer
    finally:
        producer.close(timeout=0)


def link(peer: TestPeer, producer: Producer) -> None:
    """Wait until the producer hears the peer (FETCH/ACK subscriptions seen on the peer's
    XPUB) and the peer's SUB is connected to the producer. The peer's subscription may
    still be on its way to the producer's PUB: see `publish`."""
    peer.wait_connected(producer.address)
    peer.wait_subscribed(b"F" + producer.address.encode())
    peer.wait_subscribed(b"K" + producer.address.encode())


def send_ack(peer: TestPeer, producer: Producer, sequence: int) -> None:
    peer.send(
        proto.Message(
            proto.ACK, producer.address.encode(), subject=producer.topic, sequence=sequence
        )
    )


def publish(peer: TestPeer, producer: Producer, contents: list[bytes], first: int = 0) -> None:
    """Publish records `first`... and wait until the peer heard of the last one, by its
    RECORD or (when the peer's subscription reached the producer's PUB only after the
    RECORDs went out, which PUB drops) by a HEAD: a store cannot ACK (nor a consumer FETCH)
    a record before it was published."""
    for content in contents:
        producer.publish(content)
    last = first + len(contents) - 1
    while True:
        msg = peer.recv(5)
        if msg.id in (proto.RECORD, proto.HEAD) and msg.sequence >= last:
            assert msg.sequence == last
            return


def recv_direct(peer: TestPeer, timeout: float = 5.0) -> proto.Message:
    """The next DIRECT_RECORD the peer receives, skipping the producer's RECORDs/HEADs."""
    return peer.recv_id(proto.DIRECT_RECORD, timeout)


def test_create_and_destroy_without_records_terminates_at_once(
    dafka_config: Config, tower: Tower
) -> None:
    """Scenario 10: a producer that published nothing stops at once, even when it would
    otherwise wait for ACKs."""
    producer = make_producer(dafka_config, "dummy")
    assert len(producer.address) == 32 and producer.address == producer.address.upper()
    assert producer.topic == "dummy"
    assert producer.unacked_count() == 0
    started = time.monotonic()
    assert producer.close() == 0
    assert time.monotonic() - started < 2
    assert producer.close() == 0  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        producer.publish(b"late")


def test_fetch_of_unacked_record_answered_with_direct_record(
    producer: Producer, test_peer: TestPeer
) -> None:
    """Scenario 6: a FETCH for a record nobody acknowledged is answered from memory."""
    link(test_peer, producer)
    publish(test_peer, producer, [b"CONTENT"])
    # The peer surely hears the producer now: the next RECORD is observed.
    producer.publish(b"CONTENT 2")
    record = test_peer.recv_id(proto.RECORD)
    assert (record.topic, record.address, record.subject) == (b"hello", producer.address, "hello")
    assert (record.sequence, record.content) == (1, b"CONTENT 2")

    test_peer.send_fetch(producer.address, "hello", 0, 1)
    direct = recv_direct(test_peer)
    assert direct.topic == test_peer.address.encode()  # routed to the requester
    assert direct.address == producer.address  # the partition, not the sender
    assert (direct.subject, direct.sequence, direct.content) == ("hello", 0, b"CONTENT")


def test_heads_are_sent_at_interval_after_first_record(
    producer: Producer, test_peer: TestPeer
) -> None:
    """Scenario 7: after the first record, HEADs with the last sequence keep coming."""
    test_peer.wait_connected(producer.address)
    # Nothing published yet: no HEAD either.
    with pytest.raises(TimeoutError):
        test_peer.recv(0.3)
    producer.publish(b"CONTENT")
    received = [test_peer.recv(2) for _ in range(5)]
    assert all(m.id in (proto.RECORD, proto.HEAD) for m in received), received
    heads = [m for m in received if m.id == proto.HEAD]
    assert len(heads) >= 4
    for head in heads:
        assert (head.topic, head.address, head.subject) == (b"hello", producer.address, "hello")
        assert head.sequence == 0
    producer.publish(b"MORE")
    head = test_peer.recv_id(proto.HEAD, 2)
    while head.sequence == 0:  # a HEAD may have been on its way while we published
        head = test_peer.recv_id(proto.HEAD, 2)
    assert head.sequence == 1


def test_ack_releases_records_up_to_its_sequence(producer: Producer, test_peer: TestPeer) -> None:
    """Derived 30: ACK(n) releases every record <= n, and only those."""
    link(test_peer, producer)
    publish(test_peer, producer, [f"record {i}".encode() for i in range(10)])
    assert producer.unacked_count() == 10
    wait_until(lambda: producer.sent_count() == 10, 5, "sent_count() did not reach 10")
    send_ack(test_peer, producer, 4)
    wait_until(lambda: producer.unacked_count() == 5, 5, "ACK 4 did not release records 0..4")
    send_ack(test_peer, producer, 2)  # older ACKs change nothing
    send_ack(test_peer, producer, 6)
    wait_until(lambda: producer.unacked_count() == 3, 5, "ACK 6 did not release 5..6")
    # An ACK for another topic is not ours to apply.
    test_peer.send(proto.Message(proto.ACK, producer.address.encode(), subject="other", sequence=9))
    send_ack(test_peer, producer, 7)
    wait_until(lambda: producer.unacked_count() == 2, 5, "ACK 7 did not release record 7")


def test_fetch_below_first_unacked_gets_no_answer(producer: Producer, test_peer: TestPeer) -> None:
    """Derived 30: acknowledged records are the stores' to serve, not the producer's."""
    link(test_peer, producer)
    publish(test_peer, producer, [f"record {i}".encode() for i in range(10)])
    send_ack(test_peer, producer, 4)
    wait_until(lambda: producer.unacked_count() == 5, 5, "ACK 4 was not applied")
    test_peer.send_fetch(producer.address, "hello", 2, 3)  # all acked: no answer
    test_peer.send_fetch(producer.address, "hello", 8, 100)  # answered up to the end
    # The FETCHes are handled in order, so the first answer belongs to the second one.
    answers = [recv_direct(test_peer) for _ in range(2)]
    assert [(m.sequence, m.content) for m in answers] == [(8, b"record 8"), (9, b"record 9")]
    with pytest.raises(TimeoutError):
        recv_direct(test_peer, 0.3)


def test_fetch_after_partial_ack_returns_the_right_content(
    producer: Producer, test_peer: TestPeer
) -> None:
    """Derived 30, regression for the C unacked list (spec §10.9): after a partial ACK in
    the middle of a chunk, retransmitted records carry their own content."""
    link(test_peer, producer)
    publish(test_peer, producer, [f"content of {i}".encode() for i in range(1000)])
    send_ack(test_peer, producer, 299)
    wait_until(lambda: producer.unacked_count() == 700, 5, "ACK 299 was not applied")
    # pushed after the partial ACK
    publish(test_peer, producer, [f"content of {i}".encode() for i in range(1000, 1300)], 1000)
    test_peer.send_fetch(producer.address, "hello", 300, 10)
    test_peer.send_fetch(producer.address, "hello", 1290, 50)
    answers = [recv_direct(test_peer) for _ in range(20)]
    expected = [*range(300, 310), *range(1290, 1300)]
    assert [m.sequence for m in answers] == expected
    assert [m.content for m in answers] == [f"content of {i}".encode() for i in expected]
    assert all(m.topic == test_peer.address.encode() for m in answers)


def test_fetch_from_an_unroutable_address_is_dropped(
    producer: Producer, test_peer: TestPeer
) -> None:
    """A FETCH whose requester address holds a NUL (valid on the wire, but no routing topic
    can carry it) is dropped; the producer keeps answering the FETCHes after it."""
    link(test_peer, producer)
    publish(test_peer, producer, [b"CONTENT"])
    address = b"BAD\0ADDRESS"
    body = bytes((len(address),)) + address + b"\x05hello" + struct.pack(">QI", 0, 1)
    test_peer.send_frames([b"F" + producer.address.encode() + b"\0\x01" + body])
    test_peer.send_fetch(producer.address, "hello", 0, 1)
    direct = recv_direct(test_peer)
    assert (direct.sequence, direct.content) == (0, b"CONTENT")
    producer.publish(b"still alive")  # refused if the actor died


def test_close_waits_for_acks_by_default(dafka_config: Config, tower: Tower) -> None:
    """Derived 30: without terminate_unacked, close() blocks until the records are ACKed."""
    producer = make_producer(dafka_config)
    with TestPeer(dafka_config, zmq.Context.instance()) as peer:
        link(peer, producer)
        publish(peer, producer, [f"r{i}".encode() for i in range(3)])
        result: list[int] = []
        closer = threading.Thread(target=lambda: result.append(producer.close()))
        closer.start()
        closer.join(0.3)
        assert closer.is_alive(), "close() returned although nothing was acknowledged"
        send_ack(peer, producer, 1)
        closer.join(0.3)
        assert closer.is_alive(), "close() returned with record 2 still unacked"
        send_ack(peer, producer, 2)
        closer.join(5)
        assert not closer.is_alive(), "close() still blocked after every record was ACKed"
    assert result == [0]


def test_close_timeout_bounds_the_wait(dafka_config: Config, tower: Tower) -> None:
    """close(timeout) gives up after `timeout` seconds and says how many stayed unacked."""
    producer = make_producer(dafka_config)
    producer.publish(b"never acked")
    producer.publish(b"never acked either")
    started = time.monotonic()
    assert producer.close(timeout=0.3) == 2
    assert 0.3 <= time.monotonic() - started < 3


def test_close_gives_up_after_close_timeout_and_says_why(
    dafka_config: Config, tower: Tower, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 7: with no store to acknowledge, close() no longer waits forever (C does):
    it gives up after producer/close_timeout and logs an error naming the cause."""
    producer = make_producer(dafka_config, values={"producer/close_timeout": 300})
    producer.publish(b"never acked")
    started = time.monotonic()
    assert producer.close() == 1
    assert 0.3 <= time.monotonic() - started < 3
    assert "dafka producer closed with records no store acknowledged" in caplog.text
    assert "producer/close_timeout" in caplog.text


def test_a_store_that_acks_only_once_acknowledges_the_first_records(
    dafka_config: Config, tower: Tower
) -> None:
    """Issue 7: a C store ACKs a record only when it stores it, never again. Here the
    store peer's PUB forwards to a subscription only 300 ms after it arrived (ZeroMQ's
    slow joiner, exaggerated): records published as soon as the store hears the
    producer would be stored and their only ACK lost. The producer holds its first
    records until its subscription settled, so they are acknowledged."""
    with TestPeer(dafka_config, zmq.Context.instance(), c_store=True, slow_join_ms=300) as store:
        producer = make_producer(
            dafka_config,
            values={"producer/subscribe_settle": 700, "producer/close_timeout": 3000},
        )
        store.wait_connected(producer.address)
        for i in range(3):
            producer.publish(b"record %d" % i)
        left = producer.close()
        assert left == 0, (
            f"{left} records unacknowledged: the store's ACKs were sent {store.acks_sent}, "
            f"lost {store.acks_dropped} times"
        )
        assert store.stored("hello", producer.address) == [b"record 0", b"record 1", b"record 2"]


def test_last_head_on_close_reveals_the_partition(
    dafka_config: Config, tower: Tower, test_peer: TestPeer
) -> None:
    """Issue 7: a producer that exits before its HEAD timer fired still sends one HEAD, so
    a consumer that missed its RECORDs learns the partition exists."""
    producer = make_producer(
        dafka_config,
        values={"producer/head_interval": 60_000, "producer/subscribe_settle": 0},
    )
    link(test_peer, producer)
    # No HEAD will tell when the peer hears the producer: publish until a RECORD arrives.
    deadline = time.monotonic() + 5
    while True:
        producer.publish(b"probe")
        with contextlib.suppress(TimeoutError):
            test_peer.recv_id(proto.RECORD, 0.05)
            break
        assert time.monotonic() < deadline, "the peer never received a RECORD"
    published = producer.unacked_count()
    assert producer.close(timeout=0) == published
    head = test_peer.recv_id(proto.HEAD, 3)
    assert (head.topic, head.address, head.subject) == (b"hello", producer.address, "hello")
    assert head.sequence == published - 1


def test_terminate_unacked_closes_at_once(dafka_config: Config, tower: Tower) -> None:
    producer = make_producer(dafka_config, values={"producer/terminate_unacked": 1})
    for _ in range(5):
        producer.publish(b"lost")
    started = time.monotonic()
    assert producer.close() == 5
    assert time.monotonic() - started < 2


def test_publish_refuses_what_is_not_bytes(producer: Producer, test_peer: TestPeer) -> None:
    with pytest.raises(TypeError, match="must be bytes"):
        producer.publish("text")  # type: ignore[arg-type]
    producer.publish(bytearray(b"from a bytearray"))  # copied: later changes do not leak
    link(test_peer, producer)
    # A HEAD proves the peer's subscription reached the producer's PUB, which would
    # otherwise drop the DIRECT_RECORD answer (ZeroMQ's slow joiner).
    test_peer.recv_id(proto.HEAD, 5)
    test_peer.send_fetch(producer.address, "hello", 0, 1)
    assert recv_direct(test_peer).content == b"from a bytearray"


def test_invalid_topic_is_refused(dafka_config: Config, tower: Tower) -> None:
    for topic in ("", "a\0b", "x" * 256):
        with pytest.raises(ValueError, match="invalid Dafka topic"):
            make_producer(dafka_config, topic)


def test_publish_from_many_threads_keeps_every_record(
    producer: Producer, test_peer: TestPeer
) -> None:
    """publish() is thread-safe: records of 4 threads all get distinct sequences."""
    link(test_peer, producer)
    publish(test_peer, producer, [b"probe"])  # from now on the peer hears every RECORD

    def publish_many(thread: int) -> None:
        for i in range(500):
            producer.publish(f"{thread}:{i}".encode())

    threads = [threading.Thread(target=publish_many, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    records = [test_peer.recv_id(proto.RECORD) for _ in range(2000)]
    assert [m.sequence for m in records] == list(range(1, 2001))
    assert sorted(m.content for m in records) == sorted(
        f"{t}:{i}".encode() for t in range(4) for i in range(500)
    )
    for t in range(4):  # each thread's records keep their order
        mine = [m.content for m in records if m.content.startswith(f"{t}:".encode())]
        assert mine == [f"{t}:{i}".encode() for i in range(500)]
    assert producer.unacked_count() == 2001


def test_100k_records_reach_a_subscriber_over_tcp(producer: Producer) -> None:
    """Throughput sanity: 100,000 records of 100 bytes published back to back all reach a
    plain SUB connected over 127.0.0.1, in order (the count is asserted, not the speed)."""
    sub: zmq.Socket = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, proto.subscription(proto.RECORD, "hello") + b"\0")
    try:
        sub.connect(f"tcp://127.0.0.1:{producer.port}")
        # PUB drops what it sends before the subscription arrives: publish probes until
        # one comes through.
        deadline = time.monotonic() + 5
        while not sub.poll(20):
            assert time.monotonic() < deadline, "the SUB never received a probe record"
            producer.publish(b"probe")
        payload = b"x" * 100
        started = time.perf_counter()
        for _ in range(100_000):
            producer.publish(payload)
        sequences: list[int] = []
        while len(sequences) < 100_000 and sub.poll(5000):
            while True:
                try:
                    frame1, content = sub.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if content == payload:
                    sequences.append(int.from_bytes(frame1[-8:], "big"))
        elapsed = time.perf_counter() - started
        assert len(sequences) == 100_000
        assert sequences == list(range(sequences[0], sequences[0] + 100_000))
        print(f"producer -> SUB: {100_000 / elapsed:,.0f} records/s")
    finally:
        sub.close()
