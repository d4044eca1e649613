"""The gateway's reader actor (`reader.py`) against a test peer playing the partition's
producer and a store: live records are delivered without a FETCH, a gap is fetched alone
while the live records behind it are held (within the credit), and whatever order the
live records, the FETCH answers and a second store's late answers come in, every record
reaches the owner once and in order."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator

import pytest
import zmq

from backends.dafka import proto
from backends.dafka.config import Config
from backends.dafka.reader import Event, Reader
from backends.dafka.test_peer import TestPeer
from tests.dafka.consumers import link, subscribe

CURSOR = ("group", "hello", "partition")
OTHER = ("other group", "hello", "partition")
WAIT = 5.0


class Owner:
    """The reader's sink: the events it hands over, in order, for the test to take."""

    def __init__(self) -> None:
        self.events: queue.Queue[Event] = queue.Queue()

    def sink(self, events: list[Event]) -> None:
        for event in events:
            self.events.put(event)

    def records(self, count: int) -> list[tuple[int, bytes]]:
        """(sequence, content) of the next `count` records handed to the cursor."""
        got: list[tuple[int, bytes]] = []
        while len(got) < count:
            try:
                event = self.events.get(timeout=WAIT)
            except queue.Empty:
                raise AssertionError(
                    f"only {len(got)} of {count} records within {WAIT:g} s: {got}"
                ) from None
            if event[0] == "record":
                _, key, seq, content, generation = event
                assert (key, generation) == (CURSOR, 1)
                got.append((seq, content))
        return got


@pytest.fixture
def owner() -> Owner:
    return Owner()


@pytest.fixture
def reader(dafka_config: Config, test_peer: TestPeer, owner: Owner) -> Iterator[Reader]:
    reader = Reader(dafka_config, owner.sink, zmq.Context.instance())
    try:
        link(test_peer, reader)
        subscribe(test_peer, reader, "hello")
        yield reader
    finally:
        reader.close()


def start(reader: Reader, peer: TestPeer, credit: int, *, jump: bool = False) -> None:
    """The cursor at 0; with `jump`, at the oldest record the stores keep if later."""
    reader.start(CURSOR, "hello", peer.address, 0, credit, 1, jump=jump)


def expect_fetch(peer: TestPeer, sequence: int, count: int) -> None:
    """The next FETCH the peer gets asks for exactly `count` records from `sequence`: had
    the reader fetched anything else first, it would come first (one connection)."""
    fetch = peer.recv_id(proto.FETCH, WAIT)
    assert (fetch.subject, fetch.sequence, fetch.count) == ("hello", sequence, count)


def record(seq: int) -> tuple[int, bytes]:
    return (seq, f"r{seq}".encode())


def live(peer: TestPeer, *sequences: int) -> None:
    for seq in sequences:
        peer.send_record("hello", seq, f"r{seq}".encode())


def answer(peer: TestPeer, reader: Reader, *sequences: int) -> None:
    for seq in sequences:
        peer.send_direct_record(reader.address, "hello", seq, f"r{seq}".encode())


def test_live_records_overlapping_a_fetch_arrive_once_and_in_order(
    reader: Reader, test_peer: TestPeer, owner: Owner
) -> None:
    start(reader, test_peer, credit=100)
    live(test_peer, 0)
    assert owner.records(1) == [record(0)]
    live(test_peer, 4)  # 1..3 missed: only they are fetched, 4 is held
    expect_fetch(test_peer, 1, 3)
    live(test_peer, 5, 6)  # during the FETCH
    answer(test_peer, reader, 1)  # the producer answers …
    live(test_peer, 7)  # … while records keep coming
    answer(test_peer, reader, 2, 3)
    assert owner.records(7) == [record(seq) for seq in range(1, 8)]
    # A second store's answers to the same FETCH, late: already delivered.
    answer(test_peer, reader, 1, 2, 3, 4, 5)
    live(test_peer, 8)
    assert owner.records(1) == [record(8)], "a record delivered twice"
    live(test_peer, 10)  # the next FETCH is for 9 alone: none was sent for 0 or 5..8
    expect_fetch(test_peer, 9, 1)
    answer(test_peer, reader, 9)
    assert owner.records(2) == [record(9), record(10)]


