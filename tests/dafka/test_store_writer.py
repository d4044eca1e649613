"""The store's writer (spec §5.3), driven over inproc by the test peer (spec §8).

Derived scenario 27, and what this port adds: synced write before ACK, FETCH retries and
when they give up, a repeated ACK for a HEAD at or below the stored head, and catch-up
from the other stores' heads when no producer is left.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from backends.dafka import proto
from backends.dafka.beacon import now_ms
from backends.dafka.config import Config
from backends.dafka.fetch_filter import FetchFilter
from backends.dafka.proto import Message
from backends.dafka.storage import Storage, partition_keys
from backends.dafka.store import Store
from backends.dafka.store import writer as writer_module
from backends.dafka.test_peer import TestPeer
from backends.dafka.tower import Tower
from tests.dafka.stores import (
    direct_records_of,
    linked_store,
    recv_direct_heads,
    recv_fetch,
    recv_until_ack,
    store_records,
)
from tests.support.waiting import wait_until

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


def test_records_with_trailing_bytes_are_stored_at_their_own_sequence(
    linked: TestPeer, store: Store
) -> None:
    """Bytes after a record's last field are ignored, as in C. The writer knows a
    partition's records by their bytes up to the sequence (`Writer.by_frame`): records
    with one trailing byte, alike but for their last 8 bytes, must not pass for those."""
    store_records(linked, "tail", [b"0"])  # the partition's frames known from here
    encoder = proto.RecordEncoder("tail", linked.address, "tail")
    for seq in (1, 2):
        header, content = encoder.encode(seq, b"%d" % seq)
        linked.send_frames([header + b"\x09", content])
    linked.send_record("tail", 3, b"3")
    assert recv_until_ack(linked, "tail", 3)[-1] == 3
    assert direct_records_of(linked, "tail", 0, 10) == [(seq, b"%d" % seq) for seq in range(4)]


def test_records_routed_under_ever_new_topics_keep_the_known_frames_bounded(
    linked: TestPeer, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer takes RECORDs routed under any topic (its subscription is the id
    alone), and knows a partition's frames by their bytes up to the sequence: a peer
    routing each record under another topic adds a form each. The table of forms is
    bounded all the same (2 * _PARTITION_CACHE), and every record is stored."""
    monkeypatch.setattr(writer_module, "_PARTITION_CACHE", 2)
    for seq in range(12):
        header, content = proto.RecordEncoder(f"route-{seq}", linked.address, "route").encode(
            seq, b"%d" % seq
        )
        linked.send_frames([header, content])
        assert recv_until_ack(linked, "route", seq)[-1] == seq  # one batch each
    assert direct_records_of(linked, "route", 0, 20) == [(s, b"%d" % s) for s in range(12)]
    known = len(store._writer.by_frame)
    assert known <= 4, f"{known} record forms kept: the table grows with the topics"


def test_gap_fetches_from_head_plus_one(linked: TestPeer, store: Store) -> None:
    store_records(linked, "gap", [b"0", b"1", b"2"])
    linked.send_record("gap", 5, b"5")
    fetch = recv_fetch(linked, store)
    assert fetch.topic == linked.address.encode()
    assert (fetch.subject, fetch.sequence, fetch.count) == ("gap", 3, 100_000 - 3)
    # Answering the FETCH closes the gap; record 5 was dropped, so it is fetched again.
    for seq in (3, 4):
        linked.send_direct_record(store.address, "gap", seq, b"%d" % seq)
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
        linked.send_direct_record(store.address, "retry", seq, b"r")
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
    with linked_store(store_config, test_peer) as store:
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
    with linked_store(store_config, test_peer) as store:
        for _ in range(2):  # not once: again and again
            msg = test_peer.recv_id(proto.GET_HEADS)
            assert (msg.topic, msg.address) == (b"", store.address)


