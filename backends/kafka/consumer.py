"""One librdkafka consumer per session, driven from a thread of its own.

Every librdkafka call of a consumer (creation, fetch, offset store, close) runs on the
consumer's single worker thread: hundreds of sessions blocked in BLPOP must not starve
one another in a shared pool, and fetch and close are serialised for free (Rafka's
per-consumer lock, #77).

`ack()` never calls librdkafka. confluent-kafka (2.16) lets one thread at a time into a
consumer handle: another caller sleeps at its gate, re-checking every millisecond, until
the call inside returns. The worker's next() polls slice after slice and re-enters the
gate at once, so a `store_offsets` on the event loop got in only when that next()
returned: with a record, at its timeout, or never (BLPOP 0 on an idle topic; even
close() could not end it, as it starts on the frozen loop). So `ack()` checks the
partition is still this member's (refused as librdkafka would: `Local: Erroneous state`)
and queues the offset; the worker stores queued offsets before each poll slice (at most
POLL_SLICE later), at once when it is idle, before a revoke hands partitions over, and
before close commits.

With `enable.auto.offset.store` on (librdkafka's default, or a client's BLPOP settings),
librdkafka would store the offset of every record a batch fetched, handed out or not,
and commit past records no client ever got. The consumer is made with it off, and the
offset of each record is stored as it is handed out, as Rafka's one poll per BLPOP
stored it; an ack is then refused as librdkafka refuses it (`Local: Invalid argument or
configuration`).

Records are fetched in batches into a per-consumer buffer, and `next()` serves them on
the event loop without a thread hop; it goes to the worker only when the buffer is empty
or stale. So librdkafka is still called only while a `next()` waits for it (or a
cancelled one finishes its slice): rebalances happen inside a BLPOP, never between a
BLPOP and the client's ack, as with Rafka's one-poll-per-BLPOP.

A fetched batch stays one RecordBatch (columns) in the buffer, a segment: `records_of()`
builds it from librdkafka's messages column by column, `take_ready()` and
`next_batch()` hand out a slice of it, and the gateway encodes from its columns: no
Python code and no object per record on the common path.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import structlog
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import (
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from backends.base import (
    AckError,
    ConsumeError,
    Consumer,
    ConsumerCreationError,
    Record,
    RecordBatch,
    Stats,
)
from backends.kafka.rdlog import librdkafka_logger
from backends.kafka.records import Partition, record_of, records_of
from backends.kafka.texts import creation_error_text, error_text
from backends.settings import redacted

log = structlog.get_logger("rafka.kafka.consumer")

POLL_SLICE = 0.1  # seconds per librdkafka wait, as in Rafka: bounds the reaction to close
# Serve the buffer without calling librdkafka for at most this long: a slow client must
# still serve rebalance callbacks promptly and stay within max.poll.interval.ms.
REFRESH = POLL_SLICE
BATCH = 500  # records per fetch by default
MAX_BATCH = 1_000_000  # confluent-kafka's limit for consume(num_messages)
CLOSED = "Consumer closed"
# librdkafka's refusal of an offset store for a partition not assigned (ERR__STATE).
NOT_OWNED = str(KafkaError(KafkaError._STATE).str())
# What librdkafka answers a store of offsets when it stores them itself.
AUTO_STORED = str(KafkaError(KafkaError._INVALID_ARG).str())
# The values librdkafka takes for a boolean's true (rdkafka_conf.c).
_TRUE = frozenset({"true", "t", "1"})
# Errors that resolve themselves or are plain information (spec §4.5, §15.2).
TRANSIENT = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._PARTITION_EOF,
    }
)


@dataclass(frozen=True, slots=True)
class _Failure:
    """A non-transient error at its place among the buffered records."""

    text: str


class KafkaConsumer(Consumer):
    """A consumer-group member; build it with `await KafkaConsumer.open(...)`."""

    def __init__(self, stats: Stats, label: str, batch: int = BATCH) -> None:
        if not 1 <= batch <= MAX_BATCH:
            raise ValueError(f"consume batch must be 1..{MAX_BATCH}, not {batch}")
        self._stats = stats
        self._log = log.bind(consumer=label)
        self._batch = batch
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"rafka-consumer-{label}")
        self._rd: RdConsumer | None = None
        # Fetched, not yet handed out, in fetch order (so in order per partition): runs
        # of records (segments, never empty) and failures at their place. The first
        # `_head` records of the first segment are handed out already; `_count` is what
        # is left (records and failures). The worker appends and purges (rebalance
        # callbacks), the loop takes: hence the lock.
        self._buffer: collections.deque[RecordBatch | _Failure] = collections.deque()
        self._head = 0
        self._count = 0
        self._lock = threading.Lock()
        self._fetched_at = 0.0  # time.monotonic() of the last fetch (written by the worker)
        # Partitions assigned to this member: written on the worker thread (rebalance
        # callbacks), read by ack() on the loop, both under the lock.
        self._owned: set[Partition] = set()
        # Acked, not yet stored in librdkafka: partition -> offset to commit (last ack
        # wins, as with store_offsets). Filled by ack(), drained by the worker; the lock.
        self._acks: dict[Partition, int] = {}
        self._store_queued = False  # a _store_acks job is waiting for the worker
        # The client asked librdkafka to store offsets itself: stored as handed out.
        self._auto_store = False
        self._closing = False
        self._close_task: asyncio.Task[None] | None = None
        # Called once after close, e.g. for the engine to forget this consumer.
        self.on_closed: Callable[[KafkaConsumer], None] | None = None

    @classmethod
    async def open(
        cls,
        config: Mapping[str, str],
        topics: Sequence[str],
        stats: Stats,
        label: str,
        batch: int = BATCH,
    ) -> KafkaConsumer:
        """Create the librdkafka consumer off the loop and subscribe; ConsumerCreationError."""
        self = cls(stats, label, batch)
        job = self._executor.submit(self._open_blocking, dict(config), list(topics))
        try:
            await asyncio.wrap_future(job)
        except asyncio.CancelledError:
            # The creation may still finish: close what it made, on the same thread.
            self._closing = True
            self._executor.submit(self._close_blocking)
            self._executor.shutdown(wait=False)
            raise
        except Exception as exc:
            self._executor.shutdown(wait=False)  # the thread is idle: it exits at once
            raise ConsumerCreationError(creation_error_text(exc)) from exc
        self._log.info("Started working", topics=list(topics), config=redacted(config))
        return self

    def _open_blocking(self, config: dict[str, Any], topics: list[str]) -> None:
        config["on_commit"] = self._on_commit
        if str(config.get("enable.auto.offset.store", "true")).lower() in _TRUE:
            config["enable.auto.offset.store"] = "false"  # stored as handed out instead
            self._auto_store = True
        consumer = RdConsumer(config, logger=librdkafka_logger)
        try:
            consumer.subscribe(
                topics,
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_lost,
            )
        except BaseException:
            consumer.close()
            raise
        self._rd = consumer

    @property
    def buffered(self) -> int:
        """Records (and errors) fetched but not handed out yet."""
        with self._lock:
            return self._count

    @property
    def closed(self) -> bool:
        return self._closing

    async def next(self, timeout: float | None) -> Record | None:
        if self._closing:
            return None
        if time.monotonic() - self._fetched_at < REFRESH:
            item = self._take()
            if item is not None:
                return self._hand_out(item)  # the fast path: no thread hop
        if not await self._fetched(timeout):
            return None
        item = self._take()
        return None if item is None else self._hand_out(item)

    async def next_batch(self, limit: int, timeout: float | None) -> Sequence[Record]:
        """As the engine interface's, taking the batch at once after the fetch (the
        default takes one record, then the rest)."""
        ready = self.take_ready(limit)
        if ready or self._closing:
            return ready
        if not await self._fetched(timeout):
            return []
        return self._take_batch(limit)

    async def _fetched(self, timeout: float | None) -> bool:
        """Wait for the worker to fill the buffer (or the timeout); False when closing."""
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        abandon = threading.Event()
        job = self._executor.submit(self._fill, deadline, abandon)
        try:
            await asyncio.wrap_future(job)
        except asyncio.CancelledError:
            # The fetch in flight lands in the buffer: the next call hands it out.
            abandon.set()
            raise
        # Closing: what was fetched goes back to the group with the close.
        return not self._closing

    def next_ready(self) -> Record | None:
        if self._closing or time.monotonic() - self._fetched_at >= REFRESH:
            return None  # a stale buffer first serves pending rebalances (next())
        item = self._take()
        return None if item is None else self._hand_out(item)

    def take_ready(self, limit: int) -> Sequence[Record]:
        if self._closing or time.monotonic() - self._fetched_at >= REFRESH:
            return []  # a stale buffer first serves pending rebalances (next())
        return self._take_batch(limit)

    def _take_batch(self, limit: int) -> Sequence[Record]:
        """Up to `limit` buffered records, under one lock: a slice of the first segment
        when it holds them (no object per record). A failure is raised only when it
        comes first; otherwise it stays first in the buffer, for the next call."""
        failure: _Failure | None = None
        pieces: list[RecordBatch] = []
        taken = 0
        store = False
        with self._lock:
            buffer = self._buffer
            while buffer and taken < limit:
                segment = buffer[0]
                if isinstance(segment, _Failure):
                    if not taken:
                        failure = segment
                        buffer.popleft()
                        self._count -= 1
                    break
                head, size = self._head, len(segment)
                end = min(size, head + limit - taken)
                pieces.append(segment if head == 0 and end == size else segment[head:end])
                taken += end - head
                if end == size:
                    buffer.popleft()
                    self._head = 0
                else:
                    self._head = end
            self._count -= taken
            if self._auto_store and taken:
                # Under the lock a revoke takes to store what was handed out before it.
                last = {
                    (topic, partition): offset
                    for piece in pieces
                    for topic, partition, offset in zip(
                        piece.topics, piece.partitions, piece.offsets, strict=True
                    )
                }
                store = self._stage_stores(last)
        if store:
            self._executor.submit(self._store_acks)
        if failure is not None:
            raise ConsumeError(failure.text)
        if not taken:
            return []
        self._stats.incr(Stats.CONSUMED, taken)
        return pieces[0] if len(pieces) == 1 else RecordBatch.joined(pieces)

    def _take(self) -> Record | _Failure | None:
        with self._lock:
            if not self._buffer:
                return None
            segment = self._buffer[0]
            self._count -= 1
            if isinstance(segment, _Failure):
                self._buffer.popleft()
                return segment
            record = segment[self._head]
            self._head += 1
            if self._head == len(segment):
                self._buffer.popleft()
                self._head = 0
            if not self._auto_store:
                return record
            store = self._stage_stores({(record.topic, record.partition): record.offset})
        if store:
            self._executor.submit(self._store_acks)
        return record

    def _hand_out(self, item: Record | _Failure) -> Record:
        if isinstance(item, _Failure):
            raise ConsumeError(item.text)
        self._stats.incr(Stats.CONSUMED)
        return item

    def _fill(self, deadline: float | None, abandon: threading.Event) -> None:
        """Worker: fetch until the buffer is fresh and not empty, or the deadline,
        cancellation or close. A stale buffer gets one non-blocking fetch, which serves
        pending rebalance callbacks before anything is handed out."""
        while not (abandon.is_set() or self._closing):
            waiting = self.buffered
            if waiting and time.monotonic() - self._fetched_at < REFRESH:
                return  # e.g. the batch of a cancelled call
            wait = 0.0 if waiting else POLL_SLICE
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - time.monotonic()))
            self._store_acks()  # acks made during the last slice: stored before the next
            self._fetch(wait, max(1, self._batch - waiting))
            if self.buffered or (deadline is not None and time.monotonic() >= deadline):
                return

    def _fetch(self, wait: float, limit: int) -> None:
        """Worker: up to `limit` messages into the buffer, waiting up to `wait` for one.

        consume() alone would wait the whole timeout for a full batch: poll() waits for
        the first message only, then consume() takes what is already there.
        """
        assert self._rd is not None
        messages: list[Message] = []
        failure: _Failure | None = None
        try:
            first = self._rd.poll(wait)
            if first is not None:
                messages.append(first)
                if limit > 1:
                    messages.extend(self._rd.consume(num_messages=limit - 1, timeout=0))
        except KafkaException as exc:  # after what was already taken, which is kept
            failure = _Failure(error_text(exc))
        self._fetched_at = time.monotonic()
        segments: list[RecordBatch | _Failure] = []
        records = records_of(messages, self._owned) if messages else None
        if records is not None:
            segments.append(records)
        elif messages:  # one by one: errors, records of revoked partitions
            segments = self._segments(messages)
        if failure is not None:
            segments.append(failure)
        if segments:
            with self._lock:
                self._buffer.extend(segments)
                self._count += sum(
                    1 if isinstance(segment, _Failure) else len(segment) for segment in segments
                )

    def _segments(self, messages: list[Message]) -> list[RecordBatch | _Failure]:
        """Worker: `messages` as runs of records and failures at their place, message by
        message (what records_of() does not do)."""
        segments: list[RecordBatch | _Failure] = []
        run: list[Record] = []
        foreign = 0
        for message in messages:
            item = self._item(message)
            if isinstance(item, Record):
                if (item.topic, item.partition) in self._owned:
                    run.append(item)
                else:
                    # Taken by the same consume() call that revoked its partition: the new
                    # owner gets it from the committed offset, and an ack here would fail.
                    foreign += 1
            elif item is not None:
                if run:
                    segments.append(RecordBatch.of(run))
                    run = []
                segments.append(item)
        if run:
            segments.append(RecordBatch.of(run))
        if foreign:
            self._log.info("records of revoked partitions dropped", records=foreign)
        return segments

    def _item(self, message: Message) -> Record | _Failure | None:
        error = message.error()
        if error is not None:
            if error.code() in TRANSIENT:
                self._log.info("Poll: Transient error", error=error.str(), code=error.code())
                return None
            return _Failure(error.str())
        return record_of(message)

    def _on_assign(self, _: RdConsumer, partitions: list[TopicPartition]) -> None:
        """Runs on the worker thread; confluent-kafka assigns after it returns."""
        with self._lock:
            self._owned.update((p.topic, p.partition) for p in partitions)
        self._log.info(
            "partitions assigned", partitions=[f"{p.topic}:{p.partition}" for p in partitions]
        )

    def _on_revoke(self, _: RdConsumer, partitions: list[TopicPartition]) -> None:
        """Runs on the worker thread, inside a fetch or close(). Acks queued so far are
        stored first: librdkafka commits the stored offsets of the revoked partitions.
        They are taken in the same hold of the lock that disowns the partitions: a record
        handed out or acked between the two would have its offset stored after the
        revoke, refused (a commit error) and delivered again to the new owner."""
        gone = {(p.topic, p.partition) for p in partitions}
        with self._lock:
            acks = self._take_acks()
            dropped = self._disown(gone)
        self._store(acks)
        self._log_disowned(gone, "revoked", dropped)

    def _on_lost(self, _: RdConsumer, partitions: list[TopicPartition]) -> None:
        gone = {(p.topic, p.partition) for p in partitions}
        with self._lock:
            dropped = self._disown(gone)
        self._log_disowned(gone, "lost", dropped)

    def _disown(self, gone: set[Partition]) -> int:
        """Under the lock: forget the buffered records of partitions now someone else's
        (they would fail to ack, and the new owner gets them from the committed offset
        anyway); how many were dropped."""
        self._owned -= gone
        kept: list[RecordBatch | _Failure] = []
        for index, segment in enumerate(self._buffer):
            if isinstance(segment, _Failure):
                kept.append(segment)
                continue
            run = [
                record
                for record in segment[self._head if index == 0 else 0 :]
                if (record.topic, record.partition) not in gone
            ]
            if run:
                kept.append(RecordBatch.of(run))
        left = sum(1 if isinstance(segment, _Failure) else len(segment) for segment in kept)
        dropped = self._count - left
        self._buffer.clear()
        self._buffer.extend(kept)
        self._head = 0
        self._count = left
        return dropped

    def _log_disowned(self, gone: set[Partition], how: str, dropped: int) -> None:
        self._log.info(
            f"partitions {how}",
            partitions=sorted(f"{topic}:{partition}" for topic, partition in gone),
            buffered_records_dropped=dropped,
        )

    def ack(self, topic: str, partition: int, offset: int) -> None:
        """Queue `offset + 1` for the worker to store; never waits (see the module doc)."""
        # Checked on the loop thread, where close() starts: no ack is queued after the
        # close took the last ones.
        if self._closing or self._rd is None:
            raise AckError(CLOSED)
        try:  # the checks store_offsets makes of its arguments, made here
            TopicPartition(topic, partition, offset + 1)
        except (OverflowError, ValueError, TypeError) as exc:
            raise AckError(str(exc)) from None
        if self._auto_store:
            raise AckError(AUTO_STORED)
        with self._lock:
            if (topic, partition) not in self._owned:
                # Never or no longer this member's: librdkafka refuses it so (ERR__STATE).
                raise AckError(NOT_OWNED)
            self._acks[(topic, partition)] = offset + 1  # _stage_stores, inline: per ack
            queue = not self._store_queued
            self._store_queued = True
        if queue:  # runs at once when the worker is idle, after the fetch in flight if not
            self._executor.submit(self._store_acks)
        self._stats.incr(Stats.ACKED)

    def _stage_stores(self, offsets: Mapping[Partition, int]) -> bool:
        """Under the lock: `offset + 1` of each partition for the worker to store (the
        last wins); whether a `_store_acks` job must be submitted for them."""
        for partition, offset in offsets.items():
            self._acks[partition] = offset + 1
        if self._store_queued:
            return False
        self._store_queued = True
        return True

    def _store_acks(self) -> None:
        """Worker: hand the queued acks to librdkafka, which commits them (periodically,
        on revoke and on close)."""
        with self._lock:
            acks = self._take_acks()
        self._store(acks)

    def _take_acks(self) -> dict[Partition, int]:
        """Under the lock: the acks queued so far, for `_store`."""
        acks, self._acks = self._acks, {}
        self._store_queued = False
        return acks

    def _store(self, acks: dict[Partition, int]) -> None:
        """Worker: `acks` to librdkafka. An offset refused here belongs to a partition
        revoked since its ack: the new owner delivers the record again (at least once)."""
        if not acks or self._rd is None:
            return
        offsets = [TopicPartition(t, p, o) for (t, p), o in acks.items()]
        try:
            self._rd.store_offsets(offsets=offsets)
        except KafkaException as exc:
            self._stats.incr(Stats.COMMIT_ERRORS)
            self._log.warning(
                "acked offsets not stored",
                error=error_text(exc),
                offsets=[f"{t}:{p}:{o}" for (t, p), o in acks.items()],
            )

    def _on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """Runs on the worker thread, inside a fetch or close()."""
        if error is not None:
            if error.code() == KafkaError._NO_OFFSET:  # nothing was stored: not a failure
                return
            self._stats.incr(Stats.COMMIT_ERRORS)
            self._log.warning("offset commit failed", error=error.str())
            return
        committed = [p for p in partitions if p.error is None and p.offset >= 0]
        failed = [p for p in partitions if p.error is not None]
        if committed:
            self._stats.incr(Stats.COMMITTED, len(committed))
            self._log.info(
                "offsets committed",
                offsets=[f"{p.topic}:{p.partition}:{p.offset}" for p in committed],
            )
        if failed:
            self._stats.incr(Stats.COMMIT_ERRORS, len(failed))
            self._log.warning(
                "offset commit failed",
                errors=[f"{p.topic}:{p.partition}: {p.error}" for p in failed],
            )

    async def close(self) -> None:
        if self._close_task is None:
            self._closing = True  # in-flight fetches return within one slice
            self._close_task = asyncio.create_task(self._close())
        # Shielded: a cancelled caller must not leave the group half-left.
        await asyncio.shield(self._close_task)

    async def _close(self) -> None:
        try:
            await asyncio.wrap_future(self._executor.submit(self._close_blocking))
        finally:
            await asyncio.to_thread(self._executor.shutdown, True)
            if self.on_closed is not None:
                self.on_closed(self)

    def _close_blocking(self) -> None:
        if self._rd is None:
            return
        self._store_acks()  # the last acks, committed by the close below
        consumer, self._rd = self._rd, None
        try:
            consumer.close()  # commits the stored offsets and leaves the group
        except Exception as exc:
            self._log.warning("Error closing", error=str(exc))
        with self._lock:
            left = self._count
            self._buffer.clear()
            self._head = self._count = 0
        if left:  # never handed out, so never acked: the group delivers them again
            self._log.info("records returned to the group", records=left)
        self._log.info("Bye")
