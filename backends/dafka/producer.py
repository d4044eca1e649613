"""The producer actor (spec §3): owns one partition of one topic.

The partition name is the producer's uuid. Records are numbered from 0, sent as RECORD on a
bound PUB, kept in memory (UnackedList) until any store ACKs them, and re-sent from memory as
DIRECT_RECORD when someone FETCHes them. Once something was published, a HEAD carrying the
last sequence goes out every `producer/head_interval` ms.

Beyond C (issue 7):
- the first records wait `producer/subscribe_settle` ms after the producer started. A C
  store ACKs a record only once, when it stores it; if that ACK leaves before our SUB's
  subscription `K<uuid>` has reached the store's PUB (ZeroMQ's slow joiner: discovery
  connects both ways at the same moment), it is lost and the producer waits forever.
  Holding the first records gives the beacon round trip, the connect and the
  subscription time to land; later records are never held.
- a last HEAD on the way out, so a consumer that missed the records (and every HEAD) of a
  short-lived producer still learns the partition exists and fetches it from the stores;
- close() waits for ACKs at most `producer/close_timeout` ms and says so when it gives up.

Threading: `publish()` may be called from any thread. It appends to a deque and wakes the
actor over its inproc PAIR (`node.Actor`) only when the actor is not already due to look at
the deque, so a burst of publishes costs one wake-up; the actor drains everything it finds
per wake-up. Every socket except the user end of that PAIR lives in the actor thread.
"""

from __future__ import annotations

import collections
import math
import struct
import threading
import time
import uuid
from collections.abc import Callable, Sequence

import structlog
import zmq

from backends.dafka import proto
from backends.dafka.beacon import Beacon, apply_events, bind_data_socket, now_ms
from backends.dafka.config import Config
from backends.dafka.node import Actor, SocketFactory, messages
from backends.dafka.unacked import UnackedList

log = structlog.get_logger(__name__)

# How many records the actor takes from the deque before it looks at its sockets again
# (C: up to 100,000 commands per wake-up), so ACKs and FETCHes are not starved.
_BATCH = 100_000
_PACK_SEQ = struct.Struct(">Q").pack
# How long the PUB may keep the last HEAD after close: long enough to reach the wire, short
# enough not to hold up a context termination.
_LAST_HEAD_LINGER_MS = 200

# Commands on the user → actor pipe.
_WAKE = b"P"
_TERM = b"T"


def check_topic(topic: str) -> bytes:
    """The topic as routing bytes; refuses what the wire cannot carry (spec §1.2)."""
    raw = topic.encode()
    if not raw or b"\0" in raw or len(raw) > 255:
        raise ValueError(f"invalid Dafka topic {topic!r}: need 1..255 bytes without NUL")
    return raw


