"""The consumer actor (spec §4), with the fixes of spec §10.

Per partition (topic, producer uuid) records are delivered in strictly increasing, gap-free
order, each at most once per consumer lifetime. On top of C's behaviour:

- exact topics (§10.11): SUB prefixes are `M<topic>\\0` / `H<topic>\\0` and the subject of
  every message is checked against the subscriptions;
- signed "nothing delivered" (-1), so every HEAD ahead of the offset asks for the gap
  (§10.10); STORE_HELLO never creates partition state (§10.13);
- a FETCH retry timer while a gap stays open (`consumer/fetch_retry_interval` ms), so a lost
  FETCH never stalls a partition; records arriving during a gap are buffered (at most
  `consumer/gap_buffer` per partition) and delivered once the gap closes (§10.14);
- `seek()` to start a partition at a given sequence, and the retention-tail rule: in
  earliest mode a FETCH answer starting above 0 on a fresh partition means the stores no
  longer keep anything older, so the partition starts there;
- in earliest mode, GET_HEADS again after subscribing (`heads_schedule.py`, every
  `consumer/heads_interval` ms at most): C asks only once, and misses partitions whose
  producer it never heard (issue 7).

Threading: every socket lives in the actor thread (`node.Node`). User calls travel as
commands over its inproc PAIR (a wake-up byte) plus a deque, and wait for the actor's answer.
"""

from __future__ import annotations

import collections
import queue
import struct
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import structlog
import zmq

from backends.dafka import proto
from backends.dafka.beacon import Beacon, apply_events, new_subscribers, now_ms
from backends.dafka.config import Config
from backends.dafka.fetch_filter import BUCKET, FetchFilter
from backends.dafka.heads_schedule import HeadsSchedule
from backends.dafka.node import Node
from backends.dafka.producer import check_topic

log = structlog.get_logger(__name__)

_BATCH = 100_000  # messages per wake-up before timers and commands get a turn (as in C)
_UNPACK_SEQ = struct.Struct(">Q").unpack_from
_DIRECT_ID = proto.DIRECT_RECORD
_CALL_POLL = 0.5  # seconds between "is the actor still alive" checks of a waiting call
# The first GET_HEADS after the one at subscribe: soon, because a partition is most often
# missed right after subscribing (its producer started at about the same time).


@dataclass(frozen=True, slots=True)
class DafkaRecord:
    """One delivered record."""

    subject: str  # topic
    partition: str  # producer uuid
    sequence: int
    content: bytes


class _Partition:
    """Delivery state of one (subject, producer uuid)."""

    __slots__ = (
        "address",
        "fresh",
        "gapped",
        "head",
        "last",
        "pending",
        "retry_at",
        "retry_last",
        "subject",
    )

    def __init__(self, subject: str, address: str, last: int, fresh: bool) -> None:
        self.subject = subject
        self.address = address
        self.last = last  # last delivered sequence; -1 = start at 0
        # Earliest mode, nothing delivered and no seek: the retention-tail rule applies.
        self.fresh = fresh
        self.head = last  # highest sequence known to exist
        self.pending: dict[int, bytes] = {}  # records that arrived during a gap
        self.gapped = False  # in the retry set
        self.retry_at = 0
        self.retry_last = last


def _exact(msg_id: int, topic: str) -> bytes:
    """A SUB prefix that matches `topic` exactly: the NUL after the topic is in frame 1."""
    return proto.subscription(msg_id, topic) + b"\0"


