"""The producer actor (spec §3) for any number of partitions: one thread, one PUB, one SUB
and one beacon publish the RECORDs and HEADs of every partition it was given.

On the wire nothing changes: each partition keeps its own address (its uuid), which is the
`address` of its RECORDs and HEADs and the routing topic its ACKs and FETCHes are sent to;
the SUB subscribes `K<address>` and `F<address>` for each of them. Peers learn the data
socket's endpoint from the actor's beacon (its own uuid); stores and consumers connect to
it and take every partition's records from it, as they would from N producers (records are
told apart by their `address` field, not by the socket they came on). `producer.Producer`,
the standalone producer, is this actor with one partition whose address is the actor's.

What one partition costs then: its queue, its unacked records, a SUB subscription, and a
HEAD per `producer/head_interval` (all partitions' HEADs leave on one timer). N producers
of their own cost N threads, N x (PUB + SUB + beacon PUB + beacon SUB) sockets and their
connections, and N beacons per interval that the tower sends to every node: N² messages.

Per partition, as the single producer did (issue 7):
- its first records wait `producer/subscribe_settle` ms after it was opened, so that its
  SUB subscription `K<address>` reaches the stores before a C store (which ACKs once)
  answers; later records are never held;
- a last HEAD on the way out, so a consumer that missed the records and HEADs of a
  short-lived partition still learns it exists.

Threading: `Partition.publish()`/`publish_many()`, `Publisher.publish_batch()` (the records of
many partitions in one hand-over) and `Publisher.open()` may be called from any thread. A
publish appends to the partition's deque and, when the partition is not already flagged,
flags it and wakes the actor (at most one wake-up pending for all partitions); the actor
drains what it finds, up to `_BATCH` records per pass, so ACKs and FETCHes are not starved.
Every socket except the user end of the pipe lives in the actor.

Over 500 lines: the user side (`Partition`, `publish_batch`) and the actor share private
state under one lock (queues, flags, the pending wake-up); split, that contract would span
two modules.
"""

from __future__ import annotations

import collections
import contextlib
import math
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence

import structlog
import zmq

from backends.dafka import proto
from backends.dafka.beacon import Beacon, apply_events, bind_data_socket, now_ms
from backends.dafka.config import Config
from backends.dafka.doubling import DoublingGap
from backends.dafka.held_send import SendRecords, records_sender
from backends.dafka.node import Actor, SocketFactory
from backends.dafka.unacked import UnackedList

log = structlog.get_logger(__name__)

# How many records the actor takes from the deques before it looks at its sockets again
# (C: up to 100,000 commands per wake-up), so ACKs and FETCHes are not starved.
_BATCH = 100_000
# The ready partitions' records are sent holding the GIL when this few are queued in all
# (`held_send.records_sender`); more, giving it up for the batch. Without the C fast path,
# held for any number, redis-benchmark -P 16 cost the gateway 0.3-0.5 µs more CPU per
# record: pyzmq's call is the cheaper one there (0.37 against 0.53 µs a frame).
_HOLD_GIL_UP_TO = 256
# The first HEAD goes this long after the actor's first record, each next one twice as
# long after the one before (`DoublingGap`), up to producer/head_interval. A PUB drops
# what it sends before a subscriber has connected, and the stores connect to a new actor
# when its beacon reaches them, often a few ms after a fresh gateway's first RPUSHX: those
# records reach them only through a HEAD (they then FETCH). With the first HEAD a
# head_interval (1 s) after, a fresh gateway's first DUMP took 1 s; now 60-160 ms
# (docs/dafka-engine.md).
_FIRST_HEAD_MS = 50
_PACK_SEQ = struct.Struct(">Q").pack
# How long the PUB may keep the last HEADs after close: long enough to reach the wire,
# short enough not to hold up a context termination.
_LAST_HEAD_LINGER_MS = 200
_MAX_DIRECT_PREFIXES = 10_000  # per partition: requesters' DIRECT_RECORD prefixes kept

# Commands on the user → actor pipe.
_WAKE = b"P"
_TERM = b"T"


