"""The store applies the topic catalog (`__rafka_topics`, written by rafka-topics) as it
stores it: per-topic retention overrides, and deletion of a topic's records."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import zmq
from rocksdict import WriteBatch

from backends.dafka.catalog import TOPICS_TOPIC, Catalog, TopicEntry, created, deleted
from backends.dafka.config import Config, ConfigError
from backends.dafka.offsets import OFFSETS_TOPIC
from backends.dafka.storage import Retention, Storage, partition_keys
from backends.dafka.store import Store
from backends.dafka.store.retention import RetentionPolicy
from backends.dafka.test_peer import TestPeer
from backends.dafka.tower import Tower
from tests.dafka.stores import (
    direct_records_of,
    linked_store,
    other_db,
    recv_until_ack,
    store_records,
)
from tests.support.waiting import wait_until


@pytest.fixture
def store_config(dafka_config: Config) -> Config:
    dafka_config.set("store/fetch_retry_interval", 100)
    return dafka_config


def catalog_record(peer: TestPeer, seq: int, entry: TopicEntry) -> None:
    peer.send_record(TOPICS_TOPIC, seq, entry.encode())
    recv_until_ack(peer, TOPICS_TOPIC, seq)


def test_entries_round_trip_and_the_latest_wins() -> None:
    entry = created("orders", 3, {"retention.ms": "60000"})
    assert TopicEntry.decode(entry.encode()) == entry
    catalog = Catalog()
    assert catalog.apply(entry.encode()) == entry
    assert catalog.apply(entry.encode()) is None, "an entry read again is no news"
    assert catalog.partitions("orders") == 3
    older = TopicEntry("orders", 0, deleted=True, unix_ms=entry.unix_ms - 1)
    assert catalog.apply(older.encode()) is None, "an older entry must not win"
    gone = deleted("orders", {"A" * 32: 4})
    assert catalog.apply(gone.encode()) == gone
    assert catalog.partitions("orders") is None
    assert catalog.apply(b"{not json") is None
    assert catalog.apply(b'{"topic": "x", "partitions": -1}') is None


def test_retention_policy_takes_catalog_overrides() -> None:
    policy = RetentionPolicy(Config({"store/retention/ms": 1000}))
    assert policy(b"t") == Retention(ms=1000)
    policy.apply_entry(created("t", 1, {"retention.bytes": "50"}))
    assert policy(b"t") == Retention(ms=1000, bytes=50)
    assert policy(b"u") == Retention(ms=1000)
    assert policy(TOPICS_TOPIC.encode()).forever, "the catalog itself is kept"
    policy.apply_entry(deleted("t", {}))
    assert policy(b"t") == Retention(ms=1000)
    forever = RetentionPolicy(Config())
    assert not forever.active
    forever.apply_entry(created("t", 1, {"retention.ms": "5"}))
    assert forever.active and forever(b"t") == Retention(ms=5)


def test_committed_offsets_go_by_time_only_unless_configured() -> None:
    """A store-wide bound in bytes would take a quiet group's last commit once others
    commit more: `__rafka_offsets` keeps the store's time bound, or its own."""
    offsets = OFFSETS_TOPIC.encode()
    policy = RetentionPolicy(Config({"store/retention/ms": 1000, "store/retention/bytes": 50}))
    assert policy(b"t") == Retention(ms=1000, bytes=50)
    assert policy(offsets) == Retention(ms=1000)
    assert policy(TOPICS_TOPIC.encode()).forever
    own = f"store/topics/{OFFSETS_TOPIC}/retention"
    configured = RetentionPolicy(Config({"store/retention/bytes": 50, f"{own}/bytes": 70}))
    assert configured(offsets) == Retention(bytes=70)


@pytest.mark.parametrize(
    ("setting", "value", "refusal"),
    [
        ("store/topics/orders/retention/ms", "1h", "is not an integer"),
        ("store/topics/orders/retention/bytes", "10MB", "is not an integer"),
        ("store/retention/check_interval", "10000000000000", "is more than"),
    ],
)
def test_retention_settings_a_store_cannot_apply_are_refused_at_start(
    tmp_path: Path, setting: str, value: str, refusal: str
) -> None:
    """As `store/retention/ms = 1h` is: a topic's retention that is no integer was taken
    as no retention (forever), and a check interval past what a thread can wait killed
    the retention thread once the store ran."""
    config = Config({"store/db": str(tmp_path / "db"), setting: value})
    with pytest.raises(ConfigError, match=f"config {setting} = .* {refusal}"):
        Store(config, zmq.Context.instance())
    assert not (tmp_path / "db").exists(), "refused before the DB was opened"