class Consumer(Node):
    """Subscribes to topics and delivers their records, per partition in order."""

    kind = "consumer"

    def __init__(
        self,
        config: Config,
        context: zmq.Context | None = None,
        sink: Callable[[DafkaRecord], Any] | None = None,
    ) -> None:
        self._sink = sink
        self._records: queue.SimpleQueue[DafkaRecord | None] = queue.SimpleQueue()
        self._earliest = config.get("consumer/offset/reset", "latest") != "latest"
        self._hwm = config.get_int("consumer/high_watermark", 1_000_000)
        self._retry_interval = max(10, config.get_int("consumer/fetch_retry_interval", 500))
        self._gap_buffer = max(0, config.get_int("consumer/gap_buffer", 100_000))
        self._heads_interval = max(0, config.get_int("consumer/heads_interval"))

        self._commands: collections.deque[tuple[str, tuple[Any, ...], Future[Any]]] = (
            collections.deque()
        )
        self._actor: _Actor | None = None  # set by the actor thread as its loop starts
        super().__init__(config, context)

    # -- user side ----------------------------------------------------------------------

    def subscribe(self, topic: str) -> None:
        check_topic(topic)
        self._call("subscribe", topic)

    def unsubscribe(self, topic: str) -> None:
        self._call("unsubscribe", topic)

    def subscriptions(self) -> list[str]:
        result: list[str] = self._call("subscriptions")
        return result

    def seek(self, topic: str, partition: str, next_sequence: int) -> None:
        """Deliver partition `partition` of `topic` from `next_sequence` on (nothing before).

        Applies at once to a known partition (and FETCHes from there), else when the
        partition is first seen.
        """
        if next_sequence < 0:
            raise ValueError(f"next_sequence must be >= 0, not {next_sequence}")
        self._call("seek", topic, partition, next_sequence)

    def get(self, timeout: float | None = None) -> DafkaRecord | None:
        """The next record, or None after `timeout` seconds (or once the consumer stopped)."""
        if self._sink is not None:
            raise RuntimeError("this consumer hands its records to a sink")
        if not self._thread.is_alive():
            try:
                return self._records.get_nowait()
            except queue.Empty:
                return None
        try:
            return self._records.get(timeout=timeout)
        except queue.Empty:
            return None

    def _call(self, name: str, *args: Any) -> Any:
        actor = self._actor
        if actor is not None and threading.get_ident() == self._thread.ident:
            # Called from the sink, i.e. on the actor thread: waiting would deadlock.
            return getattr(actor, "_cmd_" + name)(*args)
        future: Future[Any] = Future()
        with self._lock:
            if self._closed or not self._thread.is_alive():
                raise RuntimeError("Dafka consumer is closed")
            self._commands.append((name, args, future))
            self._wake(b"C")  # a dead actor: the wait below notices it is gone
        while True:
            try:
                return future.result(timeout=_CALL_POLL)
            except TimeoutError:
                if not self._thread.is_alive():
                    raise RuntimeError("Dafka consumer stopped") from self._error

    # -- actor (on its thread) ----------------------------------------------------------

    def _subscriptions(self) -> list[bytes]:
        ids = (proto.DIRECT_RECORD, proto.DIRECT_HEAD, proto.STORE_HELLO)
        return [proto.subscription(msg_id, self.address) for msg_id in ids]

    def _loop(self, pipe: zmq.Socket, sub: zmq.Socket, xpub: zmq.Socket, beacon: Beacon) -> None:
        actor = self._actor = _Actor(self, sub, xpub)
        actor.loop(pipe, beacon)

    def _stopped(self, error: BaseException | None) -> None:
        for _name, _args, future in self._commands:
            future.set_exception(RuntimeError("Dafka consumer stopped"))
        self._commands.clear()
        self._records.put(None)  # wakes a get() waiting forever


