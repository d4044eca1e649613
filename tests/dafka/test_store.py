"""The store (spec §5), driven over inproc by the test peer (spec §8).

Derived scenarios 27 (writer), 28 (reader, with the fixed FETCH range), 29 (store-to-store
back-fill), upstream scenario 20, and what this port adds: synced write before ACK, restart,
retention by size and by age, earliest-from-tail, malformed input, a repeated ACK for a
HEAD at or below the stored head, and catch-up from the other stores' heads when no
producer is left.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from backends.dafka import proto
from backends.dafka.beacon import TowerUnreachable
from backends.dafka.config import Config, ConfigError
from backends.dafka.consumer import Consumer
from backends.dafka.producer import Producer
from backends.dafka.proto import Message
from backends.dafka.storage import Retention, Storage
from backends.dafka.store import Store
from backends.dafka.store.retention import retention_policy
from backends.dafka.test_peer import TestPeer
from backends.dafka.tower import Tower
from tests.support.waiting import wait_until


@pytest.fixture
def store_config(dafka_config: Config) -> Config:
    dafka_config.set("store/fetch_retry_interval", 100)
    return dafka_config


@pytest.fixture
def store(store_config: Config, tower: Tower) -> Iterator[Store]:
    with Store(store_config, zmq.Context.instance()) as running:
        yield running


def other_db(config: Config, tmp_path: Path, name: str) -> Config:
    copy = config.copy()
    copy.set("store/db", str(tmp_path / name))
    return copy


def link(peer: TestPeer, store: Store, nth: int = 1) -> None:
    """Wait until the peer and the store's writer and reader are connected both ways.

    `nth`: the store is the nth one the peer sees (M/H/F/G subscriptions are shared).
    """
    peer.wait_connected(store.address)
    peer.wait_connected(store.reader_address)
    peer.wait_subscribed(b"D" + store.address.encode())
    peer.wait_subscribed(b"W" + store.reader_address.encode())
    for prefix in (b"M", b"H", b"F", b"G"):
        wait_subscriptions(peer, prefix, nth)


def wait_subscriptions(peer: TestPeer, prefix: bytes, count: int) -> None:
    wait_until(
        lambda: peer.subscriptions().count(prefix) >= count,
        5,
        f"{count} subscriptions {prefix!r} expected on the peer",
    )


def recv_until_ack(peer: TestPeer, topic: str, sequence: int, timeout: float = 5) -> list[int]:
    """The sequences of the ACKs received until one carries `sequence`."""
    acks: list[int] = []
    deadline = time.monotonic() + timeout
    while not acks or acks[-1] < sequence:
        msg = peer.recv_id(proto.ACK, max(0.01, deadline - time.monotonic()))
        assert msg.topic == peer.address.encode(), "ACK routed to another partition"
        if msg.subject == topic:
            acks.append(msg.sequence)
    return acks


def store_records(peer: TestPeer, topic: str, contents: list[bytes]) -> None:
    for seq, content in enumerate(contents):
        peer.send_record(topic, seq, content)
    recv_until_ack(peer, topic, len(contents) - 1)


def recv_fetch(peer: TestPeer, store: Store, timeout: float = 5) -> Message:
    """The next FETCH sent by `store`'s writer (other FETCHes are skipped)."""
    deadline = time.monotonic() + timeout
    while True:
        msg = peer.recv_id(proto.FETCH, max(0.01, deadline - time.monotonic()))
        if msg.address == store.address:
            return msg


def direct_records_of(peer: TestPeer, topic: str, seq: int, count: int) -> list[tuple[int, bytes]]:
    """What the readers answer to the peer's FETCH, up to the answer of a later sentinel
    FETCH (a reader handles requests in order, so nothing of the first comes after it)."""
    peer.send_fetch(peer.address, topic, seq, count)
    peer.send_fetch(peer.address, "sentinel", 0, 1)
    got: list[tuple[int, bytes]] = []
    while True:
        msg = peer.recv_id(proto.DIRECT_RECORD)
        assert msg.topic == peer.address.encode()
        if msg.subject == "sentinel":
            return got
        assert msg.subject == topic
        got.append((msg.sequence, msg.content))