def test_delete_drops_records_keeps_heads_and_the_partition_continues(
    store_config: Config, tower: Tower, test_peer: TestPeer
) -> None:
    with linked_store(store_config, test_peer, sentinel=True) as store:
        store_records(test_peer, "doomed", [b"d%d" % i for i in range(5)])
        store_records(test_peer, "kept", [b"k0", b"k1"])
        partition = test_peer.address.encode()
        catalog_record(test_peer, 0, deleted("doomed", {test_peer.address: 4}))
        assert list(store.storage.records(b"doomed", partition)) == []
        assert store.storage.head(b"doomed", partition) == 4, "offsets are never reused"
        assert list(store.storage.records(b"kept", partition)) == [(0, b"k0"), (1, b"k1")]
        # A deleted record offered again (another store's copy) is not taken back.
        test_peer.send_record("doomed", 3, b"d3")
        # The partition continues after its head.
        test_peer.send_record("doomed", 5, b"new")
        assert recv_until_ack(test_peer, "doomed", 5)[-1] == 5
        assert list(store.storage.records(b"doomed", partition)) == [(5, b"new")]
        # A FETCH from 0 is answered from the oldest record kept.
        assert direct_records_of(test_peer, "doomed", 0, 3) == [(5, b"new")]


def test_catalog_retention_applies_and_survives_a_restart(
    store_config: Config, tower: Tower, test_peer: TestPeer
) -> None:
    store_config.set("store/retention/check_interval", 20)
    partition = test_peer.address.encode()
    with linked_store(store_config, test_peer) as store:
        catalog_record(test_peer, 0, created("capped", 1, {"retention.bytes": "30"}))
        store_records(test_peer, "capped", [b"%010d" % i for i in range(10)])
        store_records(test_peer, "free", [b"%010d" % i for i in range(10)])
        wait_until(
            lambda: store.storage.tail(b"capped", partition) == 7,
            5,
            "the catalog's retention.bytes 30 did not keep the newest 3 records",
        )
        assert store.storage.tail(b"free", partition) == 0
    with linked_store(store_config, test_peer, nth=2) as again:
        for seq in range(10, 13):
            test_peer.send_record("capped", seq, b"%010d" % seq)
        recv_until_ack(test_peer, "capped", 12)
        wait_until(
            lambda: again.storage.tail(b"capped", partition) == 10,
            5,
            "the restarted store forgot the catalog's retention",
        )


def test_storage_delete_topic_and_retention_after_it(tmp_path: Path) -> None:
    with Storage(tmp_path / "db") as storage:
        batch = storage.new_batch()
        for seq in range(4):
            batch.put(b"Mt\0p\0" + seq.to_bytes(8, "big"), b"0123456789")
        storage.stage_partition(batch, partition_keys(b"t", b"p"), 3, 40, 1000)
        storage.commit(batch)
        assert storage.delete_topic(b"t", 2000) == 1
        assert list(storage.records(b"t", b"p")) == []
        assert storage.head(b"t", b"p") == 3
        # Written again: the size retention counts the new records only.
        batch = storage.new_batch()
        for seq in range(4, 7):
            batch.put(b"Mt\0p\0" + seq.to_bytes(8, "big"), b"0123456789")
        storage.stage_partition(batch, partition_keys(b"t", b"p"), 6, 70, 3000)
        storage.commit(batch)
        assert storage.trim(b"t", b"p", 6, Retention(bytes=20), 4000) == 1
        assert storage.tail(b"t", b"p") == 5


def test_a_deletion_keeps_the_records_written_after_it_and_retention_counts_them(
    tmp_path: Path,
) -> None:
    """The deletion saw partition p at head 3: records 4..6 came after it (the topic is
    back) and stay, whatever order they are stored in; the size retention then counts
    those only. A partition the deletion did not see keeps its records too."""
    with Storage(tmp_path / "db") as storage:
        batch = storage.new_batch()
        for seq in range(7):
            batch.put(b"Mt\0p\0" + seq.to_bytes(8, "big"), b"0123456789")
        batch.put(b"Mt\0q\0" + (0).to_bytes(8, "big"), b"unseen")
        storage.stage_partition(batch, partition_keys(b"t", b"p"), 6, 70, 1000)
        storage.stage_partition(batch, partition_keys(b"t", b"q"), 0, 6, 1000)
        storage.commit(batch)
        batch = storage.new_batch()
        states = storage.partition_states(b"t")
        storage.stage_delete_topic(batch, b"t", states, {b"p": 3}, 2000)
        storage.commit(batch)
        assert [seq for seq, _ in storage.records(b"t", b"p")] == [4, 5, 6]
        assert list(storage.records(b"t", b"q")) == [(0, b"unseen")]
        assert storage.head(b"t", b"p") == 6
        # 30 bytes kept: a bound of 20 drops one record, of 30 none.
        assert storage.trim(b"t", b"p", 6, Retention(bytes=30), 3000) == 0
        assert storage.trim(b"t", b"p", 6, Retention(bytes=20), 3000) == 1
        assert storage.tail(b"t", b"p") == 5


