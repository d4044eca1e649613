"""The store's reader (spec §5.4), driven over inproc by the test peer (spec §8).

Derived scenario 28 (with the fixed FETCH range), STORE_HELLO, and heads pushed to
earliest consumers (issue 7).
"""

from __future__ import annotations

import contextlib
import time
import uuid

import pytest
import zmq

from backends.dafka import proto
from backends.dafka.config import Config
from backends.dafka.consumer import Consumer
from backends.dafka.proto import Message
from backends.dafka.storage import Storage
from backends.dafka.store import Store
from backends.dafka.store.reader import batches
from backends.dafka.test_peer import TestPeer
from backends.dafka.tower import Tower
from tests.dafka.stores import (
    direct_records_of,
    link,
    recv_direct_heads,
    store_records,
)
from tests.support.waiting import wait_until

# --- scenario 28: reader --------------------------------------------------------------------


def test_fetch_answers_exactly_the_requested_range(linked: TestPeer, store: Store) -> None:
    store_records(linked, "range", [b"r%d" % i for i in range(10)])
    got = direct_records_of(linked, "range", 3, 4)
    assert got == [(3, b"r3"), (4, b"r4"), (5, b"r5"), (6, b"r6")]  # C would add r7


def test_a_long_fetch_answer_comes_whole_and_in_order(linked: TestPeer, store: Store) -> None:
    """Sent in several batches (`batches`, below)."""
    contents = [b"r%d" % i + b"x" * (i % 700) for i in range(2_500)]
    store_records(linked, "long", contents)
    assert direct_records_of(linked, "long", 0, 2_500) == list(enumerate(contents))


def test_fetch_answers_are_cut_into_batches_by_count_bytes_and_gaps() -> None:
    records = [(seq, b"x" * 10) for seq in range(5, 12)] + [(20, b"y"), (21, b"z" * 30)]
    got = [
        (first, [len(content) for content in run])
        for first, run in batches(iter(records), count=3, size=25)
    ]
    # Three at most; closed once 25 bytes are in (30 = 3 x 10); a gap starts a new one.
    assert got == [(5, [10, 10, 10]), (8, [10, 10, 10]), (11, [10]), (20, [1, 30])]
    assert list(batches(iter([]))) == []
    assert list(batches(iter(records[:2]), count=2, size=5)) == [(5, [b"x" * 10]), (6, [b"x" * 10])]


