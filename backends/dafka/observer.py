"""The observer actor: what the Dafka network holds, without consuming any record.

The gateway needs to know, for every topic, its partitions and their heads: to resume its
own partitions where the stores stopped (never reusing an offset), to list topics (KEYS),
and to start a group at `latest`. The observer is a consumer-shaped node that subscribes
to every HEAD (`H`, one message per partition per `producer/head_interval`) and to the
answers addressed to it, and asks every store reader for the heads of every subject: a
CONSUMER_HELLO with the subject "" (C's reader matches subjects by prefix, ours treats ""
as "every subject"), at hello time and on `refresh()` (GET_HEADS with topic "").

DIRECT_HEADs carry no store address, so the observer asks each store reader under a
requester address of its own (a uuid per store, the routing topic of that store's
answers): it knows what each store holds, and so which records every store the tower
knows has (`acks: all`).

"A store has answered in full" is told by our store readers' END_OF_HEADS mark after the
heads of every subject (`proto.EVERY_SUBJECT`): the observer is *settled* once every store
reader it greeted has sent its mark (at least `min_stores` of them), or once `min_stores`
have and no answer came for `settle` seconds. A hello can be lost (the reader's SUB had
not joined our XPUB yet; our subscription to its answers had not reached it yet): a reader
greeted and silent is greeted again every `RETRY` seconds, and so is one whose mark
counts more heads than came since its last mark: the start of its answer went out before
our subscription to it reached the store (a gateway restarted at once on a busy machine
loaded no committed offset, CI run of 2026-11-28). A reader greeted `GIVE_UP`
times without a mark is taken for a C store (they send none): it counts as answered, by
the quiet rule, and is greeted no more until a refresh; one that sent a mark once never
is (a partial answer repeated past that would settle the observer on it).
Judging by time alone made a gateway restarted on a slow machine settle before its
store's answer came, resume its partitions at offset 0 and lose records a store then
refused as already held (the kill -9 test, CI run of 2026-11-24).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import structlog
import zmq

from backends.dafka import proto
from backends.dafka.beacon import Beacon, apply_events, new_subscribers, now_ms
from backends.dafka.config import Config
from backends.dafka.node import Node, messages

log = structlog.get_logger(__name__)

RETRY = 0.25  # seconds before greeting again a store reader whose answer did not end
GIVE_UP = 8  # greetings without END_OF_HEADS before a reader is taken for a C store


class NotSettled(Exception):
    """The stores did not all answer in time."""


class Observer(Node):
    """Heads of every partition the network holds, kept current from HEAD messages."""

    kind = "observer"

    def __init__(
        self,
        config: Config,
        context: zmq.Context | None = None,
        *,
        settle: float = 0.1,
        on_head: Callable[[str, str, int], None] | None = None,
    ) -> None:
        """`on_head(topic, address, head)` runs on the actor thread for every head that
        moved (stored or published)."""
        self._settle = settle
        self._on_head = on_head
        self._cond = threading.Condition()
        # (topic, address) -> head; stored: what a store answered; published: HEADs.
        self._stored: dict[tuple[str, str], int] = {}
        self._published: dict[tuple[str, str], int] = {}
        # topic -> addresses in either table: heads(topic) looks at that topic's partitions
        # only, not at every partition of the network (it runs once per partition a
        # gateway opens, and per LLEN).
        self._addresses: dict[str, set[str]] = {}
        self._readers: set[str] = set()  # store readers greeted
        self._complete: set[str] = set()  # readers whose last full answer ended (mark)
        self._greeted_at: dict[str, float] = {}  # reader -> last full request, until marked
        self._greetings: dict[str, int] = {}  # reader -> full requests it left unmarked
        self._unmarked: set[str] = set()  # readers greeted GIVE_UP times, never marked: C
        self._marking: set[str] = set()  # readers that sent a mark: never taken for C
        self._requester: dict[str, str] = {}  # reader -> our requester address for it
        self._reader_of: dict[bytes, str] = {}  # requester routing bytes -> reader
        self._held: dict[str, dict[tuple[str, str], int]] = {}  # reader -> its heads
        # reader -> the partitions it answered since its last END_OF_HEADS, to tell a whole
        # answer from one whose start went before our subscription to it had arrived.
        self._answer: dict[str, set[tuple[str, str]]] = {}
        self._alive: set[str] = set()  # readers the tower still announces
        self._asked: set[str] = set()  # topics to ask every store about (actor picks up)
        self._last_answer = time.monotonic()
        self._refresh_requested = False
        super().__init__(config, context, self._cond)

    # -- user side (any thread) ---------------------------------------------------------

    @property
    def stores(self) -> int:
        """Store readers greeted so far."""
        with self._cond:
            return len(self._readers)

    def wait_settled(self, min_stores: int, timeout: float) -> None:
        """Block until at least `min_stores` store readers answered in full (END_OF_HEADS)
        and the others greeted did too or stopped answering for `settle` seconds; raise
        NotSettled after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                now = time.monotonic()
                quiet = now - self._last_answer
                complete = len(self._complete)
                answered = len(self._complete | self._unmarked)
                enough = answered >= min_stores
                if enough and (complete >= len(self._readers) or quiet >= self._settle):
                    return
                if now >= deadline:
                    raise NotSettled(
                        f"{answered} of {min_stores} Dafka store(s) answered within {timeout:g} s"
                    )
                wait = self._settle - quiet if enough else 0.05
                self._cond.wait(max(0.001, min(wait, deadline - now)))

    def answered(self) -> int:
        """Store readers greeted that answered: with their END_OF_HEADS mark, or (C stores,
        which send none) with at least one head."""
        with self._cond:
            return sum(
                1 for reader in self._readers if reader in self._complete or self._held.get(reader)
            )

    def refresh(self, min_stores: int, timeout: float) -> None:
        """Ask every store for every head again, then wait until settled."""
        with self._cond:
            self._refresh_requested = True
            self._complete.clear()  # settled again only by answers to this request
            self._last_answer = time.monotonic()
            self._wake(b"R")
        self.wait_settled(min_stores, timeout)

    def note_stored(self, topic: str, address: str, head: int) -> None:
        """A store acknowledged `head` to a producer of this process: known at once,
        before any HEAD or DIRECT_HEAD says so."""
        with self._cond:
            if head > self._stored.get((topic, address), -1):
                self._stored[(topic, address)] = head
                self._addresses.setdefault(topic, set()).add(address)

    def note_stored_many(self, heads: list[tuple[str, str, int]]) -> None:
        """`note_stored` for many (topic, address, head) under one lock: the ACKs the
        gateway's writers got in one delivery to its loop. With records spread over
        1,000 topics a store ACKs about every record on its own, and taking this
        Condition per ACK was 8% of the loop's time."""
        stored = self._stored
        addresses = self._addresses
        with self._cond:
            for topic, address, head in heads:
                key = (topic, address)
                if head > stored.get(key, -1):
                    stored[key] = head
                    addresses.setdefault(topic, set()).add(address)

    def ask(self, topics: set[str]) -> None:
        """Ask every store again for the heads of `topics` (answers update the tables)."""
        with self._cond:
            self._asked |= topics
            self._wake(b"A")

    def held_by_all(self, topic: str, address: str) -> int:
        """The head every store the tower knows holds (-1: not all hold anything)."""
        with self._cond:
            alive = self._alive
            if not alive:
                return -1
            return min(self._held.get(r, {}).get((topic, address), -1) for r in alive)

    def stored_head(self, topic: str, address: str) -> int | None:
        with self._cond:
            return self._stored.get((topic, address))

    def heads(self, topic: str) -> dict[str, int]:
        """address -> highest head known (stored or published) of every partition."""
        with self._cond:
            out: dict[str, int] = {}
            for address in self._addresses.get(topic, ()):
                key = (topic, address)
                out[address] = max(self._stored.get(key, -1), self._published.get(key, -1))
            return out

    def topics(self) -> set[str]:
        with self._cond:
            return set(self._addresses)

    # -- actor --------------------------------------------------------------------------

    def _subscriptions(self) -> list[bytes]:
        return [
            proto.subscription(proto.HEAD),
            proto.subscription(proto.DIRECT_HEAD, self.address),
            proto.subscription(proto.STORE_HELLO, self.address),
        ]

    def _loop(self, pipe: zmq.Socket, sub: zmq.Socket, xpub: zmq.Socket, beacon: Beacon) -> None:
        poller = zmq.Poller()
        for sock in (pipe, sub, xpub, beacon.socket):
            poller.register(sock, zmq.POLLIN)
        while True:
            wait = max(0, min(beacon.next_deadline_ms() - now_ms(), 1000))
            if self._greeted_at:
                wait = min(wait, int(RETRY * 1000))
            events = dict(poller.poll(wait))
            if pipe in events:
                stop = False
                while True:
                    try:
                        stop = pipe.recv(zmq.NOBLOCK) == b"T" or stop
                    except zmq.Again:
                        break
                if stop:
                    return
                with self._cond:
                    refresh, self._refresh_requested = self._refresh_requested, False
                    asked, self._asked = self._asked, set()
                    readers = list(self._alive)
                subjects = [proto.EVERY_SUBJECT] if refresh else sorted(asked)
                if subjects:
                    for name in readers:
                        self._hello(sub, xpub, name.encode(), subjects)
            if beacon.socket in events:
                apply_events(beacon.handle(), sub)
            if xpub in events:
                for subscriber in new_subscribers(xpub, proto.CONSUMER_HELLO):
                    self._hello(sub, xpub, subscriber)
            if sub in events:
                self._drain(sub, xpub)
            apply_events(beacon.tick(now_ms()), sub)
            self._track_alive(beacon)
            self._greet_silent(sub, xpub)

    def _greet_silent(self, sub: zmq.Socket, xpub: zmq.Socket) -> None:
        """Greet again the readers asked for every head more than RETRY seconds ago that
        did not end their answer (the hello or the answer was lost)."""
        now = time.monotonic()
        for name, at in list(self._greeted_at.items()):
            if now - at < RETRY:
                continue
            if self._greetings.get(name, 0) < GIVE_UP or name in self._marking:
                self._hello(sub, xpub, name.encode())
                continue
            with self._cond:  # never marks: a C store; the quiet rule judges it
                del self._greeted_at[name]
                self._unmarked.add(name)
                self._cond.notify_all()

    def _track_alive(self, beacon: Beacon) -> None:
        """The store readers the tower still announces (a dead one leaves after
        `beacon/timeout`), so that `acks: all` does not wait for a store that is gone."""
        with self._cond:
            alive = self._readers.intersection(beacon.senders)
            if alive != self._alive:
                for gone in self._alive - alive:
                    self._greeted_at.pop(gone, None)  # a dead store never answers
                    self._greetings.pop(gone, None)
                    self._answer.pop(gone, None)
                    self._marking.discard(gone)
                self._alive = alive
                self._cond.notify_all()

    def _hello(
        self,
        sub: zmq.Socket,
        xpub: zmq.Socket,
        reader: bytes,
        subjects: list[str] | None = None,
    ) -> None:
        if not reader or b"\0" in reader:
            return
        name = reader.decode("ascii", "replace")
        requester = self._requester.get(name)
        if requester is None:
            requester = self._requester[name] = uuid.uuid4().hex.upper()
            self._reader_of[requester.encode()] = name
            sub.setsockopt(zmq.SUBSCRIBE, proto.subscription(proto.DIRECT_HEAD, requester))
        hello = proto.Message(
            proto.CONSUMER_HELLO,
            reader,
            address=requester,
            subjects=subjects if subjects is not None else [proto.EVERY_SUBJECT],
        )
        xpub.send_multipart(proto.encode(hello))
        with self._cond:
            self._readers.add(name)
            self._last_answer = time.monotonic()
            if (
                proto.EVERY_SUBJECT in hello.subjects
                and name not in self._complete
                and name not in self._unmarked
            ):
                self._greeted_at[name] = self._last_answer
                self._greetings[name] = self._greetings.get(name, 0) + 1
            self._cond.notify_all()

    def _end_of_heads(self, reader: str, sent: int) -> None:
        answered = len(self._answer.pop(reader, ()))
        self._marking.add(reader)
        if answered < sent:
            # Part of the answer went out before the store had our subscription to it: the
            # heads it dropped may be the ones that matter (the offsets topic's, our own
            # partitions'). Greet it again at once, as if the mark had been lost, unless
            # an answer of it ended whole already or it is gone (no longer greeted).
            log.info("partial heads answer", reader=reader, sent=sent, received=answered)
            with self._cond:
                if reader in self._greeted_at or reader in self._unmarked:
                    self._unmarked.discard(reader)
                    self._greeted_at[reader] = time.monotonic() - RETRY
                    self._cond.notify_all()
            return
        with self._cond:
            self._complete.add(reader)
            self._greeted_at.pop(reader, None)
            self._greetings.pop(reader, None)
            self._unmarked.discard(reader)
            self._last_answer = time.monotonic()
            self._cond.notify_all()

    def _drain(self, sub: zmq.Socket, xpub: zmq.Socket) -> None:
        moved: list[tuple[str, str, int]] = []
        answered = False
        for msg in messages(sub, 100_000):
            if msg.id == proto.STORE_HELLO:
                self._hello(sub, xpub, msg.address.encode())
                continue
            if msg.id not in (proto.HEAD, proto.DIRECT_HEAD) or msg.sequence < 0:
                continue
            if proto.is_end_of_heads(msg):
                reader = self._reader_of.get(msg.topic)
                if reader is not None and msg.address == reader:
                    self._end_of_heads(reader, msg.sequence)
                elif reader is not None:  # a partition of subject "" (a C producer's)
                    self._answer.setdefault(reader, set()).add((msg.subject, msg.address))
                continue
            key = (msg.subject, msg.address)
            seq = msg.sequence
            with self._cond:
                if msg.id == proto.HEAD:
                    table = self._published
                else:
                    answered = True
                    table = self._stored
                    reader = self._reader_of.get(msg.topic)
                    if reader is not None:
                        self._answer.setdefault(reader, set()).add(key)
                        held = self._held.setdefault(reader, {})
                        if seq > held.get(key, -1):
                            held[key] = seq
                            moved.append((msg.subject, msg.address, seq))
                if seq > table.get(key, -1):
                    table[key] = seq
                    self._addresses.setdefault(msg.subject, set()).add(msg.address)
                    moved.append((msg.subject, msg.address, seq))
        if answered:
            with self._cond:
                self._last_answer = time.monotonic()
                self._cond.notify_all()
        if self._on_head is not None:
            for topic, address, head in moved:
                self._on_head(topic, address, head)