def test_get_heads_of_the_empty_subject_answers_every_partition(
    linked: TestPeer, store: Store
) -> None:
    """What C's prefix match answers to "" (spec §5.4), and what a catching-up writer asks;
    then (beyond C) the END_OF_HEADS mark: subject "", the reader's uuid, 3 heads sent."""
    store_records(linked, "all-a", [b"0", b"1"])
    store_records(linked, "all-b", [b"0"])
    requester = uuid.uuid4().hex.upper()
    linked.send(Message(proto.GET_HEADS, b"", address=requester))
    heads = recv_direct_heads(linked, requester, 4)
    partition = linked.address
    assert sorted(heads[:3]) == [
        (partition, "all-a", 1),
        (partition, "all-b", 0),
        (partition, "sentinel", 0),
    ]
    assert heads[3] == (store.reader_address, proto.EVERY_SUBJECT, 3), "the mark comes last"


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


# --- going on from the other stores' oldest record ------------------------------------------

_UUID = "writer-a"
_PARTITION = "producer-p"


def _stand_in_writer(storage: Storage) -> tuple[writer_module.Writer, list[list[bytes]]]:
    """A writer without its actor thread or sockets, and the inbox its batches take
    FETCH answers from: two stores answering in an order that real sockets cannot be
    made to keep (a stand-in, for this algorithm alone; the sockets are tested above)."""
    w = writer_module.Writer.__new__(writer_module.Writer)
    w.retry_interval = 1000
    w.retry_timeout = 60_000
    w.heads_interval = 0
    w.reader_uuid = "reader-a"
    w.filter = FetchFilter()
    w.partitions = {}
    w.by_frame = {}
    w.gapped = set()
    w.deleted = []
    w.storage = storage
    w.store = SimpleNamespace(push=SimpleNamespace(watching=False))  # type: ignore[assignment]
    w.uuid = _UUID
    w.verbose = False
    w.pub = SimpleNamespace(send=lambda *frame: None, send_multipart=lambda frames: None)  # type: ignore[assignment]
    w.send_direct = lambda *frame: None
    inbox: list[list[bytes]] = []

    def receive(asked: int) -> list[list[bytes]]:
        taken = inbox[:asked]
        del inbox[:asked]
        return taken

    w.receive_direct = receive
    w.receive_live = lambda asked: []
    return w, inbox


def _answers(*seqs: int) -> list[list[bytes]]:
    encoder = proto.RecordEncoder(_UUID, _PARTITION, "t", proto.DIRECT_RECORD)
    return [encoder.encode(seq, b"%010d" % seq) for seq in seqs]


@pytest.mark.parametrize("slow_store", [True, False], ids=["a slower store answers", "none"])
def test_the_writer_goes_on_from_a_later_answer_only_after_an_interval_without_progress(
    tmp_path: Path, slow_store: bool
) -> None:
    """The writer holds 0..4 and asks for 5. Store B, which keeps only 17..19, answers at
    once. When store C, which keeps everything, answers late and in parts (B's answers
    to the next FETCH among them), every record is stored: while records come, no proof
    5..16 are gone (the first version took B's oldest at the second retry, each later
    answer hiding the progress, and dropped C's 8..16). When nobody else answers, the
    writer goes on from 17 after a whole retry interval without progress."""
    partition = _PARTITION.encode()
    with Storage(tmp_path / "db") as storage:
        batch = storage.new_batch()
        for seq in range(5):
            batch.put(b"Mt\0" + partition + b"\0" + seq.to_bytes(8, "big"), b"%010d" % seq)
        storage.stage_partition(batch, partition_keys(b"t", partition), 4, 50, 1)
        storage.commit(batch)
        writer, inbox = _stand_in_writer(storage)
        second = now_ms()  # the retries' clock: the writer's own, moved on by hand
        inbox += _answers(17, 18, 19)  # B, at once
        writer._batch()
        writer._retry(second)  # C has not answered yet
        if slow_store:
            inbox += _answers(5, 6, 7) + _answers(17, 18, 19)  # C's first part, then B
            writer._batch()
        writer._retry(second + 1000)
        if slow_store:
            inbox += _answers(*range(8, 20))  # the rest of C's answer
        else:
            writer._retry(second + 2000)  # no answer at all: the FETCH of 17 goes out
            inbox += _answers(17, 18, 19)  # B answers it
        writer._batch()
        stored = [seq for seq, _ in storage.records(b"t", partition)]
        expected = list(range(20)) if slow_store else [0, 1, 2, 3, 4, 17, 18, 19]
        assert stored == expected