def direct(store: Store, peer: TestPeer, topic: str, seq: int, content: bytes) -> Message:
    """A DIRECT_RECORD of the peer's partition addressed to `store`'s writer."""
    return Message(
        proto.DIRECT_RECORD,
        store.address.encode(),
        address=peer.address,
        subject=topic,
        sequence=seq,
        content=content,
    )


@pytest.fixture
def linked(test_peer: TestPeer, store: Store) -> TestPeer:
    link(test_peer, store)
    store_records(test_peer, "sentinel", [b"end"])
    return test_peer


# --- scenario 27: writer --------------------------------------------------------------------


def test_in_order_records_are_stored_and_acked_per_batch(linked: TestPeer, store: Store) -> None:
    for seq in range(1000):
        linked.send_record("hello", seq, b"record %d" % seq)
    acks = recv_until_ack(linked, "hello", 999)
    assert acks == sorted(acks), "ACKs must never go backwards"
    assert len(acks) < 1000, "one ACK per partition per batch, not one per record"
    stored = list(store.storage.read(b"hello", linked.address.encode(), 0, 2000))
    assert stored == [(seq, b"record %d" % seq) for seq in range(1000)]


def test_duplicate_record_is_dropped(linked: TestPeer, store: Store) -> None:
    store_records(linked, "dup", [b"a", b"b", b"c"])
    linked.send_record("dup", 1, b"overwrite?")
    linked.send_record("dup", 3, b"d")
    assert recv_until_ack(linked, "dup", 3) == [3]
    assert direct_records_of(linked, "dup", 0, 10) == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d")]


def test_gap_fetches_from_head_plus_one(linked: TestPeer, store: Store) -> None:
    store_records(linked, "gap", [b"0", b"1", b"2"])
    linked.send_record("gap", 5, b"5")
    fetch = recv_fetch(linked, store)
    assert fetch.topic == linked.address.encode()
    assert (fetch.subject, fetch.sequence, fetch.count) == ("gap", 3, 100_000 - 3)
    # Answering the FETCH closes the gap; record 5 was dropped, so it is fetched again.
    for seq in (3, 4):
        linked.send(direct(store, linked, "gap", seq, b"%d" % seq))
    assert recv_until_ack(linked, "gap", 4)[-1] == 4


def test_first_record_not_zero_fetches_from_zero(linked: TestPeer, store: Store) -> None:
    linked.send_record("late", 7, b"7")
    fetch = recv_fetch(linked, store)
    assert (fetch.subject, fetch.sequence, fetch.count) == ("late", 0, 100_000)
    assert store.storage.head(b"late", linked.address.encode()) is None


def test_head_ahead_of_stored_head_fetches(linked: TestPeer, store: Store) -> None:
    store_records(linked, "ahead", [b"0", b"1"])
    linked.send_head("ahead", 1)  # not ahead: nothing
    linked.send_head("ahead", 9)
    fetch = recv_fetch(linked, store)
    assert (fetch.subject, fetch.sequence) == ("ahead", 2)


def test_head_at_or_below_the_stored_head_repeats_the_ack(linked: TestPeer, store: Store) -> None:
    """Regression: a lost ACK was never sent again, so the producer kept its records and
    its close() never returned (e.g. it published before its SUB joined the store)."""
    store_records(linked, "lost-ack", [b"a", b"b", b"c", b"d"])  # ACK(3) received
    # As if that ACK was lost: the producer still holds the records and HEADs them.
    linked.send_head("lost-ack", 3)
    assert recv_until_ack(linked, "lost-ack", 3) == [3]
    # A HEAD below what is stored is answered with the stored head, too.
    linked.send_head("lost-ack", 1)
    assert recv_until_ack(linked, "lost-ack", 3) == [3]
    assert store.storage.head(b"lost-ack", linked.address.encode()) == 3


