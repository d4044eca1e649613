"""The store as a whole (spec §5), driven over inproc by the test peer (spec §8): its
writer and reader apart are in test_store_writer.py and test_store_reader.py.

Derived scenario 29 (store-to-store back-fill), upstream scenario 20, and what this port
adds: restart, retention by size and by age, earliest-from-tail, malformed input,
back-fill from another store when no producer is left, and the store's life time.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import zmq

from backends.dafka.beacon import TowerUnreachable
from backends.dafka.config import Config, ConfigError
from backends.dafka.consumer import Consumer
from backends.dafka.producer import Producer
from backends.dafka.storage import Retention, Storage
from backends.dafka.store import Store
from backends.dafka.store.retention import retention_policy
from backends.dafka.test_peer import TestPeer
from backends.dafka.tower import Tower
from tests.dafka.stores import (
    direct_records_of,
    link,
    linked_store,
    other_db,
    recv_until_ack,
    store_records,
)
from tests.support.waiting import wait_until

# --- scenario 29 and retention tail --------------------------------------------------------


def test_second_store_backfills_from_the_first(
    linked: TestPeer, store: Store, store_config: Config, tmp_path: Path
) -> None:
    contents = [b"rec %d" % i for i in range(20)]
    store_records(linked, "backfill", contents)
    # The peer (the producer) never answers FETCHes: only the first store can.
    with linked_store(other_db(store_config, tmp_path, "second"), linked, nth=2) as second:
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
    with linked_store(store_config, test_peer, sentinel=True) as store:
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
        with linked_store(config, test_peer, nth=2) as fresh:
            test_peer.send_head("trimmed", 9)
            wait_until(
                lambda: fresh.storage.head(b"trimmed", partition) == 9,
                10,
                "the new store did not start the partition at the tail",
            )
            assert fresh.storage.tail(b"trimmed", partition) == 7


def test_a_store_back_after_the_others_retention_passed_its_head_goes_on_from_their_tail(
    store_config: Config, tower: Tower, test_peer: TestPeer, tmp_path: Path
) -> None:
    """Store A holds 0..4 and is down while store B takes 5..19 and its retention keeps
    17..19. Back, A asks for 5; B answers from its oldest record, and nobody has 5..16
    any more. After two retry intervals of that, A goes on from B's oldest, as a store
    that holds nothing of the partition starts there. It used to ask for 5 for ever and
    drop every later record of the partition: its head stayed at 4."""
    a_config = other_db(store_config, tmp_path, "a")
    a_config.set("store/fetch_retry_interval", 200)
    b_config = other_db(store_config, tmp_path, "b")
    b_config.set("store/topics/lag/retention/bytes", 30)  # the newest 3 records of 10 bytes
    b_config.set("store/retention/check_interval", 20)
    partition = test_peer.address.encode()
    contents = [b"%010d" % i for i in range(21)]
    with linked_store(b_config, test_peer, sentinel=True) as b:
        with linked_store(a_config, test_peer, nth=2) as a:
            store_records(test_peer, "lag", contents[:5])
            wait_until(lambda: a.storage.head(b"lag", partition) == 4, 5, "A to hold 0..4")
        for seq in range(5, 20):  # A is down: the producer writes on, B keeps the newest
            test_peer.send_record("lag", seq, contents[seq])
        recv_until_ack(test_peer, "lag", 19)
        wait_until(lambda: b.storage.tail(b"lag", partition) == 17, 5, "B to keep 17..19")
        with linked_store(a_config, test_peer, nth=3) as a:
            test_peer.send_head("lag", 19)  # the producer's HEAD (it holds nothing)
            test_peer.send_record("lag", 20, contents[20])  # and new records go on
            wait_until(
                lambda: a.storage.head(b"lag", partition) == 20,
                10,
                "A to go on from B's oldest record to the newest",
            )
            kept = [seq for seq, _ in a.storage.records(b"lag", partition)]
            assert kept[:5] == [0, 1, 2, 3, 4] and kept[-1] == 20
            assert kept[5] in (17, 18), f"A went on from {kept[5]}, B's oldest is 17 or 18"


# --- restart, retention ---------------------------------------------------------------------


def test_restarted_store_serves_what_it_acknowledged(
    store_config: Config, tower: Tower, test_peer: TestPeer
) -> None:
    with linked_store(store_config, test_peer, sentinel=True):
        store_records(test_peer, "restart", [b"a", b"b", b"c"])
    with linked_store(store_config, test_peer, nth=2):
        assert direct_records_of(test_peer, "restart", 0, 10) == [(0, b"a"), (1, b"b"), (2, b"c")]
        # The writer continues the partition from its stored head.
        test_peer.send_record("restart", 3, b"d")
        assert recv_until_ack(test_peer, "restart", 3) == [3]


def test_size_retention_per_topic(store_config: Config, tower: Tower, test_peer: TestPeer) -> None:
    store_config.set("store/retention/bytes", 50)
    store_config.set("store/topics/kept/retention/bytes", -1)
    store_config.set("store/retention/check_interval", 20)
    with linked_store(store_config, test_peer) as store:
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
    with linked_store(store_config, test_peer) as store:
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


def test_a_record_with_frames_beyond_its_content_is_read_as_c_reads_it(
    linked: TestPeer, store: Store
) -> None:
    """Header and content are the record, as for a C store; the frames after them are
    read as messages of their own: here a record, then a frame that is dropped."""
    address = linked.address.encode()
    header = b"Mextra\0\x01\x20" + address + b"\x05extra"
    sequence = [header + n.to_bytes(8, "big") for n in range(3)]
    linked.send_frames([sequence[0], b"first", sequence[1], b"second"])
    linked.send_frames([sequence[2], b"third", b"not a message"])
    linked.send_record("extra", 3, b"fourth")
    recv_until_ack(linked, "extra", 3)
    assert direct_records_of(linked, "extra", 0, 4) == [
        (0, b"first"),
        (1, b"second"),
        (2, b"third"),
        (3, b"fourth"),
    ]


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
