"""One producer actor for many partitions (`publisher.Publisher`): each partition keeps its
own address on the wire, so a real store stores and ACKs each of them, a consumer FETCHes
each from it, and a C-like store that ACKs once reaches each partition's subscription;
and what a partition costs stays constant (no thread, no socket of its own).

Stores, consumers and the test peer are real nodes on the test's inproc tower, talking
over 127.0.0.1 TCP."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
import zmq

from backends.dafka import proto
from backends.dafka.config import Config
from backends.dafka.publisher import Partition, Publisher
from backends.dafka.store import Store
from backends.dafka.test_peer import TestPeer
from backends.dafka.tower import Tower
from tests.dafka.consumers import ConsumerFactory
from tests.support.waiting import wait_until

TOPICS = 10
PER_TOPIC = 5  # partitions of each topic
RECORDS = 20  # per partition


def address() -> str:
    return uuid.uuid4().hex.upper()


@pytest.fixture
def publisher(dafka_config: Config, tower: Tower) -> Iterator[Publisher]:
    publisher = Publisher(dafka_config, zmq.Context.instance())
    try:
        yield publisher
    finally:
        publisher.close(timeout=0)


def open_many(publisher: Publisher) -> list[Partition]:
    return [
        publisher.open(f"topic-{t}", address=address())
        for t in range(TOPICS)
        for _ in range(PER_TOPIC)
    ]


def contents(partition: Partition) -> list[bytes]:
    return [f"{partition.address}:{i}".encode() for i in range(RECORDS)]


def publish_all(partitions: list[Partition]) -> None:
    """Records of every partition, interleaved (one record of each in turn)."""
    for i in range(RECORDS):
        for partition in partitions:
            assert partition.publish(contents(partition)[i]) == i


def all_acked(partitions: list[Partition]) -> bool:
    return all(partition.unacked_count() == 0 for partition in partitions)


def wait_acked(partitions: list[Partition], timeout: float, what: str) -> None:
    """Wait until every record of `partitions` is acknowledged; the failure says how
    many were not."""
    try:
        wait_until(lambda: all_acked(partitions), timeout, what)
    except AssertionError as late:
        left = sum(partition.unacked_count() for partition in partitions)
        raise AssertionError(f"{late} ({left} records still unacknowledged)") from None


def wait_sent(partitions: list[Partition], count: int = RECORDS) -> None:
    wait_until(lambda: all(p.sent_count() == count for p in partitions), 5, "every record sent")


def stored(store: Store, partition: Partition) -> list[bytes]:
    records = store.storage.records(partition.topic.encode(), partition.address.encode())
    return [content for _, content in records]


def test_a_store_stores_and_acks_every_partition_of_one_publisher(
    publisher: Publisher, store: Store
) -> None:
    partitions = open_many(publisher)
    acked: dict[str, int] = {}
    lock = threading.Lock()

    def on_ack(partition: Partition, last: int) -> None:
        with lock:
            acked[partition.address] = last

    with_callback = publisher.open(
        "topic-0", address=address(), on_ack=lambda last: on_ack(with_callback, last)
    )
    partitions.append(with_callback)
    publish_all(partitions)
    wait_acked(partitions, 10, "ACKs for every partition")
    for partition in partitions:
        assert stored(store, partition) == contents(partition), partition.address
    assert acked == {with_callback.address: RECORDS - 1}
    assert publisher.close(timeout=5) == 0


def test_a_store_that_starts_later_catches_up_on_every_partition(
    publisher: Publisher, store_config: Config, tower: Tower
) -> None:
    partitions = open_many(publisher)
    publish_all(partitions)
    wait_sent(partitions)
    assert publisher.unacked_count() == len(partitions) * RECORDS  # no store yet
    with Store(store_config, zmq.Context.instance()) as store:
        # The store learns each partition from its HEADs and FETCHes what it missed.
        wait_acked(partitions, 15, "a late store catching up")
        for partition in partitions:
            assert stored(store, partition) == contents(partition), partition.address


def test_a_store_that_connects_after_the_first_records_has_them_long_before_a_head_interval(
    dafka_config: Config, store_config: Config, tower: Tower
) -> None:
    """A fresh gateway's first RPUSHX goes out before the store has connected to the new
    actor (its PUB drops it) and reaches the store through a HEAD. The first HEADs come
    50 ms after the first record, then 100, 200, ... ms later: not one head_interval
    after (here 30 s, in which a DUMP would wait that long)."""
    dafka_config.set("producer/head_interval", 30_000)
    publisher = Publisher(dafka_config, zmq.Context.instance())
    try:
        partition = publisher.open("first", address=address())
        partition.publish(b"first")
        wait_sent([partition], count=1)
        assert partition.unacked_count() == 1  # no store yet
        with Store(store_config, zmq.Context.instance()) as store:
            wait_acked([partition], 10, "the first record's ACK, well within head_interval")
            assert stored(store, partition) == [b"first"]
    finally:
        publisher.close(timeout=0)


def test_a_consumer_fetches_each_partition_from_the_publisher(
    publisher: Publisher, make_consumer: ConsumerFactory
) -> None:
    """No store: records that went out before the consumer came are FETCHed from the
    publisher's memory, each partition by its own address (F<address>, DIRECT_RECORD)."""
    partitions = [publisher.open("shared", address=address()) for _ in range(5)]
    publish_all(partitions)
    wait_sent(partitions)
    consumer = make_consumer("earliest")
    consumer.subscribe("shared")
    got: dict[str, list[tuple[int, bytes]]] = {p.address: [] for p in partitions}
    for _ in range(len(partitions) * RECORDS):
        record = consumer.get(10)
        assert record is not None, f"records missing: got {sum(map(len, got.values()))}"
        got[record.partition].append((record.sequence, record.content))
    for partition in partitions:
        assert got[partition.address] == list(enumerate(contents(partition)))


