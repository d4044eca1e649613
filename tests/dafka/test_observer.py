"""The gateway's observer (`observer.Observer`): the heads of every partition, per topic,
from HEADs (published) and the stores' answers (stored), with a real store and producers
on the test's tower."""

from __future__ import annotations

import pytest
import zmq

from backends.dafka import proto
from backends.dafka.config import Config
from backends.dafka.observer import GIVE_UP, RETRY, NotSettled, Observer
from backends.dafka.producer import Producer
from backends.dafka.storage import Storage, partition_keys
from backends.dafka.store import Store
from backends.dafka.test_peer import TestPeer
from backends.dafka.tower import Tower
from tests.support.waiting import wait_until


def test_heads_of_a_topic_are_its_own_partitions_only(dafka_config: Config, store: Store) -> None:
    ctx: zmq.Context = zmq.Context.instance()
    producers = [Producer(dafka_config, topic, ctx) for topic in ("a", "ab", "a", "b")]
    observer = Observer(dafka_config, ctx)
    try:
        for number, producer in enumerate(producers):
            producer.publish_many([b"x"] * (number + 1))
        expected = {
            "a": {producers[0].address: 0, producers[2].address: 2},
            "ab": {producers[1].address: 1},
            "b": {producers[3].address: 3},
        }
        wait_until(
            lambda: all(observer.heads(topic) == heads for topic, heads in expected.items()),
            10,
            f"the heads of each topic ({ {t: observer.heads(t) for t in expected} })",
        )
        assert observer.topics() == {"a", "ab", "b"}
        assert observer.heads("c") == {}
        # What a store acknowledged to a producer of this process counts at once.
        observer.note_stored("c", producers[0].address, 7)
        assert observer.heads("c") == {producers[0].address: 7}
        assert observer.stored_head("c", producers[0].address) == 7
    finally:
        observer.close()
        for producer in producers:
            producer.close(timeout=0)


def test_an_empty_store_ends_its_answer_so_the_observer_settles(
    dafka_config: Config, store: Store
) -> None:
    observer = Observer(dafka_config, zmq.Context.instance())
    try:
        observer.wait_settled(1, 10)
        assert observer.answered() == 1, "the empty store's END_OF_HEADS did not count"
        assert observer.topics() == set()
    finally:
        observer.close()


def _greeted(peer: TestPeer, observer: Observer) -> str:
    """Make `peer` a store reader the observer greets; the requester address it uses."""
    peer.wait_subscribed(proto.subscription(proto.STORE_HELLO, observer.address), 10)
    # Else the greeting may go out before our SUB is there to get it: counted, not seen.
    peer.wait_connected(observer.address, 10)
    peer.send_store_hello(observer.address)
    hello = peer.recv_id(proto.CONSUMER_HELLO, 10)
    assert hello.subjects == [proto.EVERY_SUBJECT], hello
    peer.wait_subscribed(proto.subscription(proto.DIRECT_HEAD, hello.address), 10)
    return hello.address


def _end_of_heads(peer: TestPeer, requester: str, sent: int) -> None:
    peer.send(
        proto.Message(
            proto.DIRECT_HEAD,
            requester.encode(),
            address=peer.address,
            subject=proto.EVERY_SUBJECT,
            sequence=sent,
        )
    )


def test_every_observer_gets_every_head_of_a_large_store(
    store_config: Config, tower: Tower
) -> None:
    """A store holding 20,000 partitions answers a new observer's hello at once, while
    the observer's subscription to that answer may still be on its way: the start of the
    answer was dropped, and a quarter of observers settled without some hundreds of heads
    (for a gateway: its committed offsets, or its own partitions' heads)."""
    partitions = 20_000
    with Storage(store_config.get("store/db"), sync=False) as storage:
        batch = storage.new_batch()
        for number in range(partitions):
            keys = partition_keys(f"t{number}".encode(), b"P%d" % number)
            storage.stage_partition(batch, keys, 3, 1, 1)
        storage.commit(batch)
    ctx: zmq.Context = zmq.Context.instance()
    with Store(store_config, ctx):
        for attempt in range(10):
            observer = Observer(store_config, ctx)
            try:
                observer.wait_settled(1, 30)
                seen = len(observer.topics())
            finally:
                observer.close()
            assert seen == partitions, f"observer {attempt} settled with {seen} heads"


def test_a_slow_store_is_waited_for_until_its_answer_ends(
    dafka_config: Config, test_peer: TestPeer
) -> None:
    """A store that answers later than `settle` (a loaded machine; played by a scripted
    peer, as a real store cannot be slowed on purpose): the observer is not settled before
    its END_OF_HEADS, so a restarted gateway never resumes a partition below the stored
    head (which lost DUMP-confirmed records: the stores drop a record at an offset they
    hold, and ACK it)."""
    observer = Observer(dafka_config, zmq.Context.instance(), settle=0.1)
    try:
        requester = _greeted(test_peer, observer)
        with pytest.raises(NotSettled, match="0 of 1 Dafka store"):
            observer.wait_settled(1, 1.0)  # ten times `settle` with no answer
        test_peer.send_direct_head(requester, "t", 41)
        _end_of_heads(test_peer, requester, 1)
        observer.wait_settled(1, 10)
        assert observer.stored_head("t", test_peer.address) == 41
        # The mark is not a partition.
        assert observer.topics() == {"t"}
    finally:
        observer.close()


