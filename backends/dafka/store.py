"""The store (spec §5): a writer actor and a reader actor over one RocksDB `Storage`.

Writer (§5.3): stores every RECORD of every topic contiguously per partition, FETCHes its
own gaps (from the producers and from the other stores' readers), and ACKs producers.  Per
wake-up it runs one batch: direct answers first, then live traffic, up to 100,000 records,
one atomic write (fsynced when `store/sync` = 1, the default), then one ACK per partition
with the highest sequence stored.  ACKs go out only after the write returned.

Reader (§5.4): answers FETCH with exactly the requested records q … q+count-1 (fixing the
C off-by-one, §10.12), or from the partition's oldest retained record when q is below it
(retention tail); answers GET_HEADS and CONSUMER_HELLO with one DIRECT_HEAD per partition of
the exact subject (§10.11); greets every consumer whose SUB connects with STORE_HELLO.

Retention (`store/retention/ms|bytes`, per-topic `store/topics/<topic>/retention/ms|bytes`,
-1 = forever) runs in a third thread every `store/retention/check_interval` ms.

The topic catalog (`catalog.py`, records of `__rafka_topics` written by `rafka-topics`):
the writer applies each entry in the batch that stores it. A topic's `retention.ms` /
`retention.bytes` override the settings above for it; a deletion drops every record of
the topic in the same atomic write (head keys stay: see `Storage.stage_delete_topic`).
At start the store reads the catalog it holds to restore the overrides. The catalog
itself is kept forever unless `store/topics/__rafka_topics/retention/...` says otherwise.

Fixes and additions over C: a FETCH retry timer while a partition has a known gap
(`store/fetch_retry_interval` ms, default 1000; it gives up after
`store/fetch_retry_timeout` ms without progress, default 60000, until new traffic shows
the gap again), so back-fill does not wait for more traffic; malformed
messages are dropped; the writer accepts a DIRECT_RECORD with sequence s > 0 for a partition
it has nothing of as the partition's start (the other stores' oldest retained record); a
producer HEAD at or below the stored head is answered with ACK(stored head) at once, so a
lost ACK does not leave the producer holding its records forever; and the writer learns
heads from the other stores' readers (hello handshake, then GET_HEADS every
`store/heads_interval` ms, default 5000) and FETCHes what they hold beyond its own heads,
so a store restarted after every producer is gone still back-fills (see `_Writer._hello`);
and for `store/push_heads/duration` ms after a partition changed, every
`store/push_heads/interval` ms, the reader sends its DIRECT_HEAD to the earliest consumers
that asked for heads of its topic, so a C consumer (which asks only at subscribe) still
learns of a partition it missed (see `head_push.py`).
"""

from __future__ import annotations

import contextlib
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterable

import structlog
import zmq
from rocksdict import WriteBatch

from backends.dafka import proto
from backends.dafka.beacon import (
    Beacon,
    apply_events,
    bind_data_socket,
    new_subscribers,
    now_ms,
    subscription_events,
)
from backends.dafka.catalog import TOPICS_TOPIC, Catalog, TopicEntry, retention_values
from backends.dafka.config import Config, ConfigError
from backends.dafka.fetch_filter import FetchFilter
from backends.dafka.head_push import HeadPush
from backends.dafka.node import Actor, SocketFactory
from backends.dafka.storage import PartitionState, Retention, Storage, partition_prefix

log = structlog.get_logger(__name__)

BATCH_LIMIT = 100_000  # records staged per write (C: 100,000)
_MSG_CHUNK = 1_000  # live messages taken before the direct SUB is looked at again
_READER_CHUNK = 1_000  # requests handled before the reader looks at its other sockets
_PARTITION_CACHE = 100_000  # partitions kept in the writer's memory between batches
_PACK_SEQ = struct.Struct(">Q").pack
_UNPACK_SEQ = struct.Struct(">Q").unpack_from
_PACK_SEQ_COUNT = struct.Struct(">QI").pack
_NONE = -1  # head of a partition with nothing stored
INTERNAL_PREFIX = "__rafka"  # the gateway's own topics: never deleted through the catalog


def _recv_frames(sock: zmq.Socket) -> list[bytes]:
    """The next message's frames without blocking (zmq.Again when there is none).

    About 40% cheaper per message than `recv_multipart`, which asks the socket for RCVMORE
    (a getsockopt) after every part; a zero-copy Frame knows `more` itself.
    """
    frame = sock.recv(zmq.NOBLOCK, copy=False)
    frames = [frame.bytes]
    while frame.more:  # the other parts are here already: a message arrives whole
        frame = sock.recv(zmq.NOBLOCK, copy=False)
        frames.append(frame.bytes)
    return frames


def wall_ms() -> int:
    """Wall-clock milliseconds: the write time of records, persisted for retention."""
    return time.time_ns() // 1_000_000