def test_a_store_acking_once_reaches_a_partition_opened_later(
    dafka_config: Config, tower: Tower
) -> None:
    """A C store ACKs a record once (no HEAD repeats it here). A partition opened after the
    publisher is connected to the store subscribes K<address> on the live connection, and
    its first records, held `producer/subscribe_settle` ms as a joined gateway's are, still
    go out and get their one ACK."""
    dafka_config.set("producer/subscribe_settle", 300)
    dafka_config.set("producer/head_interval", 60_000)  # no HEAD to repeat a lost ACK
    publisher = Publisher(dafka_config, zmq.Context.instance())
    try:
        with TestPeer(dafka_config, zmq.Context.instance(), c_store=True) as store:
            store.wait_connected(publisher.address)
            for _ in range(3):
                partition = publisher.open("late", address=address())
                partition.publish_many([b"a", b"b"])
                wait_acked([partition], 5, f"the ACK of {partition.address}")
                assert store.stored("late", partition.address) == [b"a", b"b"]
    finally:
        publisher.close(timeout=0)


def test_heads_of_every_partition_on_one_timer(publisher: Publisher, test_peer: TestPeer) -> None:
    partitions = [publisher.open(f"h{i}", address=address()) for i in range(20)]
    for number, partition in enumerate(partitions):
        partition.publish_many([b"x"] * (number + 1))
    test_peer.wait_connected(publisher.address)
    heads: dict[str, int] = {}

    def heard_all() -> bool:
        try:
            msg = test_peer.recv(0.2)
        except TimeoutError:
            return False
        if msg.id == proto.HEAD:
            heads[msg.address] = msg.sequence
        return len(heads) == len(partitions)

    wait_until(heard_all, 10, "a HEAD of each partition")
    assert heads == {p.address: number for number, p in enumerate(partitions)}


def test_a_thousand_partitions_opened_at_once_cost_no_thread_and_are_all_acked(
    publisher: Publisher, store: Store
) -> None:
    """Opened on a publisher already connected to the store: 2,000 subscriptions at once
    on a live connection (more than a SUB's default send high-water mark of 1,000)."""
    first = publisher.open("cost", address=address())
    first.publish(b"warm-up")
    wait_acked([first], 5, "the warm-up ACK")
    threads = threading.active_count()
    partitions = [publisher.open(f"cost-{i}", address=address()) for i in range(1000)]
    for partition in partitions:
        partition.publish(b"one")
    wait_acked(partitions, 20, "ACKs of 1,000 partitions")
    assert threading.active_count() == threads
    assert publisher.partition_count() == 1001


def test_one_address_opens_once_and_nothing_opens_after_close(
    dafka_config: Config, tower: Tower
) -> None:
    publisher = Publisher(dafka_config, zmq.Context.instance())
    taken = address()
    partition = publisher.open("t", address=taken)
    with pytest.raises(ValueError, match="already open"):
        publisher.open("t", address=taken)
    with pytest.raises(ValueError, match="32 upper-case hex digits"):
        publisher.open("t", address="not-an-address")
    with pytest.raises(ValueError, match="invalid Dafka topic"):
        publisher.open("", address=address())
    assert publisher.close(timeout=0) == 0
    with pytest.raises(RuntimeError, match="closed"):
        partition.publish(b"late")
    with pytest.raises(RuntimeError, match="closed"):
        publisher.open("t", address=address())