def test_fetch_is_retried_until_the_gap_is_filled(linked: TestPeer, store: Store) -> None:
    linked.send_head("retry", 2)
    first = recv_fetch(linked, store)
    assert (first.subject, first.sequence) == ("retry", 0)
    # Nobody answers and no more traffic comes: the writer asks again by itself.
    again = recv_fetch(linked, store, timeout=5)
    assert (again.subject, again.sequence) == ("retry", 0)
    for seq in range(3):
        linked.send(direct(store, linked, "retry", seq, b"r"))
    assert recv_until_ack(linked, "retry", 2)[-1] == 2


def store_fetches_within(peer: TestPeer, store: Store, seconds: float) -> list[int]:
    """Sequences of every FETCH the store's writer sends during the next `seconds`."""
    deadline = time.monotonic() + seconds
    fetches = []
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            msg = peer.recv_id(proto.FETCH, remaining)
        except TimeoutError:
            break
        if msg.address == store.address:
            fetches.append(msg.sequence)
    return fetches


def test_retry_gives_up_on_a_gap_nobody_can_fill(
    store_config: Config, tower: Tower, test_peer: TestPeer
) -> None:
    store_config.set("store/fetch_retry_timeout", 300)
    with Store(store_config, zmq.Context.instance()) as store:
        link(test_peer, store)
        test_peer.send_head("dead", 5)
        assert recv_fetch(test_peer, store).subject == "dead"
        store_fetches_within(test_peer, store, 0.5)  # retries before the timeout are fine
        # Well past the timeout and into a new fetch-filter second: no more FETCHes.
        assert store_fetches_within(test_peer, store, 1.2) == []
        # New evidence of the gap re-arms it.
        test_peer.send_head("dead", 6)
        assert recv_fetch(test_peer, store).sequence == 0


def test_ack_is_sent_only_after_the_synced_write(linked: TestPeer, store: Store) -> None:
    assert store.storage.sync, "store/sync defaults to 1"
    partition = linked.address.encode()
    for seq in range(200):
        linked.send_record("durable", seq, b"x" * 100)
    deadline = time.monotonic() + 5
    last = -1
    while last < 199:
        ack = linked.recv_id(proto.ACK, max(0.01, deadline - time.monotonic()))
        if ack.subject != "durable":
            continue
        last = ack.sequence
        # Read the DB the moment the ACK is here: everything it covers is written.
        assert store.storage.head(b"durable", partition) is not None
        stored = [s for s, _ in store.storage.read(b"durable", partition, 0, last + 1)]
        assert stored == list(range(last + 1)), f"ACK {last} came before its write"


# --- scenario 28: reader --------------------------------------------------------------------


def test_fetch_answers_exactly_the_requested_range(linked: TestPeer, store: Store) -> None:
    store_records(linked, "range", [b"r%d" % i for i in range(10)])
    got = direct_records_of(linked, "range", 3, 4)
    assert got == [(3, b"r3"), (4, b"r4"), (5, b"r5"), (6, b"r6")]  # C would add r7


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


def recv_direct_heads(peer: TestPeer, requester: str, n: int) -> list[tuple[str, str, int]]:
    heads = []
    for _ in range(n):
        msg = peer.recv_id(proto.DIRECT_HEAD)
        assert msg.topic == requester.encode()
        heads.append((msg.address, msg.subject, msg.sequence))
    # Nothing else comes for the requester: a third head would arrive before this answer.
    marker = Message(proto.GET_HEADS, b"sentinel", address=requester)
    peer.send(marker)
    extra = peer.recv_id(proto.DIRECT_HEAD)
    assert (extra.subject, extra.address) == ("sentinel", peer.address), f"extra head {extra}"
    return heads


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


# --- scenario 29 and retention tail --------------------------------------------------------


