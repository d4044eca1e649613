"""The store's writer actor (spec §5.3).

Stores every RECORD of every topic contiguously per partition, FETCHes its own gaps (from
the producers and from the other stores' readers), and ACKs producers.  Per wake-up it
runs one batch: direct answers first, then live traffic, up to 100,000 records, one atomic
write (fsynced when `store/sync` = 1, the default), then one ACK per partition with the
highest sequence stored.  ACKs go out only after the write returned.

The topic catalog (`catalog.py`, records of `__rafka_topics` written by `rafka-topics`):
the writer applies each entry in the batch that stores it. A topic's `retention.ms` /
`retention.bytes` override the retention settings for it (`retention.py`); a deletion
drops the records of the topic up to the heads it names in the same atomic write (head
keys stay, and records written after the deletion too: see
`Storage.stage_delete_topic`). The catalog itself is kept forever unless
`store/topics/__rafka_topics/retention/...` says otherwise.

Fixes and additions over C: a FETCH retry timer while a partition has a known gap
(`store/fetch_retry_interval` ms, default 1000; it gives up after
`store/fetch_retry_timeout` ms without progress, default 60000, until new traffic shows
the gap again), so back-fill does not wait for more traffic; malformed messages are
dropped; a DIRECT_RECORD with sequence s > 0 for a partition it has nothing of is the
partition's start (the other stores' oldest retained record), and for a partition it
holds, one past its head that stays the lowest answer for a whole retry interval in
which nothing is stored is where the partition goes on (the records between are gone from every
store that answered: it was down while their retention passed its head); a producer HEAD
at or below
the stored head is answered with ACK(stored head) at once, so a lost ACK does not leave
the producer holding its records forever; and the writer learns heads from the other
stores' readers (hello handshake, then GET_HEADS every `store/heads_interval` ms, default
5000) and FETCHes what they hold beyond its own heads, so a store restarted after every
producer is gone still back-fills (see `Writer._hello`).
"""

from __future__ import annotations

import struct

import structlog
import zmq
from rocksdict import WriteBatch

from backends.dafka import proto
from backends.dafka.beacon import Beacon, apply_events, bind_data_socket, new_subscribers, now_ms
from backends.dafka.catalog import TOPICS_TOPIC
from backends.dafka.fetch_filter import FetchFilter
from backends.dafka.held_recv import ReceiveMany, batch_receiver
from backends.dafka.held_send import direct_sender
from backends.dafka.node import SocketFactory
from backends.dafka.storage import PartitionState, Storage, partition_keys, partition_prefix
from backends.dafka.store.actor import StoreActor, StoreParts
from backends.dafka.store.retention import wall_ms

log = structlog.get_logger(__name__)

BATCH_LIMIT = 100_000  # records staged per write (C: 100,000)
_MSG_CHUNK = 1_000  # live messages taken before the direct SUB is looked at again
_PARTITION_CACHE = 100_000  # partitions kept in the writer's memory between batches
_PACK_SEQ = struct.Struct(">Q").pack
_UNPACK_SEQ = struct.Struct(">Q").unpack_from
_PACK_SEQ_COUNT = struct.Struct(">QI").pack
_NONE = -1  # head of a partition with nothing stored
INTERNAL_PREFIX = "__rafka"  # the gateway's own topics: never deleted through the catalog


class _Partition:
    """The writer's state of one (subject, partition), with its precomputed frames."""

    __slots__ = (
        "ack_prefix",
        "catalog",
        "fetch_prefix",
        "gap",
        "head",
        "head_keys",
        "key_prefix",
        "oldest",
        "oldest_at",
        "oldest_seen",
        "partition",
        "partition_b",
        "retry_head",
        "retry_since",
        "saved",
        "subject",
        "subject_b",
        "total",
    )

    def __init__(self, subject: str, partition: str, writer_uuid: str, storage: Storage) -> None:
        self.subject = subject
        self.partition = partition
        self.subject_b = subject.encode()
        self.partition_b = partition.encode()
        state = storage.partition_state(self.subject_b, self.partition_b)
        self.head = _NONE if state is None else state.head
        self.total = 0 if state is None else state.total
        self.gap = _NONE  # highest sequence known to exist beyond head (retry target)
        self.retry_head = _NONE  # head when the retry timer last saw progress …
        self.retry_since = 0  # … and when (now_ms clock)
        # The lowest sequence past head + 1 that a FETCH answer brought (the answering
        # stores' oldest record), the head when it came (a record stored since, from a
        # slower store that keeps more, ends it), and whether a retry has seen it so.
        self.oldest = _NONE
        self.oldest_at = _NONE
        self.oldest_seen = False
        self.saved: tuple[int, int] | None = None  # (head, total) before this batch
        self.key_prefix = partition_prefix(b"M", self.subject_b, self.partition_b)
        self.head_keys = partition_keys(self.subject_b, self.partition_b)
        self.catalog = subject == TOPICS_TOPIC  # its records are applied when stored
        # Frames minus their trailing numbers, built once with the codec.
        ack = proto.Message(proto.ACK, self.partition_b, subject=subject)
        self.ack_prefix = proto.encode(ack)[0][:-8]
        fetch = proto.Message(proto.FETCH, self.partition_b, address=writer_uuid, subject=subject)
        self.fetch_prefix = proto.encode(fetch)[0][:-12]