def retention_policy(config: Config) -> Callable[[bytes], Retention] | None:
    """Per-topic retention from the config, or None when everything is kept forever."""
    default = Retention(
        config.get_int("store/retention/ms", -1), config.get_int("store/retention/bytes", -1)
    )
    finite = not default.forever or any(
        path.startswith("store/topics/")
        and path.endswith(("/retention/ms", "/retention/bytes"))
        and value.strip() not in ("", "-1")
        for path, value in config.items()
    )
    if not finite:
        return None
    cache: dict[bytes, Retention] = {}
    catalog = TOPICS_TOPIC.encode()

    def policy_for(subject: bytes) -> Retention:
        policy = cache.get(subject)
        if policy is None:
            base = f"store/topics/{subject.decode(errors='replace')}/retention"
            # The topic catalog is kept unless configured otherwise: it holds what
            # every gateway needs to know of the topics created.
            fallback = Retention() if subject == catalog else default
            try:
                policy = Retention(
                    config.get_int(f"{base}/ms", fallback.ms),
                    config.get_int(f"{base}/bytes", fallback.bytes),
                )
            except ConfigError:
                policy = fallback  # a topic name that cannot be a config path
            cache[subject] = policy
        return policy

    return policy_for


class RetentionPolicy:
    """The store's retention: its settings, overridden per topic by the catalog's
    `retention.ms` / `retention.bytes`. Written by the writer thread, read by the
    retention thread: overrides are replaced, never changed in place."""

    def __init__(self, config: Config) -> None:
        self._configured = retention_policy(config)
        self._overrides: dict[bytes, tuple[int | None, int | None]] = {}

    @property
    def active(self) -> bool:
        """Whether any topic may have records to delete."""
        return self._configured is not None or bool(self._overrides)

    def apply_entry(self, entry: TopicEntry) -> None:
        """Take a topic's retention from its latest catalog entry."""
        subject = entry.topic.encode()
        values = (None, None) if entry.deleted else retention_values(entry.config)
        overrides = dict(self._overrides)
        if values == (None, None):
            overrides.pop(subject, None)
        else:
            overrides[subject] = values
        self._overrides = overrides

    def __call__(self, subject: bytes) -> Retention:
        base = self._configured(subject) if self._configured is not None else Retention()
        override = self._overrides.get(subject)
        if override is None:
            return base
        ms, size = override
        return Retention(base.ms if ms is None else ms, base.bytes if size is None else size)


