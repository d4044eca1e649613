"""Helpers of the store tests: a test peer linked to a store, and what it sends and
receives (the fixtures `store_config`, `store` and `linked` are in conftest.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import zmq

from backends.dafka import proto
from backends.dafka.config import Config
from backends.dafka.proto import Message
from backends.dafka.store import Store
from backends.dafka.test_peer import TestPeer
from tests.support.waiting import wait_until


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


def link_with_sentinel(peer: TestPeer, store: Store, nth: int = 1) -> None:
    """`link`, then a record of topic "sentinel" stored and acknowledged: the store's
    writer takes the peer's RECORDs from then on."""
    link(peer, store, nth)
    store_records(peer, "sentinel", [b"end"])


@contextmanager
def linked_store(
    config: Config, peer: TestPeer, nth: int = 1, *, sentinel: bool = False
) -> Iterator[Store]:
    """A store on `config`, linked to `peer` (`link`; with `sentinel`, `link_with_sentinel`),
    closed at the end."""
    with Store(config, zmq.Context.instance()) as store:
        if sentinel:
            link_with_sentinel(peer, store, nth)
        else:
            link(peer, store, nth)
        yield store


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