class Writer(StoreActor):
    kind = "store-writer"

    def __init__(self, store: StoreParts) -> None:
        config = store.config
        self.retry_interval = max(10, config.get_int("store/fetch_retry_interval", 1000))
        self.retry_timeout = config.get_int("store/fetch_retry_timeout", 60_000)
        # <= 0 turns the periodic GET_HEADS off (the hello handshake still runs).
        self.heads_interval = config.get_int("store/heads_interval", 5000)
        self.reader_uuid = store.reader_address
        self.filter = FetchFilter()
        self.partitions: dict[tuple[str, str], _Partition] = {}
        # A record's frame 1 without its sequence -> its partition (one entry each for
        # the RECORD and the DIRECT_RECORD form), for frames in the codec's exact form.
        self.by_frame: dict[bytes, _Partition] = {}
        self.gapped: set[_Partition] = set()
        self.deleted: list[tuple[bytes, int]] = []  # topics deleted in this batch
        super().__init__(store, store.address)

    def _open(self, socket: SocketFactory) -> int:
        # An XPUB (C: a PUB; the same to every SUB) so that we see a store reader's SUB
        # subscribe `W<reader>`: from then on our CONSUMER_HELLO reaches that reader.
        self.pub = socket(zmq.XPUB)
        self.send_direct = direct_sender(self.pub)  # ACKs: one a partition and batch
        self.direct = socket(zmq.SUB)
        self.msg = socket(zmq.SUB)
        for sock in (self.direct, self.msg):
            sock.rcvhwm = self.hwm
        self.pub.sndhwm = self.hwm
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every reader's `W`, not just the first
        # DIRECT_RECORD: FETCH answers; DIRECT_HEAD: other stores' heads; STORE_HELLO: a
        # store reader greets us once our SUB is connected to it (spec §4.4, as a consumer).
        for kind in (proto.DIRECT_RECORD, proto.DIRECT_HEAD, proto.STORE_HELLO):
            self.direct.setsockopt(zmq.SUBSCRIBE, proto.subscription(kind, self.uuid))
        self.msg.setsockopt(zmq.SUBSCRIBE, proto.subscription(proto.RECORD))
        self.msg.setsockopt(zmq.SUBSCRIBE, proto.subscription(proto.HEAD))
        self.receive_direct = batch_receiver(self.direct)
        self.receive_live = batch_receiver(self.msg)
        return bind_data_socket(self.pub, self.config, self.direct, self.msg)

    def _serve(self, pipe: zmq.Socket, beacon: Beacon) -> None:
        poller = zmq.Poller()
        for sock in (pipe, self.pub, self.direct, self.msg, beacon.socket):
            poller.register(sock, zmq.POLLIN)
        next_retry = now_ms() + self.retry_interval
        never = 2**62
        next_heads = now_ms() + self.heads_interval if self.heads_interval > 0 else never
        while True:
            now = now_ms()
            wait = min(beacon.next_deadline_ms(), next_retry, next_heads) - now
            events = dict(poller.poll(max(0, min(wait, 1000))))
            if pipe in events:
                return
            if beacon.socket in events:
                apply_events(beacon.handle(), self.direct, self.msg)
            if self.pub in events:
                self._on_subscriptions()
            if self.direct in events or self.msg in events:
                self._batch(self.direct in events)
            now = now_ms()
            if now >= next_retry:
                next_retry = now + self.retry_interval
                self._retry(now)
            if now >= next_heads:
                next_heads = now + self.heads_interval
                self._get_heads()
            apply_events(beacon.tick(now), self.direct, self.msg)

    # --- learning heads from the other stores (catch-up without a live producer) ---------
    #
    # Only a producer's RECORD/HEAD tells a C store writer what exists, so a store started
    # after the producers are gone never back-fills.  Ours also asks the other stores'
    # readers for their heads and treats each DIRECT_HEAD like a HEAD.  The request names
    # the subject "" = every subject: C readers answer it with all their heads (their
    # subject test is a prefix match, spec §5.4), and so does ours, so a store with an
    # empty DB learns every partition.  It goes (1) to each reader as CONSUMER_HELLO at
    # the end of the hello handshake (both links up: no request lost at start), and (2) to
    # all readers as GET_HEADS every `store/heads_interval` ms (lost messages, gaps whose
    # retries gave up).  Wire compatible: readers answer both with DIRECT_HEAD to `E<us>`.

    def _hello(self, reader: bytes) -> None:
        """Ask one store reader for all its heads (CONSUMER_HELLO, subjects [""])."""
        if reader == self.reader_uuid.encode() or not reader or b"\0" in reader:
            return  # our own reader never answers its writer; garbage is not a reader
        hello = proto.Message(proto.CONSUMER_HELLO, reader, address=self.uuid, subjects=[""])
        self.pub.send_multipart(proto.encode(hello))

    def _get_heads(self) -> None:
        """Ask every store reader for all its heads (GET_HEADS, subject "")."""
        self.pub.send_multipart(proto.encode(proto.Message(proto.GET_HEADS, address=self.uuid)))

    def _on_subscriptions(self) -> None:
        """A store reader's SUB subscribed `W<reader>` on our XPUB: say hello to it."""
        for reader in new_subscribers(self.pub, proto.CONSUMER_HELLO):
            self._hello(reader)

    def _on_store_hello(self, frames: list[bytes]) -> None:
        """Our SUB joined a store reader's XPUB (it greets us): say hello to it."""
        msg = proto.decode(frames)
        if msg.id == proto.STORE_HELLO:
            self._hello(msg.address.encode())

    def _partition(self, subject: str, partition: str) -> _Partition:
        part = self.partitions.get((subject, partition))
        if part is None:
            part = _Partition(subject, partition, self.uuid, self.storage)
            self.partitions[(subject, partition)] = part
        return part

    def _batch(self, direct_ready: bool = True) -> None:
        """Stage up to BATCH_LIMIT messages, write them at once, then ACK (spec §5.3).
        `direct_ready`: the poll saw direct answers waiting."""
        if len(self.partitions) >= _PARTITION_CACHE:
            # Forget idle partitions (their heads are in the DB); keep the gapped ones.
            self.partitions = {(p.subject, p.partition): p for p in self.gapped}
            self.by_frame = {}
        elif len(self.by_frame) >= 2 * _PARTITION_CACHE:
            # Two forms a partition, unless a peer routes records under other topics
            # (the subscription takes any): bounded all the same.
            self.by_frame = {}
        batch = self.storage.new_batch()
        put = batch.put
        touched: dict[_Partition, None] = {}  # ordered set of partitions staged in
        by_frame = self.by_frame
        decode_record = proto.decode_record
        pack = _PACK_SEQ
        unpack = _UNPACK_SEQ
        record_id = proto.RECORD
        record_ids = (proto.RECORD, proto.DIRECT_RECORD)
        head_ids = (proto.HEAD, proto.DIRECT_HEAD)

        def handle(frames: list[bytes]) -> None:
            first = frames[0]
            # Fast path: the bytes up to the sequence name a partition already
            # validated by the full decoder.
            part = by_frame.get(first[:-8])
            mid = first[0]
            if part is not None and len(frames) == 2 and mid in record_ids:
                seq = unpack(first, len(first) - 8)[0]
                content = frames[1]
            else:
                try:
                    if mid in head_ids:
                        self._on_head(frames)
                        return
                    if mid == proto.STORE_HELLO:
                        self._on_store_hello(frames)
                        return
                    mid, _, address, subject, seq, content = decode_record(frames)
                    part = self._partition(subject, address)
                except (proto.MalformedMessage, UnicodeDecodeError):
                    return  # dropped, never a reason to stop (spec §1.6)
                prefix = proto.record_prefix(first)
                if prefix is not None:  # no trailing bytes: its sequence ends it
                    by_frame[prefix] = part
            head = part.head
            if seq == head + 1 or (head == _NONE and mid != record_id):
                # The next record; or, for a partition we have nothing of, a FETCH answer
                # from its oldest record the other stores still keep (retention tail).
                if part.saved is None:
                    part.saved = (head, part.total)
                    touched[part] = None
                put(part.key_prefix + pack(seq), content)
                part.head = seq
                part.total += len(content)
                if part.catalog:
                    self._on_catalog(batch, content, touched)
            elif seq > head:
                if mid != record_id:  # an answer past our head + 1: `_retry` judges it
                    if part.oldest_at != head:
                        part.oldest, part.oldest_at, part.oldest_seen = seq, head, False
                    elif seq < part.oldest:
                        part.oldest = seq
                self._fetch_gap(part, seq)

        def take(receive: ReceiveMany, taken: int, until: int) -> int:
            """Handle a socket's messages while `taken` < `until`; the new `taken`."""
            while taken < until:
                asked = min(until - taken, _MSG_CHUNK)
                messages = receive(asked)
                taken += len(messages)
                for frames in messages:
                    try:
                        # handle()'s most common case without the call: a known
                        # partition's next record, not the catalog's (0.1-0.2 us of ~2.4
                        # a record).
                        if len(frames) == 2:
                            first = frames[0]
                            part = by_frame.get(first[:-8])
                            if part is not None and not part.catalog:
                                seq = unpack(first, len(first) - 8)[0]
                                if seq == part.head + 1:
                                    if part.saved is None:
                                        part.saved = (part.head, part.total)
                                        touched[part] = None
                                    content = frames[1]
                                    put(part.key_prefix + pack(seq), content)
                                    part.head = seq
                                    part.total += len(content)
                                    continue
                        handle(frames)
                    except Exception:  # a bug or a DB error: lose this message, not the store
                        log.exception("dafka store writer dropped a message", frames=frames[:1])
                if len(messages) < asked:
                    break  # no more were waiting
            return taken

        direct = self.receive_direct
        live = self.receive_live
        taken = 0
        look_at_direct = direct_ready
        while taken < BATCH_LIMIT:
            # Direct answers (back-fill) first, as in C; then a chunk of live traffic. A
            # socket is read until zmq.Again only when there may be more: each Again is an
            # exception (3-5 µs), and looking twice at both sockets cost four per batch.
            if look_at_direct:
                taken = take(direct, taken, BATCH_LIMIT)
            chunk_end = min(BATCH_LIMIT, taken + _MSG_CHUNK)
            taken = take(live, taken, chunk_end)
            if taken < chunk_end:
                break  # live traffic drained: the next poll says what came meanwhile
            look_at_direct = True
        if touched:
            self._commit(batch, touched)

    def _on_head(self, frames: list[bytes]) -> None:
        """HEAD from a producer, or DIRECT_HEAD from another store: FETCH what we lack."""
        msg = proto.decode(frames)
        if (msg.id != proto.HEAD and msg.id != proto.DIRECT_HEAD) or proto.is_end_of_heads(msg):
            return
        part = self._partition(msg.subject, msg.address)
        if msg.sequence > part.head:
            self._fetch_gap(part, msg.sequence)
        elif msg.id == proto.HEAD and part.saved is None:
            # We hold everything the producer has: our ACK may have been lost (e.g. its
            # SUB had not joined our PUB yet), and it never comes again otherwise, so
            # the producer would keep its records forever.  Repeat it.  (If the partition
            # is staged in this batch, the batch's own ACK covers it.)
            self.send_direct(part.ack_prefix + _PACK_SEQ(part.head))

    def _on_catalog(
        self, batch: WriteBatch, content: bytes, touched: dict[_Partition, None]
    ) -> None:
        """A topic catalog record is being stored: apply it in the same batch (whose
        partitions staged so far are `touched`)."""
        entry = self.store.catalog.apply(content, again=True)
        if entry is None:
            return
        self.store.retention.apply_entry(entry)
        if not entry.deleted or entry.topic.startswith(INTERNAL_PREFIX):
            return
        subject = entry.topic.encode()
        states = self.storage.partition_states(subject)
        for part in self.partitions.values():
            if part.subject_b == subject and part.head != _NONE:
                states[part.partition_b] = PartitionState(part.head, part.total)
        through = {address.encode(): head for address, head in entry.heads.items()}
        self.storage.stage_delete_topic(batch, subject, states, through, wall_ms())
        for address, head in entry.heads.items():
            part = self._partition(entry.topic, address)
            if part.head < head:
                # Behind the deletion (down while it ran, or never had the partition):
                # go on after it, or its deleted records would be fetched back from a
                # store that keeps them (C's, or one that has not stored the entry yet).
                # Staged with the batch, and undone with it if its write fails.
                if part.saved is None:
                    part.saved = (part.head, part.total)
                    touched[part] = None
                part.head = head
        self.deleted.append((subject, len(states)))

    def _fetch_gap(self, part: _Partition, known: int) -> None:
        """`known` exists beyond our head: FETCH from head + 1 and retry until filled."""
        now = now_ms()
        if known > part.gap:
            part.gap = known
        part.retry_head = part.head
        part.retry_since = now  # fresh evidence (re-)arms the retry timer
        self.gapped.add(part)
        self._fetch(part, now)

    def _fetch(self, part: _Partition, now: int) -> None:
        seq = part.head + 1
        count = self.filter.should_fetch(part.subject, part.partition, seq, now)
        if count is not None:
            self.pub.send(part.fetch_prefix + _PACK_SEQ_COUNT(seq, count))
            if self.verbose:
                log.debug("dafka store FETCH", subject=part.subject, sequence=seq, count=count)

    def _retry(self, now: int) -> None:
        """Re-FETCH open gaps; give up on one that made no progress for the retry timeout
        (nobody has the records any more) until new RECORD/HEAD traffic shows it again."""
        for part in list(self.gapped):
            if part.head != part.retry_head:
                part.retry_head = part.head
                part.retry_since = now
            if part.oldest != _NONE:
                if part.head != part.oldest_at:  # stored records since: no proof
                    part.oldest, part.oldest_at = _NONE, _NONE
                elif part.oldest_seen:
                    self._go_on_from_oldest(part, now)
                else:
                    part.oldest_seen = True  # one lost FETCH, or a slow store, is no proof
            if part.head >= part.gap or now - part.retry_since > self.retry_timeout:
                self.gapped.discard(part)
                part.gap = _NONE
            else:
                self._fetch(part, now)

    def _go_on_from_oldest(self, part: _Partition, now: int) -> None:
        """For a whole retry interval (from one retry to the next, at least) the stores
        answered FETCH(head + 1) from a later record, and no record was stored: they no
        longer keep the records between (retention passed our head while we were down).
        Go on from their oldest, as a store that holds nothing of the partition starts at
        it; it used to ask for head + 1 for ever and drop every later record of the
        partition."""
        log.warning(
            "records gone from every store that answered; the partition goes on from the "
            "oldest they keep",
            topic=part.subject,
            partition=part.partition,
            head=part.head,
            oldest=part.oldest,
        )
        part.head = part.oldest - 1  # the next record stored writes the head key
        part.retry_head, part.retry_since = part.head, now
        part.oldest, part.oldest_at = _NONE, _NONE

    def _commit(self, batch: WriteBatch, touched: dict[_Partition, None]) -> None:
        written = wall_ms()
        storage = self.storage
        stage = storage.stage_partition
        for part in touched:
            stage(batch, part.head_keys, part.head, part.total, written)
        try:
            storage.commit(batch)
        except Exception:
            # Nothing was written: forget the staged heads so the records are fetched again.
            log.exception("dafka store write failed; records will be fetched again")
            self.deleted = []
            for part in touched:
                if part.saved is not None:
                    part.gap = max(part.gap, part.head)  # known to exist: fetch it again
                    part.head, part.total = part.saved
                    part.saved = None
                    self.gapped.add(part)
            return
        send = self.send_direct
        for part in touched:
            part.saved = None
            send(part.ack_prefix + _PACK_SEQ(part.head))
        deleted, self.deleted = self.deleted, []
        for subject, partitions in deleted:
            log.info(
                "dafka store deleted a topic (rafka-topics)",
                topic=subject.decode(errors="replace"),
                partitions=partitions,
            )
            try:
                self.storage.compact_topic(subject)
            except Exception:  # the records are gone already; only the space is not back
                log.exception("dafka store could not compact a deleted topic")
        push = self.store.push
        if push.watching:
            push.changed((part.subject, part.partition, part.head) for part in touched)