def check_topic(topic: str) -> bytes:
    """The topic as routing bytes; refuses what the wire cannot carry (spec §1.2)."""
    raw = topic.encode()
    if not raw or b"\0" in raw or len(raw) > 255:
        raise ValueError(f"invalid Dafka topic {topic!r}: need 1..255 bytes without NUL")
    return raw


def check_address(address: str) -> str:
    """A partition address: 32 upper-case hex digits (what our uuids are)."""
    if len(address) != 32 or not all(c in "0123456789ABCDEF" for c in address):
        raise ValueError(f"a partition address is 32 upper-case hex digits: {address!r}")
    return address


class Partition:
    """One partition a `Publisher` writes. Sequences start at `first_sequence`."""

    def __init__(
        self,
        owner: Publisher,
        topic: str,
        address: str,
        first_sequence: int,
        on_ack: Callable[[int], None] | None,
        on_conflict: Callable[[int], None] | None = None,
    ) -> None:
        self._topic_bytes = check_topic(topic)
        if first_sequence < 0:
            raise ValueError(f"first_sequence must be >= 0, not {first_sequence}")
        self.topic = topic
        self.address = check_address(address)
        self.first_sequence = first_sequence
        self.owner = owner  # the publisher this partition is one of
        self._on_ack = on_ack
        self._on_conflict = on_conflict
        # Shared with the actor under the owner's lock.
        self._queue: collections.deque[bytes] = collections.deque()
        self._flagged = False  # in the owner's list of partitions with records to send
        self._submitted = 0  # records handed to publish()
        # Written by the actor only.
        self._released = 0  # records acked
        self._sent = 0  # records sent on the wire
        self._unacked = UnackedList(first_sequence)
        self._hold_until = 0  # ms: no RECORD before (subscribe_settle)
        self._record_prefix = b""
        self._head_prefix = b""
        self._direct_prefixes: dict[str, bytes] = {}

    # -- user side ----------------------------------------------------------------------

    def publish(self, content: bytes | bytearray | memoryview) -> int:
        """Queue one record; never blocks on the network. Returns its sequence."""
        if type(content) is not bytes:
            if not isinstance(content, (bytes, bytearray, memoryview)):
                raise TypeError(f"record content must be bytes, not {type(content).__name__}")
            content = bytes(content)
        return self.publish_many((content,))

    def publish_many(self, contents: Sequence[bytes]) -> int:
        """Queue `contents` in order with one hand-over to the actor (one lock, at most
        one wake-up); returns the first one's sequence."""
        owner = self.owner
        with owner._lock:
            owner._check_open()
            first = self._queue_under_lock(contents)
            owner._wake_once()
        return first

    def _queue_under_lock(self, contents: Sequence[bytes]) -> int:
        """Under the owner's lock: queue `contents`, flag; the first one's sequence."""
        self._queue.extend(contents)
        first = self.first_sequence + self._submitted
        self._submitted += len(contents)
        if not self._flagged:
            self._flagged = True
            self.owner._flagged.append(self)
        return first

    def sent_count(self) -> int:
        """Records the actor has published on the wire (publish() only queues them)."""
        return self._sent

    def unacked_count(self) -> int:
        """Records published on this partition that no store has acknowledged yet."""
        return self._submitted - self._released

    # -- actor side ---------------------------------------------------------------------

    def _prefix(self, msg_id: int, routing: str) -> bytes:
        """Frame 1 of a (DIRECT_)RECORD of this partition minus its 8 sequence bytes.

        Built once with the codec, so the bytes stay exactly the codec's; per record only
        the packed sequence is appended.
        """
        encoder = proto.RecordEncoder(routing, self.address, self.topic, msg_id)
        return encoder.frame1(0)[:-8]

    def _send_queued(self, send: SendRecords, budget: int) -> int:
        """Send up to `budget` queued records as RECORDs through `send`; returns how many
        were sent."""
        queue = self._queue
        popleft = queue.popleft
        # Taken one by one: the loop's thread appends meanwhile (a deque's popleft and
        # append are atomic; a copy then clear() would lose what came in between).
        # Kept as unacked all at once, not with a push() each (0.1 us a record).
        taken = [popleft() for _ in range(min(budget, len(queue)))]
        send(self._record_prefix, self._unacked.extend(taken), taken)
        self._sent += len(taken)
        self._released = self._sent - len(self._unacked)
        return len(taken)

    def _ack(self, sequence: int) -> bool:
        """Release what `sequence` acknowledges; False (and nothing released) for an ACK
        beyond every record sent: the stores hold this partition's offsets that another
        writer wrote (two writers of one address, or one that started below the stores'
        head), and a store drops a record at an offset it holds, so an ACK no longer
        says that ours is stored."""
        if sequence >= self.first_sequence + self._sent:
            return False
        self._unacked.ack(sequence)
        self._released = self._sent - len(self._unacked)
        return True

    def _fetch(self, pub: zmq.Socket, msg: proto.Message) -> None:
        """Answer a FETCH from memory (below the first unacked record the stores must
        answer, spec §3)."""
        unacked = self._unacked
        if msg.sequence < unacked.first_sequence:
            return
        prefix = self._direct_prefixes.get(msg.address)
        if prefix is None:
            if len(self._direct_prefixes) > _MAX_DIRECT_PREFIXES:
                self._direct_prefixes.clear()
            try:
                prefix = self._prefix(proto.DIRECT_RECORD, msg.address)
            except proto.MalformedMessage:
                return  # an address we cannot route to (e.g. with a NUL): drop
            self._direct_prefixes[msg.address] = prefix
        for seq, content in unacked.records(msg.sequence, msg.count):
            pub.send(prefix + _PACK_SEQ(seq), zmq.SNDMORE)
            pub.send(content)

    def _head(self, pub: zmq.Socket) -> None:
        """HEAD with the last sequence published (spec §3); its bytes but the sequence
        built once with the codec, as a RECORD's (a gateway HEADs every partition it
        wrote to, each `producer/head_interval`)."""
        prefix = self._head_prefix
        if not prefix:
            head = proto.Message(
                proto.HEAD, self._topic_bytes, address=self.address, subject=self.topic
            )
            prefix = self._head_prefix = proto.encode(head)[0][:-8]
        pub.send(prefix + _PACK_SEQ(self._unacked.next_sequence - 1))