class Producer(Actor):
    """Publishes records on one new partition (its uuid) of `topic`."""

    kind = "producer"

    def __init__(
        self,
        config: Config,
        topic: str,
        context: zmq.Context | None = None,
        *,
        address: str | None = None,
        first_sequence: int = 0,
        on_ack: Callable[[int], None] | None = None,
        ignore_peers: Callable[[str], bool] | None = None,
    ) -> None:
        """`address` and `first_sequence` let an owner resume a partition it wrote before
        (the gateway's stable partitions); by default a new partition starts at 0.
        `on_ack(last_acked)` runs on the actor thread whenever an ACK releases records.
        `ignore_peers(address)` True: a peer this producer does not connect to, one known
        to send no ACK or FETCH (the gateway's other partition writers: without it, N
        writers in one process hold N² connections)."""
        self._topic_bytes = check_topic(topic)
        self.topic = topic
        if first_sequence < 0:
            raise ValueError(f"first_sequence must be >= 0, not {first_sequence}")
        if address is None:
            address = uuid.uuid4().hex.upper()
        elif len(address) != 32 or not all(c in "0123456789ABCDEF" for c in address):
            raise ValueError(f"a partition address is 32 upper-case hex digits: {address!r}")
        self.first_sequence = first_sequence
        self._on_ack = on_ack
        self._ignore_peers = ignore_peers
        self._terminate_unacked = config.get_int("producer/terminate_unacked", 0) == 1
        self._head_interval = max(1, config.get_int("producer/head_interval", 1000))
        self._hwm = config.get_int("producer/high_watermark", 1_000_000)
        self._settle = max(0, config.get_int("producer/subscribe_settle"))
        close_timeout = config.get_int("producer/close_timeout")
        self._close_timeout = math.inf if close_timeout < 0 else close_timeout / 1000

        # Shared with the actor; `_lock` guards the deque hand-over and the user pipe end.
        lock = threading.Lock()
        self._queue: collections.deque[bytes] = collections.deque()
        self._wake_pending = False
        self._submitted = 0  # records handed to publish()
        self._released = 0  # records acked (written by the actor only)
        self._sent = 0  # records sent on the wire (written by the actor only)
        self._failed = False  # the actor died of an unexpected error
        self._term_deadline = math.inf  # monotonic seconds; set by close() before _TERM
        self._left = 0
        super().__init__(config, context, lock, address=address)

    def _thread_name(self) -> str:
        return f"dafka-producer-{self.topic}"

    # -- user side ----------------------------------------------------------------------

    def publish(self, content: bytes | bytearray | memoryview) -> int:
        """Queue one record; never blocks on the network. Returns its sequence."""
        if type(content) is not bytes:
            if not isinstance(content, (bytes, bytearray, memoryview)):
                raise TypeError(f"record content must be bytes, not {type(content).__name__}")
            content = bytes(content)
        with self._lock:
            if self._closed or self._failed:
                raise RuntimeError("Dafka producer is closed")
            self._queue.append(content)
            sequence = self.first_sequence + self._submitted
            self._submitted += 1
            if not self._wake_pending:
                self._wake_pending = True
                self._wake(_WAKE)
        return sequence

    def publish_many(self, contents: Sequence[bytes]) -> int:
        """Queue `contents` in order with one hand-over to the actor (one lock, at most
        one wake-up); returns the first one's sequence."""
        with self._lock:
            if self._closed or self._failed:
                raise RuntimeError("Dafka producer is closed")
            self._queue.extend(contents)
            first = self.first_sequence + self._submitted
            self._submitted += len(contents)
            if not self._wake_pending:
                self._wake_pending = True
                self._wake(_WAKE)
        return first

    def sent_count(self) -> int:
        """Records the actor has published on the wire (publish() only queues them)."""
        return self._sent

    def unacked_count(self) -> int:
        """Records published through this producer that no store has acknowledged yet."""
        return self._submitted - self._released

    def close(self, timeout: float | None = None) -> int:
        """Stop, after waiting up to `timeout` seconds for ACKs; returns records left unacked.

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
                topic=self.topic,
                unacked=self._left,
                waited_s=self._close_timeout,
                hint="is a store running and connected to this producer's tower? "
                "(the wait is producer/close_timeout)",
            )
        return self._left

    # -- actor --------------------------------------------------------------------------

    def _open(self, socket: SocketFactory) -> int:
        self._pub = pub = socket(zmq.PUB)
        self._sub = sub = socket(zmq.SUB)
        pub.sndhwm = self._hwm
        sub.rcvhwm = self._hwm
        port = bind_data_socket(pub, self._config, sub)
        sub.setsockopt(zmq.SUBSCRIBE, proto.subscription(proto.ACK, self.address))
        sub.setsockopt(zmq.SUBSCRIBE, proto.subscription(proto.FETCH, self.address))
        return port

    def _serve(self, pipe: zmq.Socket, beacon: Beacon) -> None:
        self._loop(pipe, self._pub, self._sub, beacon)

    def _stopped(self, error: BaseException | None) -> None:
        if error is not None:
            # A bug, not bad input (that is dropped where it is read): logged loud by the
            # actor; publish() now refuses instead of queueing records nobody will send.
            self._failed = True
            self._left = self.unacked_count()

    def _loop(self, pipe: zmq.Socket, pub: zmq.Socket, sub: zmq.Socket, beacon: Beacon) -> None:
        unacked = UnackedList(self.first_sequence)
        first = self.first_sequence
        record_prefix = self._prefix(proto.RECORD, self.topic)
        direct_prefixes: dict[str, bytes] = {}
        topic = self.topic
        queue = self._queue
        send = pub.send
        more = zmq.SNDMORE
        pack = _PACK_SEQ
        next_seq = first  # what unacked.push() will return next
        next_head = math.inf  # ms; the HEAD timer starts with the first record
        terminating = False
        hold_until = now_ms() + self._settle  # no RECORD before (see the module docstring)

        poller = zmq.Poller()
        poller.register(pipe, zmq.POLLIN)
        poller.register(sub, zmq.POLLIN)
        poller.register(beacon.socket, zmq.POLLIN)

        while True:
            now = now_ms()
            wait = min(next_head, beacon.next_deadline_ms()) - now
            if queue:
                wait = 0 if now >= hold_until else min(wait, hold_until - now)
            if terminating:
                # Wake up for the close() deadline even when nothing else happens.
                wait = min(wait, max(0, (self._term_deadline - time.monotonic()) * 1000))
            events = dict(poller.poll(int(max(0, min(wait, 1000)))))

            if pipe in events:
                while True:
                    try:
                        command = pipe.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if command == _TERM:
                        terminating = True
                # Reset before draining: a publish after this point sends a new wake-up,
                # one before it has its record in the deque already.
                with self._lock:
                    self._wake_pending = False

            if beacon.socket in events:
                apply_events(beacon.handle(), sub)

            if sub in events:
                acked = unacked.last_acked
                self._handle_sub(sub, pub, unacked, direct_prefixes, topic)
                self._released = next_seq - first - len(unacked)
                if self._on_ack is not None and unacked.last_acked != acked:
                    self._on_ack(unacked.last_acked)

            if hold_until and (
                now_ms() >= hold_until or (terminating and time.monotonic() >= self._term_deadline)
            ):
                hold_until = 0  # for good: only the first records wait
            if queue and not hold_until:
                taken = 0
                popleft = queue.popleft
                push = unacked.push
                while taken < _BATCH:
                    try:
                        content = popleft()
                    except IndexError:
                        break
                    seq = push(content)
                    send(record_prefix + pack(seq), more)
                    send(content)
                    taken += 1
                if taken and next_seq == first:
                    next_head = now_ms() + self._head_interval
                next_seq += taken
                self._sent = next_seq - first
                self._released = next_seq - first - len(unacked)

            now = now_ms()
            if now >= next_head:
                self._head(pub, next_seq - 1)
                next_head = now + self._head_interval
            apply_events(beacon.tick(now), sub)

            if terminating and not queue:
                left = len(unacked)
                if left == 0 or time.monotonic() >= self._term_deadline:
                    self._left = left
                    if next_seq:
                        # A consumer that missed every RECORD and HEAD of a short-lived
                        # producer (its subscription arrived late) learns from this one
                        # that the partition exists, and fetches it from the stores.
                        self._head(pub, next_seq - 1)
                        pub.linger = _LAST_HEAD_LINGER_MS
                    return

    def _head(self, pub: zmq.Socket, sequence: int) -> None:
        head = proto.Message(
            proto.HEAD,
            self._topic_bytes,
            address=self.address,
            subject=self.topic,
            sequence=sequence,
        )
        pub.send_multipart(proto.encode(head))

    def _handle_sub(
        self,
        sub: zmq.Socket,
        pub: zmq.Socket,
        unacked: UnackedList,
        direct_prefixes: dict[str, bytes],
        topic: str,
    ) -> None:
        """Drain ACKs and FETCHes (both addressed to this partition by subscription)."""
        for msg in messages(sub):
            if msg.subject != topic:
                continue
            if msg.id == proto.ACK:
                unacked.ack(msg.sequence)
            elif msg.id == proto.FETCH:
                # Below the first unacked record the stores must answer (spec §3).
                if msg.sequence < unacked.first_sequence:
                    continue
                prefix = direct_prefixes.get(msg.address)
                if prefix is None:
                    if len(direct_prefixes) > 10_000:
                        direct_prefixes.clear()
                    try:
                        prefix = self._prefix(proto.DIRECT_RECORD, msg.address)
                    except proto.MalformedMessage:
                        continue  # an address we cannot route to (e.g. with a NUL): drop
                    direct_prefixes[msg.address] = prefix
                for seq, content in unacked.records(msg.sequence, msg.count):
                    pub.send(prefix + _PACK_SEQ(seq), zmq.SNDMORE)
                    pub.send(content)

    def _prefix(self, msg_id: int, routing: str) -> bytes:
        """Frame 1 of a (DIRECT_)RECORD of this partition minus its 8 sequence bytes.

        Built once with the codec, so the bytes stay exactly the codec's; per record only
        the packed sequence is appended.
        """
        encoder = proto.RecordEncoder(routing, self.address, self.topic, msg_id)
        return encoder.frame1(0)[:-8]