def test_only_records_within_the_credit_are_held(
    reader: Reader, test_peer: TestPeer, owner: Owner
) -> None:
    """Credit 3: live 1 and 2 are held while 0 is fetched; 3 is past the credit, so it is
    dropped (the owner has no room for it) and fetched once room is granted."""
    start(reader, test_peer, credit=3)
    live(test_peer, 1)
    expect_fetch(test_peer, 0, 1)
    live(test_peer, 2, 3)
    answer(test_peer, reader, 0)
    assert owner.records(3) == [record(0), record(1), record(2)]
    reader.grant(CURSOR, 3)
    expect_fetch(test_peer, 3, 1)
    answer(test_peer, reader, 3)
    live(test_peer, 4)
    assert owner.records(2) == [record(3), record(4)]


def test_a_record_held_when_the_credit_was_taken_back_comes_with_the_next_grant(
    reader: Reader, test_peer: TestPeer, owner: Owner
) -> None:
    """A group takes credit back (`Group._share_among`: a negative grant) while a live
    record waits past a gap. The gap comes, delivery stops where the credit ends, and the
    next record (4) stays held. Granted more, the reader delivers it: it used to FETCH
    the gap before the first held record, 0 records from 4, again at every retry, and the
    partition never moved again."""
    start(reader, test_peer, credit=10)
    live(test_peer, 0)
    assert owner.records(1) == [record(0)]
    live(test_peer, 4)  # 1..3 missed: fetched, 4 held
    expect_fetch(test_peer, 1, 3)
    reader.grant(CURSOR, -6)  # 3 left: for 1..3 only
    # Commands run in order: once a cursor started after the grant FETCHes, the grant ran
    # (before the answers below, which come on another socket).
    reader.start(OTHER, "hello", test_peer.address, 0, 1, 1, jump=False)
    expect_fetch(test_peer, 0, 1)
    reader.drop(OTHER)
    answer(test_peer, reader, 1, 2, 3)
    assert owner.records(3) == [record(1), record(2), record(3)]
    reader.grant(CURSOR, 10)
    assert owner.records(1) == [record(4)]
    live(test_peer, 5)
    assert owner.records(1) == [record(5)]


@pytest.fixture
def quick_retry(dafka_config: Config) -> Config:
    """A FETCH counts as lost after 100 ms (set before the reader starts)."""
    dafka_config.set("consumer/fetch_retry_interval", 100)
    return dafka_config


@pytest.mark.usefixtures("quick_retry")
def test_a_lost_fetch_asks_again_for_the_gap_only(
    reader: Reader, test_peer: TestPeer, owner: Owner
) -> None:
    start(reader, test_peer, credit=10)
    live(test_peer, 2, 3)
    expect_fetch(test_peer, 0, 2)
    expect_fetch(test_peer, 0, 2)  # unanswered: asked again, still not for 2 and 3
    answer(test_peer, reader, 0, 1)
    assert owner.records(4) == [record(seq) for seq in range(4)]


@pytest.mark.usefixtures("quick_retry")
def test_a_jump_to_the_oldest_kept_record_delivers_the_held_ones_after_it(
    reader: Reader, test_peer: TestPeer, owner: Owner
) -> None:
    """From 0 with `jump`: the stores kept only 5 and later (retention). Live 7 is held;
    the stores answer 5 and 6 to the FETCH for 0, and again when it is asked again; once
    the second one's time is up too, the cursor jumps to 5, fetches the gap before 7,
    and delivers 5, 6, 7."""
    start(reader, test_peer, credit=100, jump=True)
    live(test_peer, 7)
    for _ in range(2):
        fetch = test_peer.recv_id(proto.FETCH, WAIT)
        assert fetch.sequence == 0
        answer(test_peer, reader, 5, 6)
    expect_fetch(test_peer, 5, 2)
    answer(test_peer, reader, 5, 6)
    assert owner.records(3) == [record(5), record(6), record(7)]
    live(test_peer, 8)
    assert owner.records(1) == [record(8)]