class Publisher(Actor):
    """Publishes records on the partitions `open()` gives it, all through one PUB."""

    kind = "publisher"

    def __init__(
        self,
        config: Config,
        context: zmq.Context | None = None,
        *,
        address: str | None = None,
        ignore_peers: Callable[[str], bool] | None = None,
        on_stopped: Callable[[], None] | None = None,
    ) -> None:
        """`address`: the uuid the beacon announces (a new one by default).
        `ignore_peers(address)` True: a peer this actor does not connect to, one known to
        send no ACK or FETCH (e.g. other gateways' publishers). `on_stopped()` runs on
        the actor's thread once its loop ended (closed, or dead of an error)."""
        if address is not None:
            check_address(address)
        self._ignore_peers = ignore_peers
        self._on_stopped = on_stopped
        self._terminate_unacked = config.get_int("producer/terminate_unacked", 0) == 1
        self._head_interval = max(1, config.get_int("producer/head_interval", 1000))
        self._hwm = config.get_int("producer/high_watermark", 1_000_000)
        self._settle = max(0, config.get_int("producer/subscribe_settle"))
        close_timeout = config.get_int("producer/close_timeout")
        self._close_timeout = math.inf if close_timeout < 0 else close_timeout / 1000

        # Shared with the actor; `_lock` guards these and the user pipe end.
        lock = threading.Lock()
        self._partitions: dict[bytes, Partition] = {}  # address bytes -> partition
        self._added: list[Partition] = []  # opened, not yet subscribed by the actor
        self._flagged: list[Partition] = []  # with records queued since the last pass
        self._wake_pending = False
        self._failed = False  # the actor died of an unexpected error
        self._term_deadline = math.inf  # monotonic seconds; set by close() before _TERM
        self._left = 0
        super().__init__(config, context, lock, address=address)

    # -- user side ----------------------------------------------------------------------

    def open(
        self,
        topic: str,
        *,
        address: str,
        first_sequence: int = 0,
        on_ack: Callable[[int], None] | None = None,
        on_conflict: Callable[[int], None] | None = None,
    ) -> Partition:
        """A new partition `address` of `topic` written from `first_sequence` on.
        `on_ack(last_acked)` runs on the actor thread whenever an ACK releases records;
        `on_conflict(sequence)` for an ACK beyond every record sent (see `Partition._ack`)."""
        key = address.encode()
        with self._lock:
            self._check_open()
            if key in self._partitions:
                raise ValueError(f"partition {address} is already open on this publisher")
            partition = Partition(self, topic, address, first_sequence, on_ack, on_conflict)
            self._partitions[key] = partition
            self._added.append(partition)
            self._wake_once()
        return partition

    @property
    def failed(self) -> bool:
        """The actor stopped on an error: its partitions refuse records."""
        return self._failed

    @property
    def usable(self) -> bool:
        """Neither closed nor failed: `open()` and its partitions take records."""
        return not (self._closed or self._failed)

    def publish_batch(self, batch: Iterable[tuple[Partition, Sequence[bytes]]]) -> list[int]:
        """Queue the records of many partitions of this publisher with one hand-over
        (one lock, at most one wake-up of the actor): each partition's `contents` in
        order, as `publish_many()` would; returns each one's first sequence, in order.
        Raises RuntimeError, queueing none of them, when the actor is closed or dead;
        ValueError for another publisher's partition."""
        with self._lock:
            self._check_open()
            batch = list(batch)
            for partition, _ in batch:
                if partition.owner is not self:
                    raise ValueError(f"partition {partition.address} is not this publisher's")
            firsts = [partition._queue_under_lock(contents) for partition, contents in batch]
            self._wake_once()
        return firsts

    def partition_count(self) -> int:
        return len(self._partitions)

    def unacked_count(self) -> int:
        """Records of all partitions no store has acknowledged yet."""
        with self._lock:
            partitions = list(self._partitions.values())
        return sum(partition.unacked_count() for partition in partitions)

    def close(self, timeout: float | None = None) -> int:
        """Stop, after waiting up to `timeout` seconds for ACKs; returns records left
        unacked, all partitions together.

        `timeout=None` follows the config: with `producer/terminate_unacked` = 1 stop at
        once, else wait until every record is acknowledged, at most
        `producer/close_timeout` ms (C waits forever), and log an error if some were not.
        """
        with self._lock:
            if self._closed:
                return self._left
            self._closed = True
            if timeout is None:
                wait = 0.0 if self._terminate_unacked else self._close_timeout
            else:
                wait = max(0.0, timeout)
            self._term_deadline = time.monotonic() + wait
            self._wake(_TERM)
        self._join()
        if self._left and timeout is None and not self._terminate_unacked:
            log.error(
                "dafka producer closed with records no store acknowledged",
                producer=self.address,
                topics=sorted({p.topic for p in self._partitions.values()})[:10],
                unacked=self._left,
                waited_s=self._close_timeout,
                hint="is a store running and connected to this producer's tower? "
                "(the wait is producer/close_timeout)",
            )
        return self._left

    def _check_open(self) -> None:
        """Under `_lock`: refuse work once closed or dead."""
        if self._closed or self._failed:
            raise RuntimeError("Dafka producer is closed")

    def _wake_once(self) -> None:
        """Under `_lock`: wake the actor unless a wake-up is pending already."""
        if not self._wake_pending:
            self._wake_pending = True
            self._wake(_WAKE)

    # -- actor --------------------------------------------------------------------------

    def _open(self, socket: SocketFactory) -> int:
        self._pub = pub = socket(zmq.PUB)
        self._sub = sub = socket(zmq.SUB)
        pub.sndhwm = self._hwm
        sub.rcvhwm = self._hwm
        # What the SUB sends is its subscriptions, two per partition, and a SUB drops
        # those that do not fit under its send high-water mark (1,000 by default): opening
        # 500 partitions at once lost ACKs and FETCHes for good. Unbounded: at most two
        # messages per partition open.
        sub.sndhwm = 0
        return bind_data_socket(pub, self._config, sub)

    def _stopped(self, error: BaseException | None) -> None:
        if error is not None:
            # A bug, not bad input (that is dropped where it is read): logged loud by the
            # actor; publish() now refuses instead of queueing records nobody will send.
            self._failed = True
        self._left = self.unacked_count()
        if self._on_stopped is not None:
            self._on_stopped()

    def _take(self) -> tuple[list[Partition], list[Partition]]:
        """The partitions opened and the partitions flagged since the last call."""
        with self._lock:
            added, self._added = self._added, []
            flagged, self._flagged = self._flagged, []
            for partition in flagged:
                partition._flagged = False
            # Reset before draining: a publish after this point sends a new wake-up, one
            # before it has its records in a deque already.
            self._wake_pending = False
        return added, flagged

    def _serve(self, pipe: zmq.Socket, beacon: Beacon) -> None:
        pub, sub = self._pub, self._sub
        by_address: dict[bytes, Partition] = {}  # the actor's view: subscribed partitions
        ready: dict[Partition, None] = {}  # partitions with records queued, in order
        held: dict[Partition, None] = {}  # ready but within their subscribe_settle
        published: dict[Partition, None] = {}  # sent anything: they HEAD
        next_head = math.inf  # ms; the HEAD timer starts with the first record
        head_gaps = DoublingGap(_FIRST_HEAD_MS, self._head_interval)
        hold_deadline = math.inf  # ms: the earliest hold_until in `held`
        terminating = False

        send_held = records_sender(pub, hold_gil=True)
        send_free = records_sender(pub, hold_gil=False)
        poller = zmq.Poller()
        poller.register(pipe, zmq.POLLIN)
        poller.register(sub, zmq.POLLIN)
        poller.register(beacon.socket, zmq.POLLIN)

        while True:
            now = now_ms()
            wait = min(next_head, beacon.next_deadline_ms(), hold_deadline) - now
            if ready:
                wait = 0
            if terminating:
                # Wake up for the close() deadline even when nothing else happens.
                wait = min(wait, max(0, (self._term_deadline - time.monotonic()) * 1000))
            events = dict(poller.poll(int(max(0, min(wait, 1000)))))

            if pipe in events:
                # One command per poll: at most one wake-up is pending (`_wake_once`), and
                # reading on to zmq.Again cost an exception, 3-5 µs, per wake-up (one per
                # few unpipelined RPUSHX). A TERM behind it makes the next poll return.
                with contextlib.suppress(zmq.Again):
                    if pipe.recv(zmq.NOBLOCK) == _TERM:
                        terminating = True
                added, flagged = self._take()
                now = now_ms()
                for partition in added:
                    key = partition.address.encode()
                    sub.setsockopt(zmq.SUBSCRIBE, proto.subscription(proto.ACK, key))
                    sub.setsockopt(zmq.SUBSCRIBE, proto.subscription(proto.FETCH, key))
                    partition._record_prefix = partition._prefix(proto.RECORD, partition.topic)
                    partition._hold_until = now + self._settle if self._settle else 0
                    by_address[key] = partition
                for partition in flagged:
                    if partition._hold_until:
                        held[partition] = None
                        hold_deadline = min(hold_deadline, partition._hold_until)
                    else:
                        ready[partition] = None

            if beacon.socket in events:
                apply_events(beacon.handle(), sub)

            if sub in events:
                self._handle_sub(sub, pub, by_address)

            if held:
                now = now_ms()
                giving_up = terminating and time.monotonic() >= self._term_deadline
                if now >= hold_deadline or giving_up:
                    hold_deadline = math.inf
                    for partition in list(held):
                        if giving_up or now >= partition._hold_until:
                            partition._hold_until = 0  # for good: only the first records wait
                            del held[partition]
                            ready[partition] = None
                        else:
                            hold_deadline = min(hold_deadline, partition._hold_until)

            if ready:
                budget = _BATCH
                # A few records in all: sent holding the GIL (`held_send`). Many: sent
                # giving it up, which lets the event loop run meanwhile (counted per
                # partition, a pipeline over 100 topics held the GIL for 1,000 records,
                # 10 a partition).
                queued = sum(len(partition._queue) for partition in ready)
                send = send_held if queued <= _HOLD_GIL_UP_TO else send_free
                for partition in list(ready):
                    if partition._hold_until:  # flagged again while it was held
                        del ready[partition]
                        held[partition] = None
                        hold_deadline = min(hold_deadline, partition._hold_until)
                        continue
                    sent = partition._send_queued(send, budget)
                    if sent and partition not in published:
                        published[partition] = None
                        if next_head == math.inf:
                            next_head = now_ms() + head_gaps.gap
                    budget -= sent
                    if budget <= 0:
                        break  # the rest (and this one, if not empty) on the next pass
                    del ready[partition]

            now = now_ms()
            if now >= next_head:
                for partition in published:
                    partition._head(pub)
                next_head = now + head_gaps.double()
            apply_events(beacon.tick(now), sub)

            if terminating and not ready and not held:
                left = sum(len(p._unacked) for p in by_address.values())
                if left == 0 or time.monotonic() >= self._term_deadline:
                    self._last_heads(pub, by_address.values())
                    return

    def _last_heads(self, pub: zmq.Socket, partitions: Iterable[Partition]) -> None:
        """A consumer that missed every RECORD and HEAD of a short-lived partition (its
        subscription arrived late) learns from this one that the partition exists, and
        fetches it from the stores."""
        sent = False
        for partition in partitions:
            if partition._unacked.next_sequence:
                partition._head(pub)
                sent = True
        if sent:
            pub.linger = _LAST_HEAD_LINGER_MS

    def _handle_sub(
        self, sub: zmq.Socket, pub: zmq.Socket, by_address: dict[bytes, Partition]
    ) -> None:
        """Drain ACKs and FETCHes (addressed to our partitions by subscription); then tell
        each partition whose ACKs released records.

        ACKs are read in place (`proto.decode_ack`): with records spread over many
        partitions a store ACKs about every record on its own, and the codec's decode cost
        as much as sending the record. Anything else is decoded.

        ACK and FETCH are one frame each: a message is received frame by frame, as
        bytes (0.2 µs, where `recv_multipart` asks libzmq whether more frames follow
        after each, 1.6 µs). The frames of a malformed message of several are then judged
        one by one as messages: ZeroMQ delivers a message whole, so no other peer's
        frames come between, and a frame passes for an ACK only if it names one of our
        partitions, as a well-formed ACK would."""
        acked: dict[Partition, int] = {}
        recv = sub.recv
        for _ in range(_BATCH):
            try:
                frames = [recv(zmq.NOBLOCK)]
            except zmq.Again:
                break
            fast = proto.decode_ack(frames)
            if fast is not None:
                routing, subject, sequence = fast
                partition = by_address.get(routing)
                if partition is None or subject != partition._topic_bytes:
                    continue  # as after decode(): not ours, or another topic's
            else:
                try:
                    msg = proto.decode(frames)
                except proto.MalformedMessage:
                    continue  # dropped, as C drops them (spec §1.6)
                partition = by_address.get(msg.topic)
                if partition is None or msg.subject != partition.topic:
                    continue
                if msg.id == proto.FETCH:
                    partition._fetch(pub, msg)
                if msg.id != proto.ACK:
                    continue
                sequence = msg.sequence
            if partition not in acked:
                acked[partition] = partition._unacked.last_acked
            if not partition._ack(sequence) and partition._on_conflict is not None:
                partition._on_conflict(sequence)
        for partition, before in acked.items():
            last = partition._unacked.last_acked
            if partition._on_ack is not None and last != before:
                partition._on_ack(last)