def test_a_partition_started_below_the_stored_head_reports_a_conflict_not_acks(
    dafka_config: Config, store: Store
) -> None:
    """A writer that resumes an address below what the stores hold (two gateways with
    one dafka.node, or a restart that misjudged the head): the store drops each record
    at an offset it holds and answers the HEAD with ACK(its head). That ACK says nothing
    of our records, so it releases none of them and `on_conflict` tells the writer."""
    taken = address()
    first = Publisher(dafka_config, zmq.Context.instance())
    try:
        written = first.open("t", address=taken)
        written.publish_many([b"old-0", b"old-1", b"old-2", b"old-3"])
        wait_acked([written], 10, "the first writer's records")
    finally:
        first.close(timeout=0)
    acked: list[int] = []
    conflicts: list[int] = []
    second = Publisher(dafka_config, zmq.Context.instance())
    try:
        stale = second.open(
            "t", address=taken, first_sequence=1, on_ack=acked.append, on_conflict=conflicts.append
        )
        stale.publish_many([b"new-1", b"new-2"])
        wait_until(lambda: conflicts, 10, "a conflict reported for the ACK of the stored head")
        assert conflicts[0] == 3, conflicts
        assert acked == [], "an ACK of records another writer wrote released ours"
        assert stale.unacked_count() == 2
        records = store.storage.records(b"t", taken.encode())
        assert [content for _, content in records] == [b"old-0", b"old-1", b"old-2", b"old-3"]
    finally:
        second.close(timeout=0)


def test_one_batch_publishes_many_partitions_in_order_and_refuses_a_stranger_whole(
    publisher: Publisher, dafka_config: Config, store: Store
) -> None:
    """`publish_batch()`: the records of many partitions in one hand-over, each partition's
    in the order given (a partition twice in one batch: its records in batch order)."""
    partitions = open_many(publisher)
    halves = [(p, contents(p)[: RECORDS // 2]) for p in partitions]
    rest = [(p, contents(p)[RECORDS // 2 :]) for p in partitions]
    publisher.publish_batch(halves + rest)
    wait_acked(partitions, 10, "ACKs for every partition of one batch")
    for partition in partitions:
        assert stored(store, partition) == contents(partition), partition.address
    other = Publisher(dafka_config, zmq.Context.instance())
    try:
        stranger = other.open("topic-0", address=address())
        mine = partitions[0]
        with pytest.raises(ValueError, match="not this publisher's"):
            publisher.publish_batch([(mine, [b"not queued"]), (stranger, [b"x"])])
        assert mine.unacked_count() == 0, "a refused batch queues none of its records"
    finally:
        other.close(timeout=0)
    assert publisher.close(timeout=5) == 0
    with pytest.raises(RuntimeError, match="closed"):
        publisher.publish_batch([(partitions[0], [b"late"])])


def test_acks_are_taken_only_when_well_formed_and_for_the_partitions_topic(
    publisher: Publisher, test_peer: TestPeer
) -> None:
    """ACKs of our partitions are read in place (not through the codec): what the codec
    would refuse or ignore must still be refused or ignored. The peer's messages arrive
    in order, so each bad ACK below (each claiming every record) was read before the good
    one that releases two records."""
    partition = publisher.open("acked", address=address())
    partition.publish_many([b"r0", b"r1", b"r2", b"r3", b"r4"])
    test_peer.wait_connected(publisher.address)
    test_peer.wait_subscribed(proto.subscription(proto.ACK, partition.address))
    wait_until(lambda: partition.sent_count() == 5, 5, "the records sent (an ACK releases those)")

    def ack(subject: str, sequence: int) -> bytes:
        message = proto.Message(
            proto.ACK, partition.address.encode(), subject=subject, sequence=sequence
        )
        return proto.encode(message)[0]

    good = ack("acked", 4)
    bad = [
        [ack("other", 4)],  # another topic's subject
        [ack("acke", 4)],  # a prefix of it
        [good.replace(b"\0\x01", b"\0\x02", 1)],  # another version
        [good[:-1]],  # the sequence cut short
        [b"K" + partition.address.encode()],  # no NUL, nothing after the routing topic
    ]
    for frames in bad:
        test_peer.send_frames(frames)
    test_peer.send_frames([ack("acked", 1) + b"trailing bytes"])  # ignored, as in C
    wait_until(lambda: partition.unacked_count() <= 3, 5, "the good ACK of records 0-1")
    assert partition.unacked_count() == 3, "a bad ACK released records"
    test_peer.send_frames([good, b"a second frame"])  # an ACK has one frame; C ignores more
    wait_until(lambda: partition.unacked_count() == 0, 5, "the ACK of every record")