@pytest.mark.usefixtures("quick_retry")
def test_a_cursor_that_may_jump_asks_again_when_its_first_fetch_is_lost(
    reader: Reader, test_peer: TestPeer, owner: Owner
) -> None:
    """A group restarts at its commit (30) with `jump` (for a commit retention passed),
    and the FETCH for 30.. is lost. Later records answered meanwhile are no proof that 30
    is gone: the reader asks for 30 again, and sends no FETCH past the first while it
    may jump (whose answers would look like the oldest kept). A jump took 34, answered
    to a grant's FETCH past the first, for the oldest kept: 30..33 were skipped."""
    reader.start(CURSOR, "hello", test_peer.address, 30, 4, 1, head=99, jump=True)
    expect_fetch(test_peer, 30, 4)
    reader.grant(CURSOR, 4)
    answer(test_peer, reader, 34, 35)  # a store that keeps less, answering the FETCH
    expect_fetch(test_peer, 30, 8)  # asked again: the grant's credit with it
    answer(test_peer, reader, *range(30, 38))
    assert owner.records(8) == [record(seq) for seq in range(30, 38)]


@pytest.mark.usefixtures("quick_retry")
def test_a_second_fetch_that_brought_nothing_is_no_proof_either(
    reader: Reader, test_peer: TestPeer, owner: Owner
) -> None:
    """A store that keeps less answers the first FETCH for 30 with 34, 35; the second
    FETCH is lost (nobody answers it). Only one FETCH brought later records: the cursor
    asks for 30 again (the first one's answers counted for the second too)."""
    reader.start(CURSOR, "hello", test_peer.address, 30, 4, 1, head=99, jump=True)
    expect_fetch(test_peer, 30, 4)
    answer(test_peer, reader, 34, 35)
    expect_fetch(test_peer, 30, 4)  # lost: nobody answers it
    expect_fetch(test_peer, 30, 4)


@pytest.mark.usefixtures("quick_retry")
def test_another_cursors_answers_are_no_proof_that_a_record_is_gone(
    reader: Reader, test_peer: TestPeer, owner: Owner
) -> None:
    """Two groups of this gateway read the partition: OTHER from 35, CURSOR restarting at
    its commit 30 with `jump`. The stores keep everything, but answer CURSOR late, and
    OTHER's FETCH meanwhile (twice, two stores): those answers reach every cursor of the
    reader, and CURSOR took them for the stores' oldest, jumped to 35 and skipped 30..34.
    It asks for 30 again and again (six retry intervals watched), then gets them."""
    reader.start(OTHER, "hello", test_peer.address, 35, 10, 1, head=99, jump=False)
    reader.start(CURSOR, "hello", test_peer.address, 30, 4, 1, head=99, jump=True)
    fetches = {test_peer.recv_id(proto.FETCH, WAIT).sequence for _ in range(2)}
    assert fetches == {30, 35}
    answer(test_peer, reader, *range(35, 45))  # OTHER's answer, from one store
    assert test_peer.recv_id(proto.FETCH, WAIT).sequence == 30  # CURSOR's, asked again
    answer(test_peer, reader, *range(35, 45))  # from a second store
    asked = [test_peer.recv_id(proto.FETCH, WAIT).sequence for _ in range(6)]
    assert set(asked) == {30}, f"CURSOR jumped over 30..34 that every store keeps: {asked}"
    answer(test_peer, reader, 30, 31, 32, 33)
    delivered: list[int] = []  # CURSOR's (OTHER's 35..44 are in the queue too)
    while len(delivered) < 4:
        event = owner.events.get(timeout=WAIT)
        if event[0] == "record" and event[1] == CURSOR:
            delivered.append(event[2])
    assert delivered == [30, 31, 32, 33]


