"""One librdkafka consumer per session, driven from a thread of its own.

Every blocking librdkafka call of a consumer (creation, poll, close) runs on the
consumer's single worker thread: hundreds of sessions blocked in BLPOP must not starve
one another in a shared pool, and poll and close are serialised for free (Rafka's
per-consumer lock, #77). Only the non-blocking `store_offsets` runs on the event loop.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future as ThreadFuture
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog
from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka import Consumer as RdConsumer

from backends.base import AckError, ConsumeError, Consumer, ConsumerCreationError, Record, Stats
from backends.kafka.texts import creation_error_text, error_text, redacted

log = structlog.get_logger("rafka.kafka.consumer")

POLL_SLICE = 0.1  # seconds per librdkafka poll, as in Rafka: bounds the reaction to close
CLOSED = "Consumer closed"
# Errors that resolve themselves or are plain information (spec §4.5, §15.2).
TRANSIENT = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._PARTITION_EOF,
    }
)


class KafkaConsumer(Consumer):
    """A consumer-group member; build it with `await KafkaConsumer.open(...)`."""

    def __init__(self, stats: Stats, label: str) -> None:
        self._stats = stats
        self._log = log.bind(consumer=label)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"rafka-consumer-{label}")
        self._rd: RdConsumer | None = None
        # Records a cancelled next() received; handed out first by the next call.
        self._pending: collections.deque[Record] = collections.deque()
        self._closing = False
        self._close_task: asyncio.Task[None] | None = None
        # Called once after close, e.g. for the engine to forget this consumer.
        self.on_closed: Callable[[KafkaConsumer], None] | None = None

    @classmethod
    async def open(
        cls, config: Mapping[str, str], topics: Sequence[str], stats: Stats, label: str
    ) -> KafkaConsumer:
        """Create the librdkafka consumer off the loop and subscribe; ConsumerCreationError."""
        self = cls(stats, label)
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
        consumer = RdConsumer(config)
        try:
            consumer.subscribe(topics)
        except BaseException:
            consumer.close()
            raise
        self._rd = consumer

    async def next(self, timeout: float | None) -> Record | None:
        if self._closing:
            return None
        if self._pending:
            return self._pending.popleft()
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        abandon = threading.Event()
        job = self._executor.submit(self._poll_until, deadline, abandon)
        try:
            return await asyncio.wrap_future(job)
        except asyncio.CancelledError:
            # The poll in flight may still return a record: keep it for the next call.
            abandon.set()
            job.add_done_callback(self._keep_orphan)
            raise

    def _keep_orphan(self, job: ThreadFuture[Record | None]) -> None:
        if job.cancelled():
            return
        exc = job.exception()
        if exc is not None:
            self._log.warning("poll of a cancelled BLPOP failed", error=str(exc))
            return
        record = job.result()
        if record is not None:
            self._log.info("kept the record of a cancelled poll", offset=record.offset)
            self._pending.append(record)

    def _poll_until(self, deadline: float | None, abandon: threading.Event) -> Record | None:
        """Poll in slices until a record, the deadline, cancellation or close."""
        if self._pending:  # left by a cancelled poll that ran just before this one
            return self._pending.popleft()
        assert self._rd is not None
        while True:
            wait = POLL_SLICE
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - time.monotonic()))
            message = self._rd.poll(wait)
            if message is not None:
                record = self._record(message)
                if record is not None:
                    return record
            if abandon.is_set() or self._closing:
                return None
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def _record(self, message: Message) -> Record | None:
        error = message.error()
        if error is not None:
            if error.code() in TRANSIENT:
                self._log.info("Poll: Transient error", error=error.str(), code=error.code())
                return None
            raise ConsumeError(error.str())
        self._stats.incr(Stats.CONSUMED)
        kind, stamp = message.timestamp()
        topic, partition, offset = message.topic(), message.partition(), message.offset()
        assert topic is not None and partition is not None and offset is not None
        return Record(
            topic=topic,
            partition=partition,
            offset=offset,
            key=message.key(),
            value=message.value(),
            timestamp_ms=None if kind == TIMESTAMP_NOT_AVAILABLE else stamp,
        )

    def ack(self, topic: str, partition: int, offset: int) -> None:
        # Checked on the loop thread, where close() starts: no store can race the
        # consumer's destruction on the worker thread.
        if self._closing or self._rd is None:
            raise AckError(CLOSED)
        try:
            self._rd.store_offsets(offsets=[TopicPartition(topic, partition, offset + 1)])
        except KafkaException as exc:
            raise AckError(error_text(exc)) from None
        except (OverflowError, ValueError, TypeError, RuntimeError) as exc:
            raise AckError(str(exc)) from None
        self._stats.incr(Stats.ACKED)

    def _on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """Runs on the worker thread, inside poll() or close()."""
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
            self._closing = True  # in-flight polls return within one slice
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
        consumer, self._rd = self._rd, None
        if consumer is None:
            return
        try:
            consumer.close()  # commits the stored offsets and leaves the group
        except Exception as exc:
            self._log.warning("Error closing", error=str(exc))
        if self._pending:  # never acked, so the group will deliver them again
            self._log.info("records returned to the group", records=len(self._pending))
            self._pending.clear()
        self._log.info("Bye")