def test_second_store_backfills_from_the_first(
    linked: TestPeer, store: Store, store_config: Config, tmp_path: Path
) -> None:
    contents = [b"rec %d" % i for i in range(20)]
    store_records(linked, "backfill", contents)
    # The peer (the producer) never answers FETCHes: only the first store can.
    with Store(other_db(store_config, tmp_path, "second"), zmq.Context.instance()) as second:
        link(linked, second, nth=2)
        linked.send_head("backfill", 19)
        partition = linked.address.encode()
        wait_until(
            lambda: second.storage.head(b"backfill", partition) == 19,
            10,
            "the second store did not back-fill from the first",
        )
        assert list(second.storage.read(b"backfill", partition, 0, 100)) == list(
            enumerate(contents)
        )


# --- catch-up without a live producer: heads learnt from the other stores ---------------------


def test_writer_asks_a_greeting_reader_for_all_heads_and_fetches_what_it_lacks(
    linked: TestPeer, store: Store
) -> None:
    """The writer runs the consumer's hello handshake with every store reader (the peer
    plays one) and FETCHes what the DIRECT_HEADs show beyond its own heads."""
    for kind in (b"E", b"L"):  # DIRECT_HEAD and STORE_HELLO reach the writer
        linked.wait_subscribed(kind + store.address.encode())
    linked.send_store_hello(store.address)
    hello = linked.recv_id(proto.CONSUMER_HELLO)
    assert (hello.topic, hello.address) == (linked.address.encode(), store.address)
    assert hello.subjects == [""], "the writer asks for the heads of every subject"
    gone = uuid.uuid4().hex.upper()  # a producer that no longer exists
    linked.send(
        Message(
            proto.DIRECT_HEAD, store.address.encode(), address=gone, subject="orphan", sequence=2
        )
    )
    fetch = recv_fetch(linked, store)
    assert (fetch.topic, fetch.subject, fetch.sequence) == (gone.encode(), "orphan", 0)
    for seq in range(3):
        linked.send(
            Message(
                proto.DIRECT_RECORD,
                store.address.encode(),
                address=gone,
                subject="orphan",
                sequence=seq,
                content=b"o%d" % seq,
            )
        )
    wait_until(
        lambda: store.storage.head(b"orphan", gone.encode()) == 2,
        5,
        "the writer did not store what the DIRECT_HEAD announced",
    )
    assert list(store.storage.read(b"orphan", gone.encode(), 0, 10)) == [
        (0, b"o0"),
        (1, b"o1"),
        (2, b"o2"),
    ]


def test_writer_sends_get_heads_for_every_subject_periodically(
    store_config: Config, tower: Tower, test_peer: TestPeer
) -> None:
    store_config.set("store/heads_interval", 100)
    with Store(store_config, zmq.Context.instance()) as store:
        link(test_peer, store)
        for _ in range(2):  # not once: again and again
            msg = test_peer.recv_id(proto.GET_HEADS)
            assert (msg.topic, msg.address) == (b"", store.address)


def test_get_heads_of_the_empty_subject_answers_every_partition(
    linked: TestPeer, store: Store
) -> None:
    """What C's prefix match answers to "" (spec §5.4), and what a catching-up writer asks."""
    store_records(linked, "all-a", [b"0", b"1"])
    store_records(linked, "all-b", [b"0"])
    requester = uuid.uuid4().hex.upper()
    linked.send(Message(proto.GET_HEADS, b"", address=requester))
    heads = recv_direct_heads(linked, requester, 3)
    partition = linked.address
    assert sorted(heads) == [
        (partition, "all-a", 1),
        (partition, "all-b", 0),
        (partition, "sentinel", 0),
    ]


def test_reader_ignores_its_own_writers_heads_requests(linked: TestPeer, store: Store) -> None:
    linked.send(Message(proto.GET_HEADS, b"", address=store.address))
    linked.send(
        Message(
            proto.CONSUMER_HELLO,
            store.reader_address.encode(),
            address=store.address,
            subjects=[""],
        )
    )
    requester = uuid.uuid4().hex.upper()
    linked.send(Message(proto.GET_HEADS, b"sentinel", address=requester))
    # The reader handles requests in order: an answer to its writer would come first.
    msg = linked.recv_id(proto.DIRECT_HEAD)
    assert msg.topic == requester.encode(), "the reader answered its own writer"