@pytest.mark.usefixtures("quick_retry")
def test_two_cursors_from_0_on_a_trimmed_partition_both_jump(
    reader: Reader, test_peer: TestPeer, owner: Owner
) -> None:
    """Two groups of this gateway start at 0 where retention took 0..4: the stores answer
    every FETCH of 0 with 5 and 6. Each cursor's answers also reach the other, from a
    FETCH at 0 as well, which proves the gap as well as its own: both jump to 5. (Taking
    every answer within another cursor's FETCH for no proof, neither ever jumped.)"""
    reader.start(CURSOR, "hello", test_peer.address, 0, 100, 1, head=6)
    reader.start(OTHER, "hello", test_peer.address, 0, 100, 1, head=6)
    delivered: dict[object, list[int]] = {CURSOR: [], OTHER: []}
    for _ in range(6):  # two FETCHes each before the jump, one each after
        fetch = test_peer.recv_id(proto.FETCH, WAIT)
        assert fetch.sequence in (0, 5), f"FETCH from {fetch.sequence}"
        answer(test_peer, reader, 5, 6)  # a store keeping 5 and 6 answers from its oldest
    while len(delivered[CURSOR]) + len(delivered[OTHER]) < 4:
        event = owner.events.get(timeout=WAIT)
        if event[0] == "record":
            delivered[event[1]].append(event[2])
    assert delivered == {CURSOR: [5, 6], OTHER: [5, 6]}


@pytest.mark.usefixtures("quick_retry")
def test_a_jump_goes_to_the_lowest_answer_even_when_another_cursor_asked_for_it(
    reader: Reader, test_peer: TestPeer, owner: Owner
) -> None:
    """Retention took 0..4. Another cursor reads one record from 5 (as rafka-topics'
    `First` looks up the oldest) while this one, at 0, may jump: the stores answer both
    from 5. 5 may answer the other's FETCH, 6 cannot: the jump goes to 5, the lowest
    answer. Leaving out every answer within the other's FETCH made it go to 6, and a
    describe said the topic began at 6."""
    reader.start(OTHER, "hello", test_peer.address, 5, 1, 1, head=6, jump=False)
    assert test_peer.recv_id(proto.FETCH, WAIT).sequence == 5
    answer(test_peer, reader, 5)
    reader.start(CURSOR, "hello", test_peer.address, 0, 1, 1, head=6, jump=True)
    for _ in range(2):
        assert test_peer.recv_id(proto.FETCH, WAIT).sequence == 0
        answer(test_peer, reader, 5, 6)
    expect_fetch(test_peer, 5, 1)
    answer(test_peer, reader, 5)
    delivered: list[int] = []
    while not delivered:
        event = owner.events.get(timeout=WAIT)
        if event[0] == "record" and event[1] == CURSOR:
            delivered.append(event[2])
    assert delivered == [5]


def test_credit_granted_during_a_fetch_is_fetched_at_once_past_it(
    reader: Reader, test_peer: TestPeer, owner: Owner
) -> None:
    """Records 0..19 stored (head known), credit 4: FETCH 0..3. Two answered, 2 more
    granted: FETCH 4..5 goes before the first FETCH is done (the stores' answers need not
    stop for a round trip), and everything arrives once, in order."""
    reader.start(CURSOR, "hello", test_peer.address, 0, 4, 1, head=19, jump=False)
    expect_fetch(test_peer, 0, 4)
    answer(test_peer, reader, 0, 1)
    assert owner.records(2) == [record(0), record(1)]
    reader.grant(CURSOR, 2)
    expect_fetch(test_peer, 4, 2)
    answer(test_peer, reader, 2, 3, 4, 5)
    answer(test_peer, reader, 2, 3, 4, 5)  # a second store's answers: dropped
    assert owner.records(4) == [record(seq) for seq in range(2, 6)]
    reader.grant(CURSOR, 3)  # nothing under way: a plain FETCH
    expect_fetch(test_peer, 6, 3)
    answer(test_peer, reader, 6, 7, 8)
    assert owner.records(3) == [record(6), record(7), record(8)]