def test_a_store_back_filling_a_deleted_topic_keeps_what_was_written_after_it(
    store_config: Config, tower: Tower, test_peer: TestPeer, tmp_path: Path
) -> None:
    """Store B applied a deletion that saw "Orders" at head 4, then took 5..9. A new
    store C back-fills from B: it may store 5..9 before the catalog's deletion (keys of
    "Orders" sort before `__rafka_topics`). The deletion used to drop every record of
    the topic there, 5..9 too: records B had acknowledged were gone from C."""
    partition = test_peer.address.encode()
    with linked_store(store_config, test_peer, sentinel=True) as b:
        store_records(test_peer, "Orders", [b"old%d" % i for i in range(5)])
        catalog_record(test_peer, 0, deleted("Orders", {test_peer.address: 4}))
        for seq in range(5, 10):
            test_peer.send_record("Orders", seq, b"new%d" % seq)
        recv_until_ack(test_peer, "Orders", 9)
        kept = [(seq, b"new%d" % seq) for seq in range(5, 10)]
        assert list(b.storage.records(b"Orders", partition)) == kept
        with Store(other_db(store_config, tmp_path, "c"), zmq.Context.instance()) as c:
            wait_until(
                lambda: (
                    c.storage.head(TOPICS_TOPIC.encode(), partition) == 0
                    and c.storage.head(b"Orders", partition) == 9
                ),
                10,
                "store C to back-fill the catalog and the topic from B",
            )
            assert list(c.storage.records(b"Orders", partition)) == kept


def test_a_store_behind_a_deletion_goes_on_after_it(
    store_config: Config, tower: Tower, test_peer: TestPeer
) -> None:
    """The store holds "Orders" 0..1 when it stores a deletion that saw the partition at
    head 4 (it missed 2..4). It goes on after the deletion's head: 3, offered again by a
    store that keeps the deleted records (a C store, or one that has not stored the
    entry yet), is not taken back; 5 is stored. Its head stayed at 1, and 2..4 came back."""
    partition = test_peer.address.encode()
    with linked_store(store_config, test_peer, sentinel=True) as store:
        store_records(test_peer, "Orders", [b"old0", b"old1"])
        catalog_record(test_peer, 0, deleted("Orders", {test_peer.address: 4}))
        assert store.storage.head(b"Orders", partition) == 4
        test_peer.send_record("Orders", 3, b"old3")
        test_peer.send_record("Orders", 5, b"new5")
        assert recv_until_ack(test_peer, "Orders", 5)[-1] == 5
        assert list(store.storage.records(b"Orders", partition)) == [(5, b"new5")]


def test_a_deletion_whose_write_failed_still_raises_the_head_once_stored(
    store_config: Config, tower: Tower, test_peer: TestPeer
) -> None:
    """As above, but the first write of the deletion's batch fails (a stand-in for a full
    disk: the only failure here that cannot be provoked for real). Nothing of that batch
    is written, the head's raise included; the entry stored again raises it in the
    database. The raise used to stay in memory only: applied again, it found the head
    raised already, and the database kept head 1 (2..4 came back after a restart)."""
    partition = test_peer.address.encode()
    with linked_store(store_config, test_peer, sentinel=True) as store:
        store_records(test_peer, "Orders", [b"old0", b"old1"])
        storage = store.storage
        write = storage.commit
        failed = threading.Event()

        def failing_once(batch: WriteBatch) -> None:
            if not failed.is_set():
                failed.set()
                raise OSError("No space left on device")
            write(batch)

        storage.commit = failing_once  # type: ignore[method-assign]
        entry = deleted("Orders", {test_peer.address: 4})
        test_peer.send_record(TOPICS_TOPIC, 0, entry.encode())
        assert failed.wait(5), "the deletion's batch was never written"
        test_peer.send_record(TOPICS_TOPIC, 0, entry.encode())  # stored this time
        recv_until_ack(test_peer, TOPICS_TOPIC, 0)
        assert list(storage.records(b"Orders", partition)) == []
        assert storage.head(b"Orders", partition) == 4