def wait_holds(store: Store, topic: str, partition: str, contents: list[bytes]) -> None:
    """Wait until `store` holds exactly `contents` as the partition, from sequence 0."""
    key = (topic.encode(), partition.encode())
    wait_until(
        lambda: store.storage.head(*key) == len(contents) - 1,
        10,
        f"store did not back-fill {topic}/{partition} up to {len(contents) - 1} "
        f"(head {store.storage.head(*key)})",
    )
    assert list(store.storage.read(*key, 0, 1000)) == list(enumerate(contents))


def test_store_started_after_the_producers_are_gone_backfills_from_another_store(
    store_config: Config, tower: Tower, tmp_path: Path
) -> None:
    ctx: zmq.Context = zmq.Context.instance()
    store_config.set("store/heads_interval", 0)  # the hello handshake alone must do it
    with Store(other_db(store_config, tmp_path, "b"), ctx) as b:
        expected: dict[tuple[str, str], list[bytes]] = {}
        for n in range(2):  # two producers, i.e. two partitions of each topic
            with TestPeer(store_config, ctx) as producer:
                link(producer, b)
                for topic in ("orders", "audit"):
                    contents = [b"%s %d" % (topic.encode(), i) for i in range(10 + n)]
                    store_records(producer, topic, contents)
                    expected[(topic, producer.address)] = contents
        # Every producer is gone: A starts on an empty DB and hears no RECORD or HEAD.
        with Store(other_db(store_config, tmp_path, "a"), ctx) as a:
            for (topic, partition), contents in expected.items():
                wait_holds(a, topic, partition, contents)


def test_restarted_store_backfills_what_it_missed_after_the_producer_is_gone(
    store_config: Config, tower: Tower, tmp_path: Path
) -> None:
    ctx: zmq.Context = zmq.Context.instance()
    store_config.set("store/heads_interval", 0)  # the hello handshake alone must do it
    a_config = other_db(store_config, tmp_path, "a")
    contents = [b"r%d" % i for i in range(20)]
    with Store(other_db(store_config, tmp_path, "b"), ctx) as b:
        with TestPeer(store_config, ctx) as producer:
            link(producer, b)
            with Store(a_config, ctx) as a:
                link(producer, a, nth=2)
                store_records(producer, "resume", contents[:5])
                wait_holds(a, "resume", producer.address, contents[:5])
            for seq in range(5, 20):  # A is down
                producer.send_record("resume", seq, contents[seq])
            recv_until_ack(producer, "resume", 19)
            partition = producer.address
        with Store(a_config, ctx) as a:  # on its partial DB, no producer any more
            wait_holds(a, "resume", partition, contents)
            wait_holds(b, "resume", partition, contents)


def test_fetch_below_the_tail_answers_from_the_tail(
    store_config: Config, tower: Tower, test_peer: TestPeer, tmp_path: Path
) -> None:
    store_config.set("store/topics/trimmed/retention/bytes", 30)
    store_config.set("store/retention/check_interval", 20)
    with Store(store_config, zmq.Context.instance()) as store:
        link(test_peer, store)
        store_records(test_peer, "sentinel", [b"end"])
        store_records(test_peer, "trimmed", [b"%010d" % i for i in range(10)])
        partition = test_peer.address.encode()
        wait_until(
            lambda: store.storage.tail(b"trimmed", partition) == 7,
            5,
            "size retention did not trim to the newest 3 records",
        )
        got = direct_records_of(test_peer, "trimmed", 0, 2)
        assert got == [(7, b"0000000007"), (8, b"0000000008")]

        # A new store starts the partition at the first store's tail.
        config = other_db(store_config, tmp_path, "fresh")
        config.set("store/topics/trimmed/retention/bytes", -1)
        with Store(config, zmq.Context.instance()) as fresh:
            link(test_peer, fresh, nth=2)
            test_peer.send_head("trimmed", 9)
            wait_until(
                lambda: fresh.storage.head(b"trimmed", partition) == 9,
                10,
                "the new store did not start the partition at the tail",
            )
            assert fresh.storage.tail(b"trimmed", partition) == 7