def test_a_store_whose_answer_lost_its_start_is_greeted_again(
    dafka_config: Config, test_peer: TestPeer
) -> None:
    """The start of a store's answer went out before our subscription to it had reached
    the store (a race a real store cannot be made to lose on purpose; played by a scripted
    peer): its mark counts two heads, one came. The observer is not settled on that answer,
    greets the store again at once and for as long as it takes (a store that marks is
    never taken for a C store, which would settle it by the quiet rule), and settles on
    the whole answer, with both heads."""
    observer = Observer(dafka_config, zmq.Context.instance(), settle=0.1)
    try:
        requester = _greeted(test_peer, observer)
        test_peer.send_direct_head(requester, "t", 41)  # "offsets", 9 went before us
        _end_of_heads(test_peer, requester, 2)
        again = test_peer.recv_id(proto.CONSUMER_HELLO, 10)
        assert again.address == requester and again.subjects == [proto.EVERY_SUBJECT]
        # Greeted past a C store's GIVE_UP greetings (the first two are in): one taken for
        # a C store would be greeted no more, and settled by the quiet rule.
        for _ in range(GIVE_UP - 1):
            again = test_peer.recv_id(proto.CONSUMER_HELLO, 10 * RETRY)
            assert again.address == requester and again.subjects == [proto.EVERY_SUBJECT]
        with pytest.raises(NotSettled, match="0 of 1 Dafka store"):
            observer.wait_settled(1, 0)
        assert observer.stored_head("offsets", test_peer.address) is None
        test_peer.send_direct_head(requester, "offsets", 9)
        test_peer.send_direct_head(requester, "t", 41)
        _end_of_heads(test_peer, requester, 2)
        observer.wait_settled(1, 10)
        assert observer.stored_head("offsets", test_peer.address) == 9
        assert observer.stored_head("t", test_peer.address) == 41
    finally:
        observer.close()


def test_only_the_reader_itself_ends_its_answer(dafka_config: Config, test_peer: TestPeer) -> None:
    """A partition of subject "" (a C producer may write one) comes as a DIRECT_HEAD of
    subject "" like the mark, but with the partition's address: it is a head, not the
    end of the answer, and the answer ends with the reader's own mark counting it too."""
    observer = Observer(dafka_config, zmq.Context.instance(), settle=0.1)
    try:
        requester = _greeted(test_peer, observer)
        other = "0" * 31 + "1"
        test_peer.send(
            proto.Message(
                proto.DIRECT_HEAD,
                requester.encode(),
                address=other,
                subject=proto.EVERY_SUBJECT,
                sequence=0,
            )
        )
        # A head sent after it has been taken: so has the partition of subject "".
        test_peer.send_direct_head(requester, "t", 41)
        wait_until(lambda: observer.stored_head("t", test_peer.address) == 41, 10, "the head of t")
        with pytest.raises(NotSettled, match="0 of 1 Dafka store"):
            observer.wait_settled(1, 0)
        _end_of_heads(test_peer, requester, 2)
        observer.wait_settled(1, 10)
        assert observer.answered() == 1
    finally:
        observer.close()


def test_a_store_that_does_not_end_its_answer_is_greeted_again(
    dafka_config: Config, test_peer: TestPeer
) -> None:
    """A hello (or its answer) lost on the way: the observer asks again until the store's
    answer ends, and not after."""
    observer = Observer(dafka_config, zmq.Context.instance(), settle=0.1)
    try:
        requester = _greeted(test_peer, observer)
        again = test_peer.recv_id(proto.CONSUMER_HELLO, 10)  # the first one went unanswered
        assert again.address == requester and again.subjects == [proto.EVERY_SUBJECT]
        _end_of_heads(test_peer, requester, 0)
        observer.wait_settled(1, 10)
        assert observer.answered() == 1
        # Settled: no more hellos (one may have been on its way; retries come every 0.25 s).
        late = 0
        with pytest.raises(TimeoutError):
            while True:
                test_peer.recv_id(proto.CONSUMER_HELLO, 1.0)
                late += 1
                assert late <= 1, "greeted again after its answer ended"
    finally:
        observer.close()


def test_a_store_that_never_marks_its_answer_is_taken_for_a_c_store(
    dafka_config: Config, test_peer: TestPeer
) -> None:
    """C stores send no END_OF_HEADS: after GIVE_UP greetings the observer takes the
    reader for one, judges it by the quiet rule, and greets it no more (a joined gateway
    on C stores starts, GIVE_UP x RETRY seconds later than on ours)."""
    observer = Observer(dafka_config, zmq.Context.instance(), settle=0.1)
    try:
        requester = _greeted(test_peer, observer)
        test_peer.send_direct_head(requester, "c", 7)  # a C store's answer: heads, no mark
        observer.wait_settled(1, 10)
        assert observer.stored_head("c", test_peer.address) == 7
        # The greetings it got before it was taken for a C store: each waited for with a
        # generous bound (a loaded machine may hold the observer's thread past RETRY),
        # then a quiet second with no more.
        for greeting in range(2, GIVE_UP + 1):
            try:
                test_peer.recv_id(proto.CONSUMER_HELLO, 10)
            except TimeoutError:
                pytest.fail(f"greeted {greeting - 1} times, not {GIVE_UP}, before given up")
        try:
            test_peer.recv_id(proto.CONSUMER_HELLO, 1.0)
        except TimeoutError:
            pass
        else:
            pytest.fail(f"greeted again after {GIVE_UP} greetings, when taken for a C store")
    finally:
        observer.close()


def test_a_closed_observer_asked_for_heads_does_nothing(dafka_config: Config, tower: Tower) -> None:
    """An owner's late call on a closed actor: the wake-up goes nowhere. (The owner wakes
    its actor through libzmq directly, holding the GIL: a send on the closed pipe would
    use freed memory.)"""
    observer = Observer(dafka_config, zmq.Context.instance())
    observer.close()
    observer.ask({"t"})
    assert observer.heads("t") == {}
