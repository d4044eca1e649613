"""One librdkafka producer per process, with per-session delivery accounting.

Rafka made one producer per connection; a single shared producer batches better and
costs one set of broker connections. Each session gets a `ProducerHandle` that counts
its own records through per-message delivery callbacks, so DUMP waits only for them.

The callbacks are served on the event loop's thread (`SharedProducer.serve`): at the
end of each loop pass that handed records to librdkafka in a batch, and by a timer,
every POLL_BUSY while librdkafka holds records and every POLL_IDLE otherwise (client
events). They only tally per handle; after each poll the batch is applied at once: each
handle's outstanding count and the Stats are updated once, and a handle's flush is woken
when its count reaches 0. A thread of our own that polled (as before) took the GIL for every few
reports and made the loop give it up: at 50 clients without pipelining, that thread cost
2.4-4.4 us per RPUSHX and the loop its thread switches (docs/gateway.md, "Delivery
reports on the loop").

Records go to librdkafka in one produce_batch() per topic and loop pass where it is sure
to take them (backends.kafka.pending), else one produce() each, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException, Message
from confluent_kafka import Producer as RdProducer

from backends.base import (
    ProduceError,
    Producer,
    ProducerCreationError,
    QueueFullError,
    Run,
    Stats,
)
from backends.kafka.pending import Pending
from backends.kafka.rdlog import librdkafka_logger
from backends.kafka.sticky import UNASSIGNED
from backends.kafka.texts import creation_error_text, error_text
from backends.settings import redacted

log = structlog.get_logger("rafka.kafka.producer")

QUEUE_FULL = str(KafkaError(KafkaError._QUEUE_FULL).str())  # "Local: Queue full"
# Seconds between two polls of the timer: while librdkafka holds records (their reports
# are due soon; a DUMP waits at most this long past its last report), and while it holds
# none (only client-level events can come).
POLL_BUSY = 0.001
POLL_IDLE = 0.1
# Failed deliveries logged one by one per poll; the rest of a burst (a broker down while
# records expire together) in one line: each line costs the event loop tens of us.
LOGGED_FAILURES = 10
CLOSED = "Producer closed"
NO_LOOP = "The producer must be created on a running event loop"
# Client-level events that are noise rather than trouble (Rafka 0.6.2, PR #90).
_IGNORED_EVENT = "Connection reset by peer"
_VALUE_PREVIEW = 64  # bytes of a failed record's value shown in the log
# What librdkafka's produce() raises for a refused record; RuntimeError: "Producer has
# been closed", for a handle that outlived the engine's stop().
_REFUSALS = (BufferError, KafkaException, TypeError, ValueError, RuntimeError)


class SharedProducer:
    """The process-wide librdkafka producer, its callbacks served on the event loop.

    Created on the loop's thread, which alone produces and polls until close()."""

    def __init__(self, config: Mapping[str, str], stats: Stats) -> None:
        self._stats = stats
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            raise ProducerCreationError(NO_LOOP) from None
        self._loop_thread = threading.get_ident()
        conf: dict[str, Any] = {**config, "error_cb": self._on_error, "logger": librdkafka_logger}
        try:
            self.rd = RdProducer(conf)
        except Exception as exc:  # librdkafka rejects names and values here
            raise ProducerCreationError(creation_error_text(exc)) from exc
        self.pending = Pending(self.rd, config, on_sent=self.handed_over)
        # Records of each handle settled (delivered or failed) since the last batch was
        # applied, and how many of them failed. Only the thread serving callbacks touches
        # them: the loop's, or close()'s once the loop polls no more.
        self.settled: dict[ProducerHandle, int] = {}
        self._failed = 0
        # Batches of settled records so far, and who waits for the next one (handles
        # refused with `Local: Queue full`): room in librdkafka's queue comes with them.
        self.generation = 0
        self._room_lock = threading.Lock()
        self._room_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        # Records enqueued by all handles: Stats.PRODUCED, counted by the producing thread
        # alone, without Stats' lock per record.
        self.produced = 0
        stats.count_in(Stats.PRODUCED, lambda: self.produced)
        self._closing = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_busy = False
        self._arm(POLL_IDLE)
        log.info("producer started", config=redacted(config))

    def serve(self) -> None:
        """Serve the callbacks due now and apply what they settled (on the loop)."""
        try:
            self.rd.poll(0)
        except Exception:  # a callback raised: the others are served at the next poll
            log.exception("producer poll failed")
        self._apply_settled()

    def handed_over(self) -> None:
        """Records just went to librdkafka: serve the reports due and poll often until
        librdkafka holds no more."""
        if self._closing:
            return
        if threading.get_ident() != self._loop_thread:  # polled on the loop's thread only
            self._loop.call_soon_threadsafe(self.handed_over)
            return
        self.serve()
        self.poll_soon()

    def poll_soon(self) -> None:
        """librdkafka holds records: poll every POLL_BUSY from now on."""
        if self._timer_busy or self._closing:
            return
        if threading.get_ident() != self._loop_thread:
            self._loop.call_soon_threadsafe(self.poll_soon)
            return
        self._arm(POLL_BUSY)

    def _arm(self, interval: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_busy = interval == POLL_BUSY
        self._timer = self._loop.call_later(interval, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self._timer_busy = False
        if self._closing:
            return
        try:
            self.serve()
        finally:  # whatever a callback did, the next poll comes
            self._arm(POLL_BUSY if len(self.rd) else POLL_IDLE)

    def note_failure(self, session_id: str, error: KafkaError, message: Message) -> None:
        """Count and log one failed delivery (on the thread serving callbacks); past
        LOGGED_FAILURES in one poll, only counted (_apply_settled logs how many)."""
        self._failed += 1
        if self._failed > LOGGED_FAILURES:
            return
        value = message.value() or b""
        log.warning(
            "Error delivering record",
            session=session_id,
            topic=message.topic(),
            value=value[:_VALUE_PREVIEW],
            error=error.str(),
        )

    def _apply_settled(self) -> int:
        """Apply the deliveries tallied since the last call: once per handle and counter.
        Returns how many records they were."""
        if not self.settled:
            return 0
        batch = list(self.settled.items())
        self.settled.clear()
        failed, self._failed = self._failed, 0
        if failed > LOGGED_FAILURES:
            log.warning("Error delivering records", more=failed - LOGGED_FAILURES)
        total = sum(count for _, count in batch)
        if total > failed:
            self._stats.incr(Stats.DELIVERED, total - failed)
        if failed:
            self._stats.incr(Stats.DELIVERY_ERRORS, failed)
        for handle, count in batch:
            handle.settle(count)
        with self._room_lock:
            self.generation += 1
            waiters, self._room_waiters = self._room_waiters, []
        for loop, future in waiters:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                loop.call_soon_threadsafe(_wake, future)
        return total

    async def wait_for_room(self, since: int, timeout: float) -> None:
        """Return once a batch settled after generation `since`, or after `timeout`."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._room_lock:
            if self.generation != since:
                return
            waiter = (loop, future)
            self._room_waiters.append(waiter)
        try:
            await asyncio.wait((future,), timeout=max(timeout, 0.0))
        finally:
            with self._room_lock:
                if waiter in self._room_waiters:
                    self._room_waiters.remove(waiter)

    def _on_error(self, error: KafkaError) -> None:
        text = error.str()
        if _IGNORED_EVENT in text:
            return
        self._stats.incr(Stats.UNKNOWN_EVENTS)
        log.warning("Error consuming delivery event: Unknown event type", error=text)

    async def close(self, timeout: float) -> int:
        """Stop polling on the loop, deliver what can be delivered within `timeout` (in a
        worker thread, which then serves the callbacks), close.

        Returns the number of records abandoned (purged) at the end.
        """
        self.pending.close()
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        return await asyncio.to_thread(self._close_blocking, timeout)

    def _close_blocking(self, timeout: float) -> int:
        left: int = self.rd.flush(max(timeout, 0.0))
        if left:
            # Fail what could not be delivered so that close() cannot hang on it;
            # the purge reports reach the handles as delivery errors.
            self.rd.purge(in_queue=True, in_flight=True)
            self.rd.flush(0)
            log.warning("Error flushing: unflushed events", unflushed=left)
        self._apply_settled()  # flush() served the last callbacks on this thread
        self.rd.close()
        log.info("producer closed")
        return left


class ProducerHandle(Producer):
    """One session's view of the shared producer: its own outstanding count.

    No lock on the hot path: the event loop's thread, the only one that produces, alone
    writes `_produced` (and the shared producer's count for Stats.PRODUCED); the thread
    serving callbacks (the loop's, or close()'s worker at the end) alone adds to
    `_settled`, under `_lock`. Outstanding is their difference. Records are counted as
    produced before librdkafka has them, so `_settled` never passes `_produced`. The
    lock also guards the waiters, so a flush cannot miss the wake-up of its last record.
    """

    def __init__(self, shared: SharedProducer, stats: Stats, session_id: str) -> None:
        self._shared = shared
        self._stats = stats
        self._session_id = session_id
        self._lock = threading.Lock()
        self._produced = 0  # written by the producing thread only
        self._settled = 0  # written under _lock only
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._closed = False
        # Looked up once, not per record: one bound method serves every record.
        self._rd_produce = shared.rd.produce
        self._settled_batch = shared.settled
        self._delivery_cb = self._on_delivery
        self._learning_cb = self._on_delivery_learning
        self._pending = shared.pending
        self._known = shared.pending.known
        self._refused_at = 0  # the shared producer's generation at the last Queue full

    def produce(self, topic: str, key: bytes | None, value: bytes) -> None:
        if self._closed:
            raise ProduceError(CLOSED)
        shared = self._shared
        pending = self._pending
        size = len(value) if key is None else len(value) + len(key)
        self._produced += 1  # first: a refusal below takes it back
        if (
            topic in self._known
            and size <= pending.max_size
            and pending.take(topic, key, value, size, self._delivery_cb)
        ):
            shared.produced += 1
            return
        pending.send()  # the records accepted before this one go first
        pending.saw(1, size)
        refused_at = shared.generation
        on_delivery = self._delivery_cb if topic in self._known else self._learning_cb
        try:
            # Positional (topic, value, key, partition, on_delivery): no keyword matching.
            self._rd_produce(topic, value, key, UNASSIGNED, on_delivery)
        except _REFUSALS as exc:
            self._unproduce(1)
            self._refused_at = refused_at
            raise _refusal(exc, 0) from None
        shared.produced += 1
        shared.poll_soon()

    def produce_many(self, topic: str, key: bytes | None, values: Sequence[bytes]) -> int:
        """As produce() for each value, in order, with one count per call."""
        if self._closed:
            raise ProduceError(CLOSED)
        count = len(values)
        if not count:
            return 0
        # Deferred, all of them, when librdkafka surely takes them all; else all go
        # alone, and the one refused says how many went in.
        if self.produce_grouped(((topic, key, values),)):
            return count
        # All first: a refusal below takes back the ones not enqueued.
        self._produced += count
        pending = self._pending
        pending.send()  # the records accepted before these go first
        pending.saw(count, max(map(len, values)) + (0 if key is None else len(key)))
        rd_produce = self._rd_produce
        on_delivery = self._delivery_cb if topic in self._known else self._learning_cb
        enqueued = 0
        refused_at = self._shared.generation
        try:
            for enqueued in range(count):  # `enqueued` is read on refusal
                rd_produce(topic, values[enqueued], key, UNASSIGNED, on_delivery)
        except _REFUSALS as exc:
            # `enqueued` is the refused record's index: the ones before it stay queued.
            self._unproduce(count - enqueued)
            self._shared.produced += enqueued
            self._shared.poll_soon()
            self._refused_at = refused_at
            raise _refusal(exc, enqueued) from None
        self._shared.produced += count
        self._shared.poll_soon()
        return count

    def produce_grouped(self, runs: Sequence[Run]) -> bool:
        # A pipeline round-robin over many topics (or one run: produce_many): every run
        # deferred at once when librdkafka surely takes them all, instead of one
        # produce() per value in order; a value of a topic not known yet, or too large,
        # may be refused at produce() time: declined, the caller then produces them in
        # order.
        if self._closed:
            return False
        known = self._known
        count = size = largest = 0
        for topic, key, values in runs:
            if topic not in known:
                return False
            extra = 0 if key is None else len(key)
            count += len(values)
            size += sum(map(len, values)) + extra * len(values)
            largest = max(largest, max(map(len, values), default=0) + extra)
        pending = self._pending
        if largest > pending.max_size or not pending.reserve(count, size, largest):
            return False
        self._produced += count
        defer, on_delivery = pending.defer, self._delivery_cb
        for topic, key, values in runs:
            defer(topic, key, values, on_delivery)
        self._shared.produced += count
        return True

    def _unproduce(self, count: int) -> None:
        """`count` records counted as produced were refused: not outstanding after all."""
        with self._lock:
            self._produced -= count
            self._wake_if_done()

    def settle(self, count: int) -> None:
        """`count` records are no longer outstanding (delivered or failed); called by the
        thread serving callbacks."""
        with self._lock:
            self._settled += count
            self._wake_if_done()

    def _wake_if_done(self) -> None:
        """Under _lock: wake the flushes once nothing is outstanding."""
        if self._produced != self._settled or not self._waiters:
            return
        waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            # RuntimeError: that loop is closed, so nobody is waiting any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_wake, future)

    async def wait_for_room(self, timeout: float) -> None:
        self._pending.send()
        await self._shared.wait_for_room(self._refused_at, timeout)

    def outstanding(self) -> int:
        # _settled is read second: it may only have grown since _produced was read.
        return self._produced - self._settled

    def _on_delivery(self, error: KafkaError | None, message: Message) -> None:
        """Runs on the thread serving callbacks, once per record: only tallies."""
        settled = self._settled_batch
        settled[self] = settled.get(self, 0) + 1
        if error is not None:
            self._shared.note_failure(self._session_id, error, message)

    def _on_delivery_learning(self, error: KafkaError | None, message: Message) -> None:
        """_on_delivery for a topic not known yet: a delivered record makes it known, so
        that its next records may be batched (backends.kafka.pending)."""
        self._on_delivery(error, message)
        if error is None:
            topic = message.topic()
            if topic is not None:
                self._known.add(topic)

    def note_refused(self, error: str, topic: str, value: bytes) -> None:
        """A deferred record librdkafka refused (on the loop's thread): a delivery error."""
        self._stats.incr(Stats.DELIVERY_ERRORS)
        log.warning(
            "Error delivering record",
            session=self._session_id,
            topic=topic,
            value=value[:_VALUE_PREVIEW],
            error=error,
        )

    async def flush(self, timeout: float) -> int:
        self._pending.send()  # now rather than at the next pass: they leave sooner
        if timeout <= 0:
            return self.outstanding()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._produced == self._settled:
                return 0
            waiter = (loop, future)
            self._waiters.append(waiter)
        try:
            await asyncio.wait((future,), timeout=timeout)
        finally:
            with self._lock:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        return self.outstanding()

    async def close(self, timeout: float) -> int:
        if self._closed:
            return 0
        self._closed = True
        left = await self.flush(timeout)
        if left:
            self._stats.incr(Stats.UNFLUSHED, left)
            log.warning("unflushed records at producer close", session=self._session_id, left=left)
        return left


def _refusal(exc: Exception, enqueued: int) -> ProduceError:
    """The ProduceError for what librdkafka's produce() raised, after `enqueued` values."""
    if isinstance(exc, BufferError):
        return QueueFullError(QUEUE_FULL, enqueued)
    if isinstance(exc, KafkaException):
        return ProduceError(error_text(exc), enqueued)
    return ProduceError(str(exc), enqueued)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
