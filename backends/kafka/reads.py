"""Reads by offset (LLEN, LRANGE) on Kafka: short-lived assign()-based consumers.

Each call creates a librdkafka consumer on a thread of the engine's small reader pool
(never on the event loop), assigns the one partition at a fixed offset, reads, and
closes it. It never subscribes, so it joins no group, and it never commits or stores an
offset: group positions cannot move. Its `group.id` ("rafka-reads") is only there
because confluent-kafka refuses a consumer without one.

Finding the next offset without trusting the reported high watermark: the ListOffsets
answer of Tansu (the broker of the tests) is the base offset of the partition's last
record batch plus one, too low whenever that batch holds several records. The high
watermark in Fetch responses is right. So the reader starts at most one record before
the reported high watermark (never past the true end, where Tansu answers nothing at
all, not even an end-of-partition) and reads up to the end-of-partition event
(`enable.partition.eof`), whose offset is the Fetch high watermark: the next offset. On
Apache Kafka that costs one record of reading; on Tansu, at most the last batch.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import (
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from backends.base import PartitionOffsets, ReadError, Record, UnknownPartitionError
from backends.kafka import topic_names
from backends.kafka.rdlog import librdkafka_logger
from backends.kafka.records import record_of
from backends.kafka.texts import creation_error_text, error_text

T = TypeVar("T")

READER_THREADS = 4  # concurrent reads; more wait their turn
POLL_SLICE = 0.1  # seconds per librdkafka wait: bounds the reaction to a cancelled read
STOPPED = "Engine stopped"
UNKNOWN = frozenset(
    {KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC, KafkaError.UNKNOWN_TOPIC_OR_PART}
)
# Over the engine's consumer configuration (bootstrap servers, security): what makes a
# reader a reader.
READER_SETTINGS = {
    "group.id": "rafka-reads",
    "enable.auto.commit": "false",
    "enable.auto.offset.store": "false",
    "enable.partition.eof": "true",
    # Below the first held offset (removed meanwhile by retention): an error, not a jump.
    "auto.offset.reset": "error",
    # At the end of a partition, the broker answers at once instead of waiting for data.
    "fetch.wait.max.ms": "10",
}


class Abandoned(Exception):
    """The caller went away (cancelled): the worker stops early."""


class KafkaReads:
    """The Kafka engine's reads by offset; `close()` once at the end."""

    def __init__(self, consumer_config: Mapping[str, str], timeout: float) -> None:
        """`timeout`: seconds one read may take (the engine's metadata timeout)."""
        self._config: dict[str, Any] = {**consumer_config, **READER_SETTINGS}
        for key in ("group.instance.id", "client.id"):
            self._config.pop(key, None)
        self._timeout = timeout
        self._executor = ThreadPoolExecutor(READER_THREADS, thread_name_prefix="rafka-kafka-read")
        self._closed = False

    async def partition_offsets(self, topic: str, partition: int) -> PartitionOffsets:
        def job(abandon: threading.Event) -> PartitionOffsets:
            with _Reader(self._config, topic, partition, self._deadline(), abandon) as reader:
                low, high = reader.watermarks()
                return PartitionOffsets(low, reader.next_offset(low, high))

        return await self._run(job)

    async def read(
        self, topic: str, partition: int, start: int, stop: int, limit: int
    ) -> list[Record]:
        if start < 0 or limit < 1:
            raise ValueError(f"read needs start >= 0 and limit >= 1, got {start}, {limit}")

        def job(abandon: threading.Event) -> list[Record]:
            with _Reader(self._config, topic, partition, self._deadline(), abandon) as reader:
                low, high = reader.watermarks()
                return reader.records(low, high, start, stop, limit)

        return await self._run(job)

    def _deadline(self) -> float:
        return time.monotonic() + self._timeout

    async def _run(self, job: Callable[[threading.Event], T]) -> T:
        if self._closed:
            raise ReadError(STOPPED)
        abandon = threading.Event()
        try:
            future = self._executor.submit(job, abandon)
        except RuntimeError:  # shut down meanwhile
            raise ReadError(STOPPED) from None
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            abandon.set()
            raise

    async def close(self) -> None:
        """Refuse new reads, wait for those running (each bounded by the timeout)."""
        self._closed = True
        await asyncio.to_thread(self._executor.shutdown, True, cancel_futures=True)


class _Reader:
    """One partition, one short-lived librdkafka consumer (on a reader thread)."""

    def __init__(
        self,
        config: Mapping[str, Any],
        topic: str,
        partition: int,
        deadline: float,
        abandon: threading.Event,
    ) -> None:
        self._topic, self._partition = topic, partition
        self._deadline, self._abandon = deadline, abandon
        try:
            self._rd = RdConsumer(dict(config), logger=librdkafka_logger)
        except Exception as exc:
            raise ReadError(creation_error_text(exc)) from None

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._rd.close()  # nothing stored, nothing committed, no group to leave

    def _where(self) -> str:
        return f"{self._topic}:{self._partition}"

    def _remaining(self) -> float:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise ReadError(f"timed out reading {self._where()}")
        return remaining

    def watermarks(self) -> tuple[int, int]:
        """(first held, reported high watermark); the latter may be too low (Tansu)."""
        # A name no broker can hold: a broker answers "Invalid topic", which librdkafka
        # retried until the read's bound, holding one of the reader threads.
        if not (0 <= self._partition < 2**31 and topic_names.is_legal(self._topic)):
            raise UnknownPartitionError(f"Unknown partition {self._where()}")
        tp = TopicPartition(self._topic, self._partition)
        try:
            low, high = self._rd.get_watermark_offsets(tp, timeout=self._remaining(), cached=False)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.code() in UNKNOWN:
                raise UnknownPartitionError(error_text(exc)) from None
            raise ReadError(error_text(exc)) from None
        return int(low), int(high)

    def next_offset(self, low: int, high: int) -> int:
        """The true next offset: read from the last reported record to the end."""
        following = self._assign(max(low, high - 1))
        while True:
            message = self._poll()
            if message is None:
                continue
            if message.error() is not None:  # the end of the partition
                end = message.offset()
                assert end is not None
                return max(end, following)
            offset = message.offset()
            assert offset is not None
            following = offset + 1

    def records(self, low: int, high: int, start: int, stop: int, limit: int) -> list[Record]:
        """Up to `limit` held records of start..stop, up to the end of the partition."""
        records: list[Record] = []
        if start > stop or stop < low:
            return records
        # Never past the true end: at most one record before the reported high watermark.
        self._assign(max(low, min(start, high - 1)))
        while True:
            message = self._poll()
            if message is None:
                continue
            if message.error() is not None:  # the end of the partition
                return records
            offset = message.offset()
            assert offset is not None
            if offset < start:
                continue
            if offset > stop:
                return records
            records.append(record_of(message))
            if len(records) >= limit or offset == stop:
                return records

    def _assign(self, position: int) -> int:
        self._rd.assign([TopicPartition(self._topic, self._partition, position)])
        return position

    def _poll(self) -> Message | None:
        """One message, None after a slice; an end-of-partition event is returned as a
        message whose error() is set; any other error raises."""
        if self._abandon.is_set():
            raise Abandoned
        message = self._rd.poll(min(POLL_SLICE, self._remaining()))
        if message is None:
            return None
        error = message.error()
        if error is None or error.code() == KafkaError._PARTITION_EOF:
            return message
        if error.code() in UNKNOWN:
            raise UnknownPartitionError(error.str())
        if error.code() == KafkaError._TRANSPORT:
            return None  # resolves itself, or the deadline says so
        raise ReadError(error.str())