# --- restart, retention ---------------------------------------------------------------------


def test_restarted_store_serves_what_it_acknowledged(
    store_config: Config, tower: Tower, test_peer: TestPeer
) -> None:
    with Store(store_config, zmq.Context.instance()) as first:
        link(test_peer, first)
        store_records(test_peer, "sentinel", [b"end"])
        store_records(test_peer, "restart", [b"a", b"b", b"c"])
    with Store(store_config, zmq.Context.instance()) as again:
        link(test_peer, again, nth=2)
        assert direct_records_of(test_peer, "restart", 0, 10) == [(0, b"a"), (1, b"b"), (2, b"c")]
        # The writer continues the partition from its stored head.
        test_peer.send_record("restart", 3, b"d")
        assert recv_until_ack(test_peer, "restart", 3) == [3]


def test_size_retention_per_topic(store_config: Config, tower: Tower, test_peer: TestPeer) -> None:
    store_config.set("store/retention/bytes", 50)
    store_config.set("store/topics/kept/retention/bytes", -1)
    store_config.set("store/retention/check_interval", 20)
    with Store(store_config, zmq.Context.instance()) as store:
        link(test_peer, store)
        store_records(test_peer, "small", [bytes(10)] * 20)
        store_records(test_peer, "kept", [bytes(10)] * 20)
        partition = test_peer.address.encode()
        wait_until(
            lambda: store.storage.tail(b"small", partition) == 15,
            5,
            "retention.bytes 50 did not keep exactly the newest 5 records of 10 bytes",
        )
        assert store.storage.tail(b"kept", partition) == 0
        assert store.storage.head(b"small", partition) == 19


def test_age_retention_deletes_all_but_the_head(
    store_config: Config, tower: Tower, test_peer: TestPeer
) -> None:
    store_config.set("store/retention/ms", 100)
    store_config.set("store/retention/check_interval", 20)
    with Store(store_config, zmq.Context.instance()) as store:
        link(test_peer, store)
        store_records(test_peer, "aging", [b"x"] * 10)
        partition = test_peer.address.encode()
        wait_until(
            lambda: store.storage.tail(b"aging", partition) == 9,
            5,
            "retention.ms 100 did not delete the old records",
        )
        assert store.storage.heads(b"aging") == [(partition, 9)]


# --- robustness ----------------------------------------------------------------------------


def test_malformed_messages_are_ignored(linked: TestPeer, store: Store) -> None:
    address = linked.address.encode()
    garbage = [
        [b"M"],
        [b"Mhello"],
        [b"Mhello\0\x02" + bytes(40), b"content"],  # wrong version
        [b"Mhello\0\x01\x20" + address],  # truncated, no content frame
        [b"Mhello\0\x01\x20" + address + b"\x05hello" + bytes(8)],  # no content frame
        [b"Mhello\0\x01\x20" + address + b"\x02\xff\xfe" + bytes(8), b"x"],  # bad UTF-8
        [b"Hhello\0\x01\x05"],
        [b"F" + address + b"\0\x01\xff"],
        [b"Fx\0\x01\x20" + address + b"\x05hello" + bytes(8) + b"\x00\x00\x00\x05"],
        [b"Ghello\0\x01"],
        [b"W" + store.reader_address.encode() + b"\0\x01\x00\xff\xff\xff\xff"],
        [b"D" + store.address.encode() + b"\0\x01"],
        [b"E" + store.address.encode() + b"\0\x01\x20" + address],  # DIRECT_HEAD, truncated
        [b"L" + store.address.encode() + b"\0\x01\xff"],  # STORE_HELLO, truncated
        [b"L" + store.address.encode() + b"\0\x01\x00"],  # STORE_HELLO from nobody
    ]
    for frames in garbage:
        linked.send_frames(frames)
    store_records(linked, "after-garbage", [b"ok"])
    assert direct_records_of(linked, "after-garbage", 0, 1) == [(0, b"ok")]


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