def test_records_taken_elsewhere_are_dropped_when_their_copies_come(
    reader: Reader, test_peer: TestPeer, owner: Owner
) -> None:
    """The owner's word that it took records in process wakes nobody (`Reader.took`):
    the copies' arrival does, and the reader hears of the takes before it reads them."""
    start(reader, test_peer, credit=100)
    live(test_peer, 0)
    assert owner.records(1) == [record(0)]
    reader.took([(CURSOR, 4, 3, 1)])  # 1..3, taken in process
    live(test_peer, 1, 2, 3, 4)
    assert owner.records(1) == [record(4)], "copies of records taken in process delivered"


def test_records_are_read_by_their_own_sequence_with_or_without_trailing_bytes(
    reader: Reader, test_peer: TestPeer, owner: Owner
) -> None:
    """Bytes after a record's last field are ignored, as in C. The reader recognises a
    known partition's records by their first bytes (`_Actor.known`): a record with
    trailing bytes, whose sequence is not its last 8 bytes, must not pass for one."""
    start(reader, test_peer, credit=100)
    live(test_peer, 0, 1)  # the partition's frames known from here
    encoder = proto.RecordEncoder("hello", test_peer.address, "hello")
    for seq in (2, 3):  # one trailing byte: all but the last 8 bytes are alike for both
        header, content = encoder.encode(seq, f"r{seq}".encode())
        test_peer.send_frames([header + b"\x09", content])
    live(test_peer, 4)
    answer(test_peer, reader, 5)  # a FETCH answer's frames, known from here
    answer(test_peer, reader, 6)
    assert owner.records(7) == [record(seq) for seq in range(7)]


def test_a_record_the_codec_decodes_but_would_not_encode_stops_nothing(
    reader: Reader, test_peer: TestPeer, owner: Owner
) -> None:
    """A NUL inside a record's address passes the decoder (C's does not look), though the
    codec would not encode it: the reader takes it as any record (known by its bytes
    from then on) and reads on."""
    start(reader, test_peer, credit=100)
    address = b"bad\0address"
    header = (
        bytes((proto.RECORD,)) + b"hello\0\x01"
        + bytes((len(address),)) + address + b"\x05hello" + b"\x00" * 8
    )  # fmt: skip
    test_peer.send_frames([header, b"odd"])
    live(test_peer, 0, 1)
    assert owner.records(2) == [record(0), record(1)]


@pytest.fixture
def quiet_beacons(dafka_config: Config) -> Config:
    """Beacons every 3 s instead of 50 ms and no repeated GET_HEADS (set before the
    tower, the peer and the reader start: listed first), so that nothing but a command's
    own wake-up wakes the reader within its longest wait, a second."""
    dafka_config.set("beacon/interval", 3000)
    dafka_config.set("consumer/heads_interval", 0)
    return dafka_config


def test_a_command_queued_behind_a_take_still_wakes_the_reader(
    quiet_beacons: Config, reader: Reader, test_peer: TestPeer
) -> None:
    """A take queued without a wake-up must not swallow the next command's: the FETCH of
    a cursor started right after goes at once (0.2 ms here), not at the reader's next
    timer (1.0 s later: the bound of 0.5 s leaves a loaded machine room either side)."""
    reader.took([(("other", "cursor"), 4, 3, 1)])
    started = time.monotonic()
    reader.start(CURSOR, "hello", test_peer.address, 0, 4, 1, head=2, jump=False)
    expect_fetch(test_peer, 0, 3)
    waited = time.monotonic() - started
    assert waited < 0.5, f"the FETCH went {waited:.3f} s after the start: not woken"