def test_a_fetch_answer_keeps_each_records_sequence_across_a_gap(
    linked: TestPeer, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store keeps a partition's records without gaps, so its DB is faked here to
    yield one: the records after it go with their own sequences, not the next ones."""
    store_records(linked, "gap", [b"a"])
    monkeypatch.setattr(
        Storage, "read", lambda *_: iter([(5, b"five"), (6, b"six"), (9, b"nine"), (10, b"ten")])
    )
    got = direct_records_of(linked, "gap", 5, 6)
    assert got == [(5, b"five"), (6, b"six"), (9, b"nine"), (10, b"ten")]


def test_fetch_above_the_head_answers_nothing(linked: TestPeer, store: Store) -> None:
    store_records(linked, "above", [b"a"])
    assert direct_records_of(linked, "above", 1, 10) == []
    assert direct_records_of(linked, "unknown-topic", 0, 10) == []


def test_direct_record_carries_partition_and_subject(linked: TestPeer, store: Store) -> None:
    store_records(linked, "fields", [b"a"])
    linked.send_fetch(linked.address, "fields", 0, 1)
    msg = linked.recv_id(proto.DIRECT_RECORD)
    assert msg.topic == linked.address.encode()  # routed to the requester
    assert (msg.address, msg.subject, msg.sequence, msg.content) == (
        linked.address,
        "fields",
        0,
        b"a",
    )


def test_get_heads_answers_each_partition_of_the_exact_subject(
    linked: TestPeer, store: Store, store_config: Config
) -> None:
    store_records(linked, "heads", [b"0", b"1", b"2"])
    store_records(linked, "heads2", [b"0"])  # prefix collision (spec §10.11)
    with TestPeer(store_config, zmq.Context.instance()) as second:
        link(second, store)
        store_records(second, "heads", [b"0"])
    requester = uuid.uuid4().hex.upper()
    linked.send(Message(proto.GET_HEADS, b"heads", address=requester))
    linked.send(Message(proto.GET_HEADS, b"heads-none", address=requester))
    heads = sorted(recv_direct_heads(linked, requester, 2))
    assert heads == sorted([(linked.address, "heads", 2), (second.address, "heads", 0)])


def test_consumer_hello_answers_heads_of_each_listed_subject(
    linked: TestPeer, store: Store
) -> None:
    store_records(linked, "hello-a", [b"0", b"1"])
    store_records(linked, "hello-b", [b"0"])
    consumer = uuid.uuid4().hex.upper()
    hello = Message(
        proto.CONSUMER_HELLO,
        store.reader_address.encode(),
        address=consumer,
        subjects=["hello-a", "hello-b"],
    )
    linked.send(hello)
    heads = recv_direct_heads(linked, consumer, 2)
    assert sorted(heads) == [(linked.address, "hello-a", 1), (linked.address, "hello-b", 0)]


def test_store_hello_is_sent_when_a_consumer_subscribes(store: Store) -> None:
    consumer = uuid.uuid4().hex.upper()
    sub: zmq.Socket = zmq.Context.instance().socket(zmq.SUB)
    try:
        sub.linger = 0
        sub.rcvtimeo = 5000
        sub.setsockopt(zmq.SUBSCRIBE, b"L" + consumer.encode())
        sub.connect(f"tcp://127.0.0.1:{store.reader_port}")
        msg = proto.decode(sub.recv_multipart())
    finally:
        sub.close()
    assert (msg.id, msg.topic, msg.address) == (
        proto.STORE_HELLO,
        consumer.encode(),
        store.reader_address,
    )


def test_reader_ignores_its_own_writers_fetch(linked: TestPeer, store: Store) -> None:
    store_records(linked, "own", [b"0", b"1"])
    forged = Message(
        proto.FETCH,
        linked.address.encode(),
        address=store.address,
        subject="own",
        sequence=0,
        count=2,
    )
    linked.send(forged)
    linked.send_fetch(linked.address, "sentinel", 0, 1)
    while True:
        msg = linked.recv_id(proto.DIRECT_RECORD)
        assert msg.topic != store.address.encode(), "answered its own writer"
        if msg.subject == "sentinel":
            break


# --- issue 7: heads pushed to earliest consumers ------------------------------------------


def pushed_heads(consumer: TestPeer, topic: str, quiet: float) -> list[int]:
    """Sequences of the DIRECT_HEADs of `topic` routed to `consumer`, until none came for
    `quiet` seconds."""
    heads: list[int] = []
    with contextlib.suppress(TimeoutError):
        while True:
            msg = consumer.recv_id(proto.DIRECT_HEAD, quiet)
            if msg.subject == topic:
                assert msg.topic == consumer.address.encode(), "pushed to someone else"
                heads.append(msg.sequence)
    return heads


@pytest.mark.parametrize("interval", [100, 0])
def test_a_consumer_that_asked_only_at_subscribe_is_told_of_a_new_partition(
    store_config: Config, tower: Tower, interval: int
) -> None:
    """A C earliest consumer sends GET_HEADS once, at subscribe. The partition was not
    there yet; its producer's RECORDs and HEADs never reach the consumer. The store tells
    it anyway, every interval for a duration after the change, then stops (0 = off)."""
    store_config.set("store/push_heads/interval", interval)
    store_config.set("store/push_heads/duration", 400)
    ctx: zmq.Context = zmq.Context.instance()
    with (
        Store(store_config, ctx) as store,
        TestPeer(store_config, ctx) as producer,
        TestPeer(store_config, ctx) as consumer,
    ):
        link(producer, store)
        link(consumer, store)
        store_records(producer, "sentinel", [b"end"])
        consumer.send_get_heads("late")  # the C consumer subscribes: nothing stored yet
        consumer.send_get_heads("sentinel")  # answered after "late": that one was handled
        assert consumer.recv_id(proto.DIRECT_HEAD).subject == "sentinel"
        store_records(producer, "late", [b"r0", b"r1", b"r2"])
        started = time.monotonic()
        heads = pushed_heads(consumer, "late", quiet=0.5)
        if interval == 0:
            assert heads == []
            return
        assert heads and heads[-1] == 2 and heads == sorted(heads), heads
        # Every 100 ms for 400 ms: 4 or 5 pushes of a change, plus the earlier heads of
        # the same records if a push fell between two of the store's batches.
        assert 2 <= len(heads) <= 8, heads
        assert time.monotonic() - started < 3, "the pushes did not stop after the duration"


def test_a_consumer_that_left_is_no_longer_watched(
    linked: TestPeer, store: Store, store_config: Config
) -> None:
    """The reader forgets a consumer when its SUB leaves (the E<uuid> unsubscription), so
    the watch list holds only consumers that are still there."""
    store_records(linked, "watched", [b"r0"])
    config = store_config.copy()
    config.set("consumer/offset/reset", "earliest")
    consumer = Consumer(config, zmq.Context.instance())
    try:
        consumer.subscribe("watched")
        # The stored record reaches the consumer through the store's XPUB (DIRECT_HEAD,
        # then DIRECT_RECORD): its SUB is there, so its leaving can be seen. Closed
        # before that, it never subscribed there and no unsubscription could come.
        record = consumer.get(timeout=10)
        assert record is not None and record.content == b"r0", record
        wait_until(lambda: store.push.watching, 5, "the store did not watch the consumer")
    finally:
        consumer.close()
    wait_until(lambda: not store.push.watching, 5, "the store still watches a closed consumer")