def test_a_consumer_that_left_is_no_longer_watched(store: Store, store_config: Config) -> None:
    """The reader forgets a consumer when its SUB leaves (the E<uuid> unsubscription), so
    the watch list holds only consumers that are still there."""
    config = store_config.copy()
    config.set("consumer/offset/reset", "earliest")
    consumer = Consumer(config, zmq.Context.instance())
    try:
        consumer.subscribe("watched")
        wait_until(lambda: store.push.watching, 5, "the store did not watch the consumer")
    finally:
        consumer.close()
    wait_until(lambda: not store.push.watching, 5, "the store still watches a closed consumer")


# --- upstream scenario 20 ------------------------------------------------------------------


def test_store_fetches_unacked_records_and_serves_an_earliest_consumer(
    store_config: Config, tower: Tower
) -> None:
    ctx: zmq.Context = zmq.Context.instance()
    producer = Producer(store_config, "TEST", ctx)
    try:
        producer.publish(b"1")
        producer.publish(b"2")
        with Store(store_config, ctx) as store:
            producer.publish(b"3")
            assert producer.close(timeout=10) == 0, "the store did not ACK every record"
            partition = producer.address.encode()
            assert store.storage.head(b"TEST", partition) == 2
            config = store_config.copy()
            config.set("consumer/offset/reset", "earliest")
            consumer = Consumer(config, ctx)
            try:
                consumer.subscribe("TEST")
                got: list[bytes] = []
                for _ in range(3):
                    record = consumer.get(timeout=10)
                    assert record is not None, f"earliest consumer got only {got}"
                    got.append(record.content)
                assert got == [b"1", b"2", b"3"]
            finally:
                consumer.close()
    finally:
        producer.close(timeout=0)


# --- lifetime ------------------------------------------------------------------------------


def store_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("dafka-store")]


def test_close_joins_every_thread_and_releases_the_db(store_config: Config, tower: Tower) -> None:
    store_config.set("store/retention/ms", 60_000)  # also start the retention thread
    store = Store(store_config, zmq.Context.instance())
    assert len(store_threads()) == 3
    store.close()
    store.close()
    assert store_threads() == []
    # RocksDB's lock is released: the same directory opens again in this process.
    with Storage(store_config.get("store/db")) as again:
        assert again.heads(b"anything") == []


def test_unreachable_tower_fails_cleanly(dafka_config: Config) -> None:
    dafka_config.set("beacon/ready_timeout", 200)  # and no tower fixture
    with pytest.raises(TowerUnreachable):
        Store(dafka_config, zmq.Context.instance())
    assert store_threads() == []
    with Storage(dafka_config.get("store/db")) as again:
        assert again.heads(b"anything") == []


@pytest.mark.parametrize("key", ["store/retention/ms", "store/fetch_retry_interval"])
def test_invalid_setting_fails_cleanly(dafka_config: Config, tower: Tower, key: str) -> None:
    """A setting that is not a number is refused before the DB is opened or an actor
    started: nothing keeps running and the DB is not left locked."""
    dafka_config.set(key, "soon")
    with pytest.raises(ConfigError, match=key):
        Store(dafka_config, zmq.Context.instance())
    assert store_threads() == []
    with Storage(dafka_config.get("store/db")) as again:
        assert again.heads(b"anything") == []


def test_retention_policy_defaults_and_per_topic_overrides() -> None:
    assert retention_policy(Config()) is None, "keep forever needs no retention thread"
    assert retention_policy(Config({"store/topics/t/retention/ms": "-1"})) is None
    policy = retention_policy(
        Config({"store/retention/ms": 1000, "store/topics/big/retention/bytes": 5})
    )
    assert policy is not None
    assert policy(b"big") == Retention(ms=1000, bytes=5)
    assert policy(b"other") == Retention(ms=1000, bytes=-1)
    # A topic that cannot be a config path gets the store-wide policy.
    assert policy(b"with space") == Retention(ms=1000, bytes=-1)
    only_one = retention_policy(Config({"store/topics/t/retention/ms": "5"}))
    assert only_one is not None
    assert only_one(b"t") == Retention(ms=5) and only_one(b"u").forever