class _Actor:
    """The consumer thread's state and message handling."""

    def __init__(self, owner: Consumer, sub: zmq.Socket, xpub: zmq.Socket) -> None:
        self.owner = owner
        self.sub = sub
        self.xpub = xpub
        self.uuid = owner.address
        self.earliest = owner._earliest
        self.retry_interval = owner._retry_interval
        self.gap_buffer = owner._gap_buffer
        sink = owner._sink
        self.emit: Callable[[DafkaRecord], Any] = sink if sink is not None else owner._records.put
        self.subjects: dict[str, None] = {}  # ordered set of subscribed topics
        self.parts: dict[tuple[str, str], _Partition] = {}
        # Frame 1 minus its 8 sequence bytes → partition: the hot path of a known
        # partition's (DIRECT_)RECORD is one slice and one dict lookup.
        self.fast: dict[bytes, _Partition] = {}
        self.seeks: dict[tuple[str, str], int] = {}
        self.gapped: set[_Partition] = set()
        self.filter = FetchFilter()
        self.heads_interval = owner._heads_interval if self.earliest else 0
        # topic -> (when to send GET_HEADS next, the delay that led there), now_ms clock
        self.heads = HeadsSchedule(self.heads_interval)

    # -- loop ---------------------------------------------------------------------------

    def loop(self, pipe: zmq.Socket, beacon: Beacon) -> None:
        sub, xpub = self.sub, self.xpub
        poller = zmq.Poller()
        poller.register(pipe, zmq.POLLIN)
        poller.register(sub, zmq.POLLIN)
        poller.register(xpub, zmq.POLLIN)
        poller.register(beacon.socket, zmq.POLLIN)
        busy = False
        while True:
            now = now_ms()
            deadline = beacon.next_deadline_ms()
            if self.gapped:
                deadline = min(deadline, now + max(1, self.retry_interval // 2))
            deadline = min(deadline, self.heads.next_due)
            wait = 0 if busy else max(0, min(deadline - now, 1000))
            events = dict(poller.poll(wait))
            if pipe in events and self._commands(pipe):
                return
            if beacon.socket in events:
                apply_events(beacon.handle(), sub)
            if xpub in events:
                self._drain_xpub()
            busy = sub in events and self._drain_sub()
            now = now_ms()
            if self.gapped:
                self._retry(now)
            for topic in self.heads.due(now):
                self._get_heads(topic)
            apply_events(beacon.tick(now), sub)

    def _commands(self, pipe: zmq.Socket) -> bool:
        """Run queued user commands; True when asked to stop."""
        stop = False
        while True:
            try:
                if pipe.recv(zmq.NOBLOCK) == b"T":
                    stop = True
            except zmq.Again:
                break
        commands = self.owner._commands
        while commands:
            name, args, future = commands.popleft()
            try:
                future.set_result(getattr(self, "_cmd_" + name)(*args))
            except Exception as error:
                future.set_exception(error)
        return stop

    # -- commands -----------------------------------------------------------------------

    def _cmd_subscribe(self, topic: str) -> None:
        if topic in self.subjects:
            return
        self.sub.setsockopt(zmq.SUBSCRIBE, _exact(proto.RECORD, topic))
        self.sub.setsockopt(zmq.SUBSCRIBE, _exact(proto.HEAD, topic))
        self.subjects[topic] = None
        if self.earliest:
            # Reaches the store readers connected now; later ones get the hello handshake.
            self._get_heads(topic)
            self.heads.add(topic, now_ms())

    def _cmd_unsubscribe(self, topic: str) -> None:
        if topic not in self.subjects:
            return
        self.sub.setsockopt(zmq.UNSUBSCRIBE, _exact(proto.RECORD, topic))
        self.sub.setsockopt(zmq.UNSUBSCRIBE, _exact(proto.HEAD, topic))
        del self.subjects[topic]
        self.heads.remove(topic)
        # Offsets stay (a later subscribe continues where this one stopped); buffers and
        # retries go.
        # In place: a sink may unsubscribe in the middle of _drain_sub's batch, which
        # holds a reference to this dict.
        for key in [k for k, p in self.fast.items() if p.subject == topic]:
            del self.fast[key]
        for part in self.parts.values():
            if part.subject == topic:
                part.pending.clear()
                part.gapped = False
                self.gapped.discard(part)

    def _cmd_subscriptions(self) -> list[str]:
        return list(self.subjects)

    def _cmd_seek(self, topic: str, partition: str, next_sequence: int) -> None:
        part = self.parts.get((topic, partition))
        if part is None:
            self.seeks[(topic, partition)] = next_sequence
            return
        part.last = next_sequence - 1
        part.fresh = False
        part.pending = {s: c for s, c in part.pending.items() if s >= next_sequence}
        self._flush_pending(part)
        part.head = max(part.head, part.last)
        if topic in self.subjects:
            self._fetch(part)

    # -- incoming -----------------------------------------------------------------------

    def _drain_sub(self) -> bool:
        """Handle up to _BATCH messages; True when more may be waiting.

        Speed matters here (one pass per record): frame 1 is received as a zmq.Frame,
        whose `more` flag is far cheaper than recv_multipart or getsockopt(RCVMORE). A
        message has at most 2 frames in Dafka; any extra frame is read as a message of its
        own and fails to decode, which a sender could have caused by sending it alone.
        """
        recv = self.sub.recv
        fast = self.fast
        emit = self.emit
        unpack = _UNPACK_SEQ
        noblock = zmq.NOBLOCK
        for _ in range(_BATCH):
            try:
                frame = recv(noblock, copy=False)
            except zmq.Again:
                return False
            frame1: bytes = frame.bytes
            if not frame.more:
                self._on_message([frame1])
                continue
            content: bytes = recv()  # the rest of a message is there once its start is
            part = fast.get(frame1[:-8])
            if part is not None:
                seq = unpack(frame1, len(frame1) - 8)[0]
                if seq == part.last + 1 and not part.pending:
                    part.last = seq
                    part.fresh = False
                    emit(DafkaRecord(part.subject, part.address, seq, content))
                else:
                    self._on_record(part, seq, content, frame1[0] == _DIRECT_ID)
                continue
            self._on_message([frame1, content])
        return True

    def _on_message(self, frames: list[bytes]) -> None:
        try:
            msg = proto.decode(frames)
        except proto.MalformedMessage:
            return  # C drops malformed messages too (spec §1.6)
        mid = msg.id
        if mid == proto.STORE_HELLO:
            self._hello(msg.address)
            return
        if msg.subject not in self.subjects:
            return  # another topic sharing our prefix, or a late one (exact topics, §10.11)
        if mid in (proto.RECORD, proto.DIRECT_RECORD):
            part = self._partition(msg.subject, msg.address, msg.sequence)
            if proto.encode(msg)[0] == frames[0]:  # canonical: safe for the fast path
                self.fast[frames[0][:-8]] = part
            self._on_record(part, msg.sequence, msg.content, mid == proto.DIRECT_RECORD)
        elif mid in (proto.HEAD, proto.DIRECT_HEAD):
            part = self._partition(msg.subject, msg.address, msg.sequence)
            if msg.sequence > part.head:
                part.head = msg.sequence
            if msg.sequence > part.last:
                self._fetch(part)
                self._watch(part)

    def _partition(self, subject: str, address: str, sequence: int) -> _Partition:
        key = (subject, address)
        part = self.parts.get(key)
        if part is None:
            start = self.seeks.pop(key, None)
            if start is not None:
                part = _Partition(subject, address, start - 1, fresh=False)
            elif self.earliest:
                part = _Partition(subject, address, -1, fresh=True)
            else:
                # Latest: the message that revealed the partition is the first delivered.
                part = _Partition(subject, address, sequence - 1, fresh=False)
            self.parts[key] = part
        return part

    def _on_record(self, part: _Partition, seq: int, content: bytes, direct: bool) -> None:
        expected = part.last + 1
        if seq < expected:
            return  # duplicate or late: at most once
        if seq > expected and direct and part.fresh:
            # Retention tail: the stores answered our FETCH from 0 with their oldest record.
            part.last = seq - 1
            part.pending = {s: c for s, c in part.pending.items() if s > seq}
            expected = seq
        if seq == expected:
            part.last = seq
            part.fresh = False
            self.emit(DafkaRecord(part.subject, part.address, seq, content))
            self._flush_pending(part)
            return
        if seq > part.head:
            part.head = seq
        if len(part.pending) < self.gap_buffer:
            part.pending[seq] = content
        self._fetch(part)
        self._watch(part)

    def _flush_pending(self, part: _Partition) -> None:
        pending = part.pending
        if not pending:
            return
        emit = self.emit
        nxt = part.last + 1
        while nxt in pending:
            emit(DafkaRecord(part.subject, part.address, nxt, pending.pop(nxt)))
            part.last = nxt
            part.fresh = False
            nxt += 1

    def _drain_xpub(self) -> None:
        # A store reader's SUB just subscribed to our hellos: it will hear this one.
        for reader in new_subscribers(self.xpub, proto.CONSUMER_HELLO):
            try:
                self._hello(reader.decode())
            except UnicodeDecodeError:
                continue

    # -- outgoing -----------------------------------------------------------------------

    def _send(self, msg: proto.Message) -> None:
        try:
            frames = proto.encode(msg)
        except proto.MalformedMessage:
            return  # e.g. a peer uuid we cannot echo back; never a reason to stop
        send = self.xpub.send
        for frame in frames[:-1]:
            send(frame, zmq.SNDMORE)
        send(frames[-1])

    def _hello(self, reader: str) -> None:
        subjects = list(self.subjects) if self.earliest else []
        self._send(
            proto.Message(
                proto.CONSUMER_HELLO, reader.encode(), address=self.uuid, subjects=subjects
            )
        )

    def _get_heads(self, topic: str) -> None:
        self._send(proto.Message(proto.GET_HEADS, topic.encode(), address=self.uuid))

    def _fetch(self, part: _Partition) -> None:
        seq = part.last + 1
        count = self.filter.should_fetch(part.subject, part.address, seq, now_ms())
        if count is not None:
            self._send(
                proto.Message(
                    proto.FETCH,
                    part.address.encode(),
                    address=self.uuid,
                    subject=part.subject,
                    sequence=seq,
                    count=count,
                )
            )

    def _watch(self, part: _Partition) -> None:
        """Put a partition with an open gap under the FETCH retry timer."""
        if not part.gapped:
            part.gapped = True
            part.retry_last = part.last
            part.retry_at = now_ms() + self.retry_interval
            self.gapped.add(part)

    def _retry(self, now: int) -> None:
        """Follow the open gaps: FETCH the next bucket as soon as the last one was answered
        in full, and FETCH again when a gap made no progress for a retry interval."""
        for part in list(self.gapped):
            if part.head <= part.last:
                part.gapped = False
                self.gapped.discard(part)
            elif part.last != part.retry_last:
                part.retry_last = part.last
                part.retry_at = now + self.retry_interval
                if (part.last + 1) % BUCKET == 0:
                    # A FETCH asks for the rest of a bucket: this one is complete.
                    self._fetch(part)
            elif now >= part.retry_at:
                self._fetch(part)
                part.retry_at = now + self.retry_interval
