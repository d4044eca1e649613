"""The store's reader actor (spec §5.4).

Answers FETCH with exactly the requested records q … q+count-1 (fixing the C off-by-one,
§10.12), or from the partition's oldest retained record when q is below it (retention
tail); answers GET_HEADS and CONSUMER_HELLO with one DIRECT_HEAD per partition of the exact
subject (§10.11); greets every consumer whose SUB connects with STORE_HELLO.

Beyond C: for `store/push_heads/duration` ms after a partition changed, every
`store/push_heads/interval` ms, the reader sends its DIRECT_HEAD to the earliest consumers
that asked for heads of its topic, so a C consumer (which asks only at subscribe) still
learns of a partition it missed (see `head_push.py`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import structlog
import zmq

from backends.dafka import proto
from backends.dafka.beacon import (
    Beacon,
    apply_events,
    bind_data_socket,
    now_ms,
    subscription_events,
)
from backends.dafka.held_send import records_sender
from backends.dafka.node import SocketFactory
from backends.dafka.proto import EVERY_SUBJECT
from backends.dafka.store.actor import StoreActor, StoreParts

log = structlog.get_logger(__name__)

_READER_CHUNK = 1_000  # requests handled before the reader looks at its other sockets
# Records of a FETCH answer read from the DB before they are sent, and their bytes.
_SEND_CHUNK = 1_000
_SEND_CHUNK_BYTES = 1 << 20


def batches(
    records: Iterable[tuple[int, bytes]],
    count: int = _SEND_CHUNK,
    size: int = _SEND_CHUNK_BYTES,
) -> Iterator[tuple[int, list[bytes]]]:
    """`records` (sequence, content) as batches (first sequence, contents) of consecutive
    sequences, each closed at `count` records or once it holds `size` bytes."""
    first, run, held = 0, list[bytes](), 0
    for seq, content in records:
        if run and (seq != first + len(run) or len(run) >= count or held >= size):
            yield first, run
            run, held = [], 0
        if not run:
            first = seq
        run.append(content)
        held += len(content)
    if run:
        yield first, run


class Reader(StoreActor):
    kind = "store-reader"

    def __init__(self, store: StoreParts) -> None:
        self.writer_uuid = store.address
        self.push = store.push
        super().__init__(store, store.reader_address)

    def _open(self, socket: SocketFactory) -> int:
        self.xpub = socket(zmq.XPUB)
        # FETCH answers, a batch at a time, giving the GIL up to the writer meanwhile.
        self.send_records = records_sender(self.xpub, hold_gil=False)
        self.sub = socket(zmq.SUB)
        self.xpub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.xpub.sndhwm = self.hwm
        self.sub.rcvhwm = self.hwm
        self.sub.setsockopt(zmq.SUBSCRIBE, proto.subscription(proto.FETCH))
        self.sub.setsockopt(zmq.SUBSCRIBE, proto.subscription(proto.GET_HEADS))
        self.sub.setsockopt(zmq.SUBSCRIBE, proto.subscription(proto.CONSUMER_HELLO, self.uuid))
        return bind_data_socket(self.xpub, self.config, self.sub)

    def _serve(self, pipe: zmq.Socket, beacon: Beacon) -> None:
        poller = zmq.Poller()
        for sock in (pipe, self.xpub, self.sub, beacon.socket):
            poller.register(sock, zmq.POLLIN)
        push = self.push
        never = 2**62
        next_push = now_ms() + push.interval if push.enabled else never
        while True:
            wait = min(beacon.next_deadline_ms(), next_push) - now_ms()
            events = dict(poller.poll(max(0, min(wait, 1000))))
            if pipe in events:
                return
            if beacon.socket in events:
                apply_events(beacon.handle(), self.sub)
            if self.xpub in events:
                self._on_subscriptions()
            if self.sub in events:
                self._on_requests()
            now = now_ms()
            if now >= next_push:
                next_push = now + push.interval
                for consumer, subject, partition, head in push.due(now):
                    # A name the wire cannot carry (e.g. a NUL) loses its push, not the reader.
                    with contextlib.suppress(proto.MalformedMessage):
                        self._direct_head(consumer.encode(), subject, partition, head)
            apply_events(beacon.tick(now), self.sub)

    def _on_subscriptions(self) -> None:
        """A consumer's SUB subscribed `L<consumer>`: greet it with STORE_HELLO (§1.5).
        Its `E<consumer>` left: the consumer is gone, push it no more heads."""
        for event in subscription_events(self.xpub):
            consumer = event.rest
            if not consumer or b"\0" in consumer:
                continue
            if event.is_subscribe and event.id == proto.STORE_HELLO:
                hello = proto.Message(proto.STORE_HELLO, consumer, address=self.uuid)
                self.xpub.send_multipart(proto.encode(hello))
            elif not event.is_subscribe and event.id == proto.DIRECT_HEAD:
                with contextlib.suppress(UnicodeDecodeError):
                    self.push.forget(consumer.decode())

    def _on_requests(self) -> None:
        for _ in range(_READER_CHUNK):
            try:
                frames = self.sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                msg = proto.decode(frames)
                if msg.address == self.writer_uuid:
                    continue  # our own writer's FETCH: the data is ours already
                if msg.id == proto.FETCH:
                    self._on_fetch(msg)
                elif msg.id == proto.GET_HEADS:
                    subject = msg.topic.decode()
                    # Watch before reading the heads: see head_push.py's docstring.
                    self.push.watch(msg.address, subject)
                    sent = self._send_heads(msg.address, subject)
                    if subject == EVERY_SUBJECT:
                        self._end_of_heads(msg.address, sent)
                elif msg.id == proto.CONSUMER_HELLO:
                    sent = 0
                    for subject in msg.subjects:
                        self.push.watch(msg.address, subject)
                        sent += self._send_heads(msg.address, subject)
                    if EVERY_SUBJECT in msg.subjects:
                        self._end_of_heads(msg.address, sent)
            except (proto.MalformedMessage, UnicodeDecodeError) as error:
                if self.verbose:
                    log.debug("dafka store reader dropped a message", error=str(error))
            except Exception:  # a bug or a DB error: lose this request, not the store
                log.exception("dafka store reader dropped a request", frames=frames[:1])

    def _on_fetch(self, msg: proto.Message) -> None:
        partition = msg.topic.decode()
        encoder = proto.RecordEncoder(msg.address, partition, msg.subject, proto.DIRECT_RECORD)
        prefix = encoder.frame1(0)[:-8]
        send = self.send_records
        sent = 0
        for first, run in batches(
            self.storage.read(msg.subject.encode(), msg.topic, msg.sequence, msg.count)
        ):
            send(prefix, first, run)
            sent += len(run)
        if self.verbose:
            log.debug(
                "dafka store answered FETCH",
                subject=msg.subject,
                partition=partition,
                sequence=msg.sequence,
                count=msg.count,
                sent=sent,
            )

    def _send_heads(self, requester: str, subject: str) -> int:
        """DIRECT_HEAD of each partition of exactly `subject` (fixing §10.11); "" asks for
        every subject, as C's prefix match answers it (a store writer catching up uses it).
        Returns how many were sent."""
        if not requester:
            return 0
        if subject:
            raw = subject.encode()
            heads: Iterable[tuple[bytes, bytes, int]] = (
                (raw, partition, head) for partition, head in self.storage.heads(raw)
            )
        else:
            heads = self.storage.partitions()
        topic = requester.encode()
        sent = 0
        for subject_b, partition, head in heads:
            self._direct_head(topic, subject_b.decode(), partition.decode(), head)
            sent += 1
        return sent

    def _end_of_heads(self, requester: str, sent: int) -> None:
        """After the answer to "every subject": the END_OF_HEADS mark (`proto.py`), so the
        asker knows it has every head, where "no more came for a while" was a guess that a
        slow or not yet connected store could make wrong."""
        if requester:
            self._direct_head(requester.encode(), EVERY_SUBJECT, self.uuid, sent)

    def _direct_head(self, requester: bytes, subject: str, partition: str, head: int) -> None:
        reply = proto.Message(
            proto.DIRECT_HEAD, requester, address=partition, subject=subject, sequence=head
        )
        self.xpub.send_multipart(proto.encode(reply))