class Store:
    """A Dafka store: writer (uuid = `address`) and reader (`reader_address`) threads."""

    def __init__(self, config: Config, context: zmq.Context | None = None) -> None:
        self._config = config
        self._context = context or zmq.Context.instance()
        self.address = uuid.uuid4().hex.upper()
        self.reader_address = uuid.uuid4().hex.upper()
        self.verbose = config.get_bool("store/verbose")
        # Every setting is read before anything is opened: a bad value must not leave the
        # DB locked or the actors running.
        self.retention = RetentionPolicy(config)
        interval = max(1, config.get_int("store/retention/check_interval", 300_000))
        self.push = HeadPush(
            config.get_int("store/push_heads/interval"), config.get_int("store/push_heads/duration")
        )
        self.storage = Storage(config.get("store/db"), sync=config.get_int("store/sync", 1) != 0)
        self.catalog = Catalog()
        try:
            self._load_catalog()
        except BaseException:
            self.storage.close()
            raise
        self._closed = False
        self._lock = threading.Lock()
        self._stop_retention = threading.Event()
        self._retention_thread: threading.Thread | None = None
        try:
            self._writer = _Writer(self)
            try:
                self._reader = _Reader(self)
            except BaseException:
                self._writer.close()
                raise
        except BaseException:
            self.storage.close()
            self._closed = True
            raise
        # Always: the catalog may give a topic a retention at any time.
        self._retention_thread = threading.Thread(
            target=self._retain,
            args=(self.retention, interval / 1000),
            name="dafka-store-retention",
            daemon=True,
        )
        self._retention_thread.start()

    @property
    def writer_port(self) -> int:
        return self._writer.port

    @property
    def reader_port(self) -> int:
        return self._reader.port

    def close(self) -> None:
        """Stop and join the threads, then close the DB (exactly once)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop_retention.set()
        if self._retention_thread is not None:
            self._retention_thread.join()
        self._writer.close()
        self._reader.close()
        self.storage.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _load_catalog(self) -> None:
        """The retention overrides of the catalog this store holds (deletions were
        applied when they were stored)."""
        subject = TOPICS_TOPIC.encode()
        for partition, _ in self.storage.heads(subject):
            for _, content in self.storage.records(subject, partition):
                self.catalog.apply(content)
        for entry in self.catalog.entries():
            self.retention.apply_entry(entry)

    def _retain(self, policy: RetentionPolicy, interval: float) -> None:
        while not self._stop_retention.wait(interval):
            if not policy.active:
                continue
            try:
                deleted = self.storage.apply_retention(policy, wall_ms())
            except Exception:
                log.exception("dafka store retention failed; retrying next interval")
                continue
            if deleted and self.verbose:
                log.info("dafka store retention", deleted=deleted)


class _Actor(Actor):
    """What the writer and the reader share: the store, its DB and its settings.
    Subclasses set their own state first: the thread starts in this constructor."""

    def __init__(self, store: Store, uuid_: str) -> None:
        self.store = store
        self.uuid = uuid_
        self.config = store._config
        self.storage = store.storage
        self.verbose = store.verbose
        self.hwm = self.config.get_int("store/high_watermark", 1_000_000)
        super().__init__(store._config, store._context, address=uuid_)

    def close(self) -> None:
        self._shut_down()


class _Partition:
    """The writer's state of one (subject, partition), with its precomputed frames."""

    __slots__ = (
        "ack_prefix",
        "body_size",
        "catalog",
        "fetch_prefix",
        "gap",
        "head",
        "key_prefix",
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
        self.saved: tuple[int, int] | None = None  # (head, total) before this batch
        self.key_prefix = partition_prefix(b"M", self.subject_b, self.partition_b)
        self.catalog = subject == TOPICS_TOPIC  # its records are applied when stored
        # version byte + address string + subject string of a (DIRECT_)RECORD's frame 1
        self.body_size = 3 + len(self.partition_b) + len(self.subject_b)
        # Frames minus their trailing numbers, built once with the codec.
        ack = proto.Message(proto.ACK, self.partition_b, subject=subject)
        self.ack_prefix = proto.encode(ack)[0][:-8]
        fetch = proto.Message(proto.FETCH, self.partition_b, address=writer_uuid, subject=subject)
        self.fetch_prefix = proto.encode(fetch)[0][:-12]


class _Writer(_Actor):
    kind = "store-writer"

    def __init__(self, store: Store) -> None:
        config = store._config
        self.retry_interval = max(10, config.get_int("store/fetch_retry_interval", 1000))
        self.retry_timeout = config.get_int("store/fetch_retry_timeout", 60_000)
        # <= 0 turns the periodic GET_HEADS off (the hello handshake still runs).
        self.heads_interval = config.get_int("store/heads_interval", 5000)
        self.reader_uuid = store.reader_address
        self.filter = FetchFilter()
        self.partitions: dict[tuple[str, str], _Partition] = {}
        self.by_body: dict[bytes, _Partition] = {}  # raw record body -> partition
        self.gapped: set[_Partition] = set()
        self.deleted: list[tuple[bytes, int]] = []  # topics deleted in this batch
        super().__init__(store, store.address)

    def _open(self, socket: SocketFactory) -> int:
        # An XPUB (C: a PUB; the same to every SUB) so that we see a store reader's SUB
        # subscribe `W<reader>`: from then on our CONSUMER_HELLO reaches that reader.
        self.pub = socket(zmq.XPUB)
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
                self._batch()
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

    def _batch(self) -> None:
        """Stage up to BATCH_LIMIT messages, write them at once, then ACK (spec §5.3)."""
        if len(self.partitions) >= _PARTITION_CACHE:
            # Forget idle partitions (their heads are in the DB); keep the gapped ones.
            self.partitions = {(p.subject, p.partition): p for p in self.gapped}
            self.by_body = {}
        batch = self.storage.new_batch()
        put = batch.put
        touched: dict[_Partition, None] = {}  # ordered set of partitions staged in
        by_body = self.by_body
        decode_record = proto.decode_record
        pack = _PACK_SEQ
        unpack = _UNPACK_SEQ
        record_id = proto.RECORD
        record_ids = (proto.RECORD, proto.DIRECT_RECORD)
        head_ids = (proto.HEAD, proto.DIRECT_HEAD)

        def handle(frames: list[bytes]) -> None:
            first = frames[0]
            # Fast path: the bytes from the version to the sequence (version, address,
            # subject) name a partition already validated by the full decoder.
            part = by_body.get(first[first.find(0, 1) + 1 : -8])
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
                body = first[first.find(0, 1) + 1 : -8]
                if len(body) == part.body_size:  # no trailing bytes: the canonical form
                    by_body[body] = part
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
                    self._on_catalog(batch, content)
            elif seq > head:
                self._fetch_gap(part, seq)

        direct = self.direct
        live = self.msg
        taken = 0
        while taken < BATCH_LIMIT:
            before = taken
            # Direct answers (back-fill) first, as in C; then a chunk of live traffic.
            while taken < BATCH_LIMIT:
                try:
                    frames = _recv_frames(direct)
                except zmq.Again:
                    break
                taken += 1
                try:
                    handle(frames)
                except Exception:  # a bug or a DB error: lose this message, not the store
                    log.exception("dafka store writer dropped a message", frames=frames[:1])
            chunk_end = min(BATCH_LIMIT, taken + _MSG_CHUNK)
            while taken < chunk_end:
                try:
                    frames = _recv_frames(live)
                except zmq.Again:
                    break
                taken += 1
                try:
                    handle(frames)
                except Exception:  # a bug or a DB error: lose this message, not the store
                    log.exception("dafka store writer dropped a message", frames=frames[:1])
            if taken == before:
                break
        if touched:
            self._commit(batch, touched)

    def _on_head(self, frames: list[bytes]) -> None:
        """HEAD from a producer, or DIRECT_HEAD from another store: FETCH what we lack."""
        msg = proto.decode(frames)
        if msg.id != proto.HEAD and msg.id != proto.DIRECT_HEAD:
            return
        part = self._partition(msg.subject, msg.address)
        if msg.sequence > part.head:
            self._fetch_gap(part, msg.sequence)
        elif msg.id == proto.HEAD and part.saved is None:
            # We hold everything the producer has: our ACK may have been lost (e.g. its
            # SUB had not joined our PUB yet), and it never comes again otherwise, so
            # the producer would keep its records forever.  Repeat it.  (If the partition
            # is staged in this batch, the batch's own ACK covers it.)
            self.pub.send(part.ack_prefix + _PACK_SEQ(part.head))

    def _on_catalog(self, batch: WriteBatch, content: bytes) -> None:
        """A topic catalog record is being stored: apply it in the same batch."""
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
        self.storage.stage_delete_topic(batch, subject, states, wall_ms())
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
            if part.head >= part.gap or now - part.retry_since > self.retry_timeout:
                self.gapped.discard(part)
                part.gap = _NONE
            else:
                self._fetch(part, now)

    def _commit(self, batch: WriteBatch, touched: dict[_Partition, None]) -> None:
        written = wall_ms()
        storage = self.storage
        for part in touched:
            storage.stage_partition(
                batch, part.subject_b, part.partition_b, part.head, part.total, written
            )
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
        send = self.pub.send
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


class _Reader(_Actor):
    kind = "store-reader"

    def __init__(self, store: Store) -> None:
        self.writer_uuid = store.address
        self.push = store.push
        super().__init__(store, store.reader_address)

    def _open(self, socket: SocketFactory) -> int:
        self.xpub = socket(zmq.XPUB)
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
                    self._send_heads(msg.address, subject)
                elif msg.id == proto.CONSUMER_HELLO:
                    for subject in msg.subjects:
                        self.push.watch(msg.address, subject)
                        self._send_heads(msg.address, subject)
            except (proto.MalformedMessage, UnicodeDecodeError) as error:
                if self.verbose:
                    log.debug("dafka store reader dropped a message", error=str(error))
            except Exception:  # a bug or a DB error: lose this request, not the store
                log.exception("dafka store reader dropped a request", frames=frames[:1])

    def _on_fetch(self, msg: proto.Message) -> None:
        partition = msg.topic.decode()
        encoder = proto.RecordEncoder(msg.address, partition, msg.subject, proto.DIRECT_RECORD)
        prefix = encoder.frame1(0)[:-8]
        send = self.xpub.send
        more = zmq.SNDMORE
        pack = _PACK_SEQ
        sent = 0
        for seq, content in self.storage.read(
            msg.subject.encode(), msg.topic, msg.sequence, msg.count
        ):
            send(prefix + pack(seq), more)
            send(content)
            sent += 1
        if self.verbose:
            log.debug(
                "dafka store answered FETCH",
                subject=msg.subject,
                partition=partition,
                sequence=msg.sequence,
                count=msg.count,
                sent=sent,
            )

    def _send_heads(self, requester: str, subject: str) -> None:
        """DIRECT_HEAD of each partition of exactly `subject` (fixing §10.11); "" asks for
        every subject, as C's prefix match answers it (a store writer catching up uses it)."""
        if not requester:
            return
        if subject:
            raw = subject.encode()
            heads: Iterable[tuple[bytes, bytes, int]] = (
                (raw, partition, head) for partition, head in self.storage.heads(raw)
            )
        else:
            heads = self.storage.partitions()
        topic = requester.encode()
        for subject_b, partition, head in heads:
            self._direct_head(topic, subject_b.decode(), partition.decode(), head)

    def _direct_head(self, requester: bytes, subject: str, partition: str, head: int) -> None:
        reply = proto.Message(
            proto.DIRECT_HEAD, requester, address=partition, subject=subject, sequence=head
        )
        self.xpub.send_multipart(proto.encode(reply))
