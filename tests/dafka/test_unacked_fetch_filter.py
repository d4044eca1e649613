"""The producer's unacked list (scenario 21, plus the contents upstream never checks, §10.9)
and the FETCH filter (scenario 26, plus the §10.15 collision fix)."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterator

import pytest
import zmq

from backends.dafka import proto
from backends.dafka.fetch_filter import BUCKET, FetchFilter
from backends.dafka.unacked import UnackedList

PRODUCER = "0123456789ABCDEF0123456789ABCDEF"
REQUESTER = "FEDCBA9876543210FEDCBA9876543210"
PAD = b"." * 992


def content(seq: int, size: int = 8) -> bytes:
    """A content that names its sequence, so a wrong slot cannot go unnoticed."""
    return struct.pack(">Q", seq) + PAD[: size - 8]


class Link:
    """Upstream's test rig: a PUB/SUB inproc pair carrying the DIRECT_RECORDs the producer
    sends for a FETCH (`unacked.send` in C)."""

    def __init__(self) -> None:
        ctx: zmq.Context = zmq.Context.instance()
        endpoint = f"inproc://unacked-{uuid.uuid4().hex}"
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.SNDHWM, 0)
        self.pub.bind(endpoint)
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.RCVHWM, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, proto.subscription(proto.DIRECT_RECORD, REQUESTER))
        self.sub.setsockopt(zmq.SUBSCRIBE, b"Hmarker")
        self.sub.connect(endpoint)
        self.encoder = proto.RecordEncoder(REQUESTER, PRODUCER, "topic", proto.DIRECT_RECORD)
        # Wait until the subscription reached the PUB: send markers until one arrives.
        while not self.sub.poll(10):
            self._marker()
        self._drain_markers()

    def _marker(self) -> None:
        msg = proto.Message(proto.HEAD, b"marker", address=PRODUCER, subject="marker")
        self.pub.send_multipart(proto.encode(msg))

    def _drain_markers(self) -> None:
        while self.sub.poll(0):
            self.sub.recv_multipart()

    def send(self, unacked: UnackedList, seq: int, count: int) -> list[tuple[int, bytes]]:
        """Answer FETCH(seq, count) and return what the requester received."""
        for s, data in unacked.records(seq, count):
            self.pub.send_multipart(self.encoder.encode(s, data))
        self._marker()  # sent last on the same pipe: everything before it has arrived
        received: list[tuple[int, bytes]] = []
        while True:
            assert self.sub.poll(5000), "the marker never arrived"
            frames = self.sub.recv_multipart()
            if frames[0].startswith(b"H"):
                return received
            mid, topic, address, subject, sequence, data = proto.decode_record(frames)
            assert (mid, topic, address, subject) == (
                proto.DIRECT_RECORD,
                REQUESTER.encode(),
                PRODUCER,
                "topic",
            )
            received.append((sequence, data))

    def close(self) -> None:
        self.pub.close(linger=0)
        self.sub.close(linger=0)


@pytest.fixture
def link() -> Iterator[Link]:
    link = Link()
    yield link
    link.close()


def test_scenario_21_unacked_list_with_contents(link: Link) -> None:
    unacked = UnackedList()
    assert unacked.last_acked == -1  # C underflows to 2^64-1 here (§10.9)
    assert len(unacked) == 0

    # a. 1,000,000 records. Upstream pushes 1000-byte contents it never looks at; these
    # are 8 bytes naming their sequence (step h below uses full 1000-byte contents).
    push = unacked.push
    assert [push(content(s)) for s in range(1_000_000)][-1] == 999_999
    assert len(unacked) == 1_000_000

    # b.
    assert link.send(unacked, 0, 2) == [(0, content(0)), (1, content(1))]
    # c. a partial ACK: records <= 100000 are gone, FETCHes below answer nothing
    unacked.ack(100_000)
    assert len(unacked) == 899_999
    assert unacked.first_sequence == 100_001
    assert link.send(unacked, 0, 2) == []
    # d. the C bug returned other records' contents here
    assert link.send(unacked, 100_001, 2) == [
        (100_001, content(100_001)),
        (100_002, content(100_002)),
    ]
    # e. end of the list
    assert link.send(unacked, 999_999, 2) == [(999_999, content(999_999))]
    # f.
    for seq in (200_000, 304_000, 400_073, 586_321):
        unacked.ack(seq)
        assert len(unacked) > 0
        assert unacked.last_acked == seq
        assert link.send(unacked, seq + 1, 1) == [(seq + 1, content(seq + 1))]
        assert link.send(unacked, seq, 1) == []
    # g. pushes after partial ACKs continue the numbering and keep their contents
    pushed = [push(content(s)) for s in range(1_000_000, 1_100_000)]
    assert (pushed[0], pushed[-1]) == (1_000_000, 1_099_999)
    unacked.ack(874_321)
    assert len(unacked) > 0 and unacked.last_acked == 874_321
    assert link.send(unacked, 874_322, 1) == [(874_322, content(874_322))]
    assert link.send(unacked, 1_099_999, 5) == [(1_099_999, content(1_099_999))]
    unacked.ack(1_099_999)
    assert len(unacked) == 0 and unacked.last_acked == 1_099_999
    # h. 100,000 more of 1000 bytes, all sent back in order with the right contents
    for s in range(1_100_000, 1_200_000):
        assert push(content(s, 1000)) == s
    assert len(unacked) == 100_000
    received = link.send(unacked, 1_100_000, 100_000)
    assert [s for s, _ in received] == list(range(1_100_000, 1_200_000))
    assert all(data == content(s, 1000) for s, data in received)
    assert {len(data) for _, data in received} == {1000}
    # i.
    unacked.ack(1_199_999)
    assert len(unacked) == 0 and unacked.last_acked == 1_199_999
    unacked.ack(2_000_000)
    assert len(unacked) == 0
    assert unacked.last_acked == 1_199_999  # nothing beyond the pushed records was acked
    assert unacked.push(b"next") == 1_200_000  # numbering never skips or reuses


def test_unacked_partial_acks_then_pushes_keep_contents() -> None:
    """Regression for §10.9 (b): a partial ACK inside a chunk, then more pushes."""
    unacked = UnackedList()
    for s in range(300):
        unacked.push(content(s))
    for acked in (10, 11, 200, 255, 256):
        unacked.ack(acked)
        for _ in range(10):
            unacked.push(content(unacked.next_sequence))
        assert list(unacked.records(acked + 1, 3)) == [
            (s, content(s)) for s in range(acked + 1, acked + 4)
        ]
    unacked.ack(5)  # older ACK: no-op
    assert unacked.first_sequence == 257 and unacked.last_acked == 256


def test_unacked_extend_numbers_as_pushes_would() -> None:
    """`extend` (the producer actor keeps a batch at once) numbers each record as a
    `push` each would have, after partial ACKs and compaction as well."""
    unacked = UnackedList(first_sequence=7)
    assert unacked.extend([content(s) for s in range(7, 12)]) == 7
    assert unacked.push(content(12)) == 12
    unacked.ack(9)
    assert unacked.extend([]) == 13
    assert unacked.extend([content(s) for s in range(13, 5_013)]) == 13
    unacked.ack(5_000)  # the released slots compacted away
    assert unacked.extend([content(5_013)]) == 5_013
    assert list(unacked.records(5_001, 100)) == [(s, content(s)) for s in range(5_001, 5_014)]


def test_unacked_compaction_keeps_sequences() -> None:
    unacked = UnackedList()
    for round_ in range(5):
        base = unacked.next_sequence
        for s in range(base, base + 10_000):
            unacked.push(content(s))
        unacked.ack(base + 9_990)
        assert list(unacked.records(base + 9_991, 100)) == [
            (s, content(s)) for s in range(base + 9_991, base + 10_000)
        ], f"round {round_}"
    assert len(unacked) == 9
    assert list(unacked.records(0, 5)) == []
    assert list(unacked.records(unacked.first_sequence, 0)) == []


# --- scenario 26: fetch filter ----------------------------------------------------------------


def test_scenario_26_fetch_filter() -> None:
    fetches = FetchFilter()
    t = 5_000_000  # monotonic ms
    assert fetches.should_fetch("hello", PRODUCER, 0, t) == BUCKET
    # same (subject, partition, bucket) in the same second: suppressed, even another seq
    assert fetches.should_fetch("hello", PRODUCER, 0, t + 999) is None
    assert fetches.should_fetch("hello", PRODUCER, 4_321, t + 500) is None
    # a new second
    assert fetches.should_fetch("hello", PRODUCER, 4_321, t + 1000) == BUCKET - 4_321
    # a new 100k bucket in the same second; count = rest of that bucket
    assert fetches.should_fetch("hello", PRODUCER, 100_005, t + 1000) == 99_995
    assert fetches.should_fetch("hello", PRODUCER, 199_999, t + 1001) is None
    assert fetches.should_fetch("hello", PRODUCER, 200_000, t + 1001) == BUCKET
    # other subject or partition: independent
    assert fetches.should_fetch("hello2", PRODUCER, 0, t + 1000) == BUCKET
    assert fetches.should_fetch("hello", REQUESTER, 0, t + 1000) == BUCKET


def test_fetch_filter_never_collides_and_stays_bounded() -> None:
    fetches = FetchFilter(max_entries=1000)
    t = 7_000_000
    # 5,000 partitions in one second: each gets its FETCH (a 10,000-slot hash table can
    # suppress some of these, §10.15), and the table does not grow past its bound.
    partitions = [uuid.uuid4().hex.upper() for _ in range(5_000)]
    assert all(fetches.should_fetch("t", p, 0, t) == BUCKET for p in partitions)
    assert len(fetches) == 1000
    # The newest ones are still remembered; evicted ones only risk a duplicate FETCH.
    assert fetches.should_fetch("t", partitions[-1], 0, t) is None
    assert fetches.should_fetch("t", partitions[0], 0, t) == BUCKET


def test_fetch_filter_defaults_to_the_monotonic_clock() -> None:
    fetches = FetchFilter()
    first = fetches.should_fetch("s", PRODUCER, 7)
    assert first == BUCKET - 7
    # Within the same second this is suppressed; across a second boundary it is not.
    again = fetches.should_fetch("s", PRODUCER, 7)
    assert again in (None, BUCKET - 7)
