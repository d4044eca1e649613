"""The gateway's producing side on Dafka: one partition writer per (topic, number), shared
by every session, with per-session durability accounting for DUMP.

A writer is a partition with the partition's stable address (`partitions.py`) that starts
at the stores' head + 1, so a restarted gateway never reuses an offset. All of a gateway's
writers are partitions of one `publisher.Publisher` (`WriterNode`): one thread, one data
socket and one beacon however many partitions it writes, where a Dafka producer per
partition cost a thread, four sockets and their connections, and a beacon that the tower
sent to every node (N² messages per interval). A writer starts at the head the observer
knows the stores hold. While the actor runs, a writer opens at once, on the loop; the first
one (and the first after the actor died) opens off the loop, as it makes the actor, which
waits for the tower: records produced meanwhile wait in the writer, in order, and are
counted as outstanding like every other record. Between the event loop and the actor's
thread things pass in batches (`Handover`): the records every writer got in one pass of the
loop, in one hand-over at its end; the ACKs of many partitions, in one callback on the loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import structlog

from backends.base import ProduceError, Producer, QueueFullError, Run, Stats
from backends.dafka.config import Config
from backends.dafka.envelope import MAGIC, wrap
from backends.dafka.partitions import is_own_address, own_address, publisher_address
from backends.dafka.publisher import Partition, Publisher

if TYPE_CHECKING:
    from backends.dafka.engine_view import ProducingEngine as DafkaEngine

log = structlog.get_logger(__name__)

QUEUE_FULL = "Local: Queue full"
INTERNAL_PREFIX = "__rafka"
INVALID_TOPIC = "Broker: Invalid topic"
STOPPED = "Engine stopped"
CONFLICT = (
    "Local: Partition conflict: the stores hold offset {held} of {topic} partition {number}, "
    "which this gateway did not write (another gateway with the same dafka.node?)"
)
# A session drops the ranges of its positions that are durable once it holds this many
# (or twice what it kept after the last time, or four per writer: `_forget_all`).
FORGET_AT_LEAST = 1024
ASK_INTERVAL = 0.02  # seconds between two questions to the stores during a DUMP (acks: all)


class WriterNode:
    """The `Publisher` every partition writer of a gateway is a partition of: made by the
    first writer that needs it, made again by the next one after it failed (its writers
    fail with it; the engine replaces a failed writer at its next record)."""

    def __init__(
        self,
        config: Callable[[], Config],
        ignore_peers: Callable[[str], bool] = is_own_address,
        on_stopped: Callable[[], None] | None = None,
    ) -> None:
        """`ignore_peers(address)`: the nodes the actor does not connect to, none of
        which sends ACK or FETCH (by default other gateways' writers). `on_stopped()`:
        on an actor's thread once it stopped (see `Publisher`)."""
        self._config = config
        self._ignore_peers = ignore_peers
        self._on_stopped = on_stopped
        self._lock = threading.Lock()
        self._publisher: Publisher | None = None
        self._closed = False
        self._addresses: set[str] = set()  # of every actor made, before it started
        # Every actor made, until newly_stopped reports it (appended under the lock by
        # get(), any thread; removed by newly_stopped, the loop's thread: each is atomic).
        self._unreported: list[Publisher] = []

    def running(self) -> Publisher | None:
        """The actor if one runs and takes partitions now, without waiting (the loop's
        thread); None when the next writer must make one with `get()`, off the loop. A
        stale answer is harmless: opening a partition on an actor that just died raises
        RuntimeError, and the writer then opens off the loop as a first one does."""
        publisher = self._publisher
        if publisher is None or self._closed or not publisher.usable:
            return None
        return publisher

    def get(self) -> Publisher:
        """Blocking (the first call waits for the tower); any thread."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the gateway's Dafka writers are closed")
            publisher = self._publisher
            if publisher is None or not publisher.usable:
                if publisher is not None:
                    publisher.close(0)
                # Marked as a gateway's: the other gateways' writers do not connect to it.
                address = publisher_address()
                self._addresses.add(address)
                publisher = self._publisher = Publisher(
                    self._config(),
                    address=address,
                    ignore_peers=self._ignore_peers,
                    on_stopped=self._on_stopped,
                )
                self._unreported.append(publisher)
            return publisher

    def newly_stopped(self) -> set[Publisher]:
        """The actors made here that stopped (died, or were closed) since the last call;
        the loop's thread only."""
        stopped = {actor for actor in list(self._unreported) if not actor.usable}
        for actor in stopped:
            self._unreported.remove(actor)
        return stopped

    def made(self, address: str) -> bool:
        """Whether `address` is one of the actors made here, running or not (any thread:
        known before the actor's beacon is heard)."""
        return address in self._addresses

    def close(self, timeout: float) -> int:
        """Blocking: wait up to `timeout` for ACKs, stop; the records left unacknowledged.
        Hand the writers' pending records over first (`publish_pending()`)."""
        with self._lock:
            self._closed = True
            publisher, self._publisher = self._publisher, None
        return 0 if publisher is None else publisher.close(timeout)


class Handover:
    """What passes between the partition writers (event loop) and their `Publisher`
    thread, in batches.

    Records: a writer that gets records in a pass of the event loop enlists here; at the
    end of the pass all of them go to the actor in one `publish_batch()` (one lock, at
    most one wake-up of its thread), where a hand-over per writer cost a callback, a lock
    and a race with the woken actor for each of up to 1,000 topics a pipeline touched.

    ACKs: the actor reports each partition whose ACKs released records, once per pass of
    its own; the reports wait here, and one `call_soon_threadsafe` (a write to the loop's
    self-pipe) delivers all that came until the loop runs it, instead of one per
    partition, and the observer's note of what the stores hold (one lock) and `progress`
    (wake the DUMPs waiting) run once for all of them.

    Counts: the records clients produced and those acknowledged, in plain ints of the
    loop's (`Stats.count_in`), not with the lock of `Stats.incr()` per RPUSHX and ACK.
    """

    def __init__(
        self,
        progress: Callable[[], None],
        stats: Stats,
        handed: Callable[[], None],
        note_stored: Callable[[list[tuple[str, str, int]]], None],
        published: Callable[[list[tuple[str, str, int, list[bytes]]]], None],
    ) -> None:
        """`handed()`: runs after each hand-over (the engine tells its reader what its
        groups took in process meanwhile: `DafkaEngine.send_took`).
        `note_stored([(topic, address, head), ...])`: the stores hold these partitions
        up to `head` (the observer's `note_stored_many`: one lock for all the writers
        one delivery of ACKs moved).
        `published([(topic, address, first, records), ...])`: writers' records are the
        actor's, each writer's from sequence `first` on: this gateway's groups may take
        them now (in process: docs/dafka-engine.md, "Latency"; `DafkaEngine.published`),
        told of a whole hand-over in one call."""
        self._progress = progress
        self._published = published
        self._handed = handed
        self._note_stored = note_stored
        self.produced = 0  # Stats.PRODUCED
        self.delivered = 0  # Stats.DELIVERED
        # Records of the clients' writers not acknowledged yet, all partitions together:
        # what `queue_max_messages` bounds (as librdkafka's queue.buffering.max.messages
        # bounds a producer's). Per partition, 1,000 topics of 4 partitions let the
        # gateway hold 400 million records before a client waited.
        self.unacked = 0
        # Loop passes that produced or looked a writer up (`pass_number`), counted at
        # their end, where the pass's records are handed over (`_end_of_pass`).
        self._pass = 0
        self._end_scheduled = False
        stats.count_in(Stats.PRODUCED, lambda: self.produced)
        stats.count_in(Stats.DELIVERED, lambda: self.delivered)
        self._writers: list[PartitionWriter] = []  # loop thread only
        self._acks: list[tuple[PartitionWriter, int]] = []  # under _acks_lock
        self._acks_lock = threading.Lock()

    def pass_number(self) -> int:
        """Loop thread: a number that changes once the loop pass under way ends."""
        if not self._end_scheduled:
            self._end_scheduled = True
            asyncio.get_running_loop().call_soon(self._end_of_pass)
        return self._pass

    def enlist(self, writer: PartitionWriter) -> None:
        """Loop thread: `writer` got the first pending records of this pass."""
        if not self._end_scheduled:
            self._end_scheduled = True
            writer.loop.call_soon(self._end_of_pass)
        self._writers.append(writer)

    def _end_of_pass(self) -> None:
        """One callback per pass for both: the pass is counted, its records handed over."""
        self._end_scheduled = False
        self._pass += 1
        if self._writers:
            self.hand_over()

    def hand_over(self) -> None:
        """Loop thread, at the end of a pass: every enlisted writer's pending records to
        its actor, one hand-over per actor. (There is one, unless writers of an actor that
        failed are enlisted beside writers of its replacement: a failed actor's writers
        fail, the others' records go out.)"""
        writers, self._writers = self._writers, []
        batches: dict[Publisher, list[tuple[Partition, list[bytes]]]] = {}
        writers_of: dict[Publisher, list[PartitionWriter]] = {}
        # Per writer, as little as can be: a pass over 1,000 topics enlists 1,000 writers
        # of one record each. The lists of the actor of the writer before are reused.
        owner: Publisher | None = None
        batch: list[tuple[Partition, list[bytes]]] = []
        mine: list[PartitionWriter] = []
        for writer in writers:
            partition, pending = writer.take_pending()
            if partition is not None and pending:
                if partition.owner is not owner:
                    owner = partition.owner
                    batch = batches.setdefault(owner, [])
                    mine = writers_of.setdefault(owner, [])
                batch.append((partition, pending))
                mine.append(writer)
        published = self._published
        for publisher, batch in batches.items():
            try:
                firsts = publisher.publish_batch(batch)
            except RuntimeError as error:  # the actor is gone: these records never go out
                for writer in writers_of[publisher]:
                    writer.fail(error)
                continue
            handed = zip(writers_of[publisher], firsts, batch, strict=True)
            published([(w.topic, w.address, first, records) for w, first, (_, records) in handed])
        self._handed()

    def ack_thread(self, writer: PartitionWriter, last_acked: int) -> None:
        """The actor's thread: a store acknowledged `writer`'s records up to
        `last_acked`."""
        with self._acks_lock:
            first = not self._acks
            self._acks.append((writer, last_acked))
        if first:
            writer.loop.call_soon_threadsafe(self._deliver_acks)

    def _deliver_acks(self) -> None:
        """Loop thread: the ACKs reported since the last call, in the order they came."""
        with self._acks_lock:
            acks, self._acks = self._acks, []
        stored: list[tuple[str, str, int]] = []
        for writer, last_acked in acks:
            if writer.on_ack(last_acked):
                stored.append((writer.topic, writer.address, last_acked))
        if stored:
            # Known as stored (`committable`, commits) before the DUMPs are woken.
            self._note_stored(stored)
            self._progress()


class PartitionWriter:
    """Positions count this writer's records in this run: 0, 1, ... in produce order."""

    def __init__(self, engine: DafkaEngine, topic: str, number: int) -> None:
        self.topic = topic
        self.number = number
        self.address = own_address(topic, number)
        # Commits and the topic catalog are counted as such, not as records clients
        # produced (producer.delivered.messages, producer.delivery.errors).
        self.internal = topic.startswith(INTERNAL_PREFIX)
        self._engine = engine
        self._handover: Handover = engine.handover
        self.loop = asyncio.get_running_loop()
        self._producer: Partition | None = None
        self._first_sequence = 0
        self._waiting: list[bytes] = []  # produced before the actor existed
        # Submitted during this pass of the event loop: handed to the actor with every
        # other writer's at the end of the pass (`Handover`).
        self._pending: list[bytes] = []
        self.submitted = 0
        self.acked = 0  # positions below are held by a store
        self.failed: str | None = None
        # False once the stores showed another writer of this partition: a new writer
        # would conflict the same way (and the address stays open on the Publisher).
        self.replaceable = True
        # Once the actor runs, a writer opens at once, on the loop: asking the observer
        # and the actor costs two uncontended locks, where a thread hop per writer cost
        # an executor job, a future and a wake-up of the loop each (4,000 writers opened
        # within one produce burst over 1,000 topics of 4 partitions).
        self.ready: asyncio.Future[None] = self.loop.create_future()
        publisher = engine.running_publisher()
        refreshing = engine.heads_refreshing()
        if publisher is not None and refreshing is None:
            # Refused (the actor died just now, ...): off the loop as a first writer, which
            # makes a new actor or fails the writer the way a writer fails.
            with contextlib.suppress(Exception):
                self._producer = self._open(publisher)
        if self._producer is None:
            self.ready = self.loop.create_task(self._start(refreshing))
        else:
            self.ready.set_result(None)

    def submit(self, values: Sequence[bytes]) -> int:
        """Queue `values`; returns the position after the last one. Past
        `queue_max_messages` records not yet acked (the clients' writers all together;
        the gateway's own, each), queues those that fit and raises QueueFullError saying
        how many."""
        if self.failed is not None:
            raise ProduceError(self.failed)
        # The gateway's commits and catalog records have a queue of their own per
        # partition: clients filling theirs must not hold them back.
        held = self.submitted - self.acked if self.internal else self._handover.unacked
        room = self._engine.settings.queue_max_messages - held
        full = room < len(values)
        if full and not self.internal and self._engine.fail_stranded_writers():
            if self.failed is not None:  # this one's actor died: room, but no way out
                raise ProduceError(self.failed)
            room = self._engine.settings.queue_max_messages - self._handover.unacked
            full = room < len(values)
        if full:
            values = values[: max(room, 0)]
        if values:
            self.queue(values)
            if not self.internal:
                self._handover.unacked += len(values)
        if full:
            raise QueueFullError(QUEUE_FULL, len(values))
        return self.submitted

    def queue(self, values: Sequence[bytes]) -> int:
        """`submit()` once its checks passed: the caller made sure that this writer has
        not failed and that the queue has room, and counts `values` in
        `Handover.unacked` (a client's writer) itself; the position after the last one."""
        if self._producer is None:
            self._waiting.extend(values)
        else:
            if not self._pending:
                self._handover.enlist(self)
            self._pending.extend(values)
        self.submitted += len(values)
        return self.submitted

    def fail_if_on(self, dead: set[Publisher]) -> None:
        """Fail now if this writer's partition is on one of these dead actors: its records
        not acknowledged never will be (it would fail only at its next record)."""
        if self.failed is None and self.publisher in dead:
            self.fail(RuntimeError("the Dafka writers' actor stopped"))

    def _set_failed(self, text: str) -> None:
        """This writer fails with `text` (once): its records not acknowledged never will
        be, and no longer take room in the gateway's queue."""
        self.failed = text
        if not self.internal:
            self._handover.unacked -= self.submitted - self.acked

    async def _start(self, refreshing: asyncio.Task[None] | None) -> None:
        engine = self._engine
        if refreshing is not None:  # the stores' heads first: see DafkaEngine.refresh_heads
            await asyncio.wait([refreshing])
        try:
            self._producer = await asyncio.to_thread(lambda: self._open(engine.publisher()))
        except Exception as error:
            self._set_failed(f"Local: Transport failure: {error}")
            log.error("cannot start partition writer", topic=self.topic, error=str(error))
            if not self.internal:
                engine.stats.incr(Stats.DELIVERY_ERRORS, len(self._waiting))
            self._waiting = []
            engine.progress()
            return
        # What came while the writer started goes out the way a pass's records do, so an
        # actor that died meanwhile counts them as delivery errors there.
        self._pending, self._waiting = self._waiting, []
        self.publish_pending()

    @property
    def publisher(self) -> Publisher | None:
        """The actor this writer's partition is open on (None until it is)."""
        return None if self._producer is None else self._producer.owner

    def take_pending(self) -> tuple[Partition | None, list[bytes]]:
        """Loop thread: the actor's partition and the records submitted since the last
        hand-over, taken (none before the partition is open: they wait in `_waiting`)."""
        if self._producer is None:
            return None, []
        pending, self._pending = self._pending, []
        return self._producer, pending

    def publish_pending(self) -> None:
        """Hand this writer's pending records to the actor now, alone (loop thread)."""
        partition, pending = self.take_pending()
        if partition is None or not pending:
            return
        try:
            first = partition.publish_many(pending)
        except RuntimeError as error:
            self.fail(error)
            return
        # Its records are the actor's: this gateway's groups may take them now.
        self._engine.published([(self.topic, self.address, first, pending)])

    def fail(self, error: Exception) -> None:
        """The actor is gone: the records no store acknowledged never will be, those
        handed to it before as well as those it refused now (loop thread)."""
        if self.failed is not None:
            return  # failed already (a conflict): counted then
        self._engine.refresh_heads()  # before its replacement opens
        lost = self.submitted - self.acked
        self._set_failed(f"Local: Transport failure: {error}")
        log.error("partition writer failed", topic=self.topic, error=str(error))
        if not self.internal:
            self._engine.stats.incr(Stats.DELIVERY_ERRORS, lost)
        self._engine.writer_failed(self.topic, self.address)
        self._engine.progress()

    def _open(self, publisher: Publisher) -> Partition:
        """Open this writer's partition on `publisher` where the stores stopped."""
        engine = self._engine
        head = engine.observer.stored_head(self.topic, self.address)
        published = engine.observer.heads(self.topic).get(self.address, -1)
        if head is None:
            head = -1
        if published > head:
            log.warning(
                "partition has published records no store holds; another gateway with the "
                "same dafka.node, or records lost in a crash",
                topic=self.topic,
                partition=self.number,
                stored=head,
                published=published,
            )
        self._first_sequence = head + 1
        return publisher.open(
            self.topic,
            address=self.address,
            first_sequence=head + 1,
            on_ack=self._on_ack_thread,
            on_conflict=self._on_conflict_thread,
        )

    def _on_ack_thread(self, last_acked: int) -> None:
        self._handover.ack_thread(self, last_acked)

    def _on_conflict_thread(self, held: int) -> None:
        self.loop.call_soon_threadsafe(self._on_conflict, held)

    def _on_conflict(self, held: int) -> None:
        """A store holds offset `held`, beyond every record this writer sent: its ACKs no
        longer tell our records from another writer's, so none of what is not acked yet
        counts as durable, and the partition refuses records from now on."""
        self._engine.observer.note_stored(self.topic, self.address, held)
        if self.failed is not None:
            return
        self._set_failed(CONFLICT.format(held=held, topic=self.topic, number=self.number))
        self.replaceable = False
        log.error("partition writer conflict", topic=self.topic, partition=self.number, held=held)
        if not self.internal:
            self._engine.stats.incr(Stats.DELIVERY_ERRORS, self.submitted - self.acked)
        self._engine.writer_failed(self.topic, self.address)
        self._engine.progress()

    def durable(self) -> int:
        """Positions below this one count as durable for DUMP: held by a store, or with
        `acks: all` by every store the tower knows (asked afresh: stores come and go)."""
        if self._engine.settings.acks != "all":
            return self.acked
        held = self._engine.observer.held_by_all(self.topic, self.address)
        return max(0, min(held - self._first_sequence + 1, self.acked))

    def on_ack(self, last_acked: int) -> bool:
        """Loop thread: a store holds this writer's records up to sequence `last_acked`;
        whether that acknowledged any record not acknowledged before (the caller then
        tells the observer, and wakes the DUMPs waiting: `Handover._deliver_acks`)."""
        acked = last_acked - self._first_sequence + 1
        if acked <= self.acked or not self.replaceable:
            return False
        if not self.internal:
            self._handover.delivered += acked - self.acked
            if self.failed is None:  # else given up already
                self._handover.unacked -= acked - self.acked
        self.acked = acked
        return True


def _wrapped(key: bytes | None, values: Sequence[bytes]) -> Sequence[bytes]:
    """`values` as a writer takes them: in the envelope when keyed, or when one could
    be taken for an envelope (`envelope.wrap`)."""
    if key is None:
        # One value, the common run over many topics: no generator to look for the mark.
        if len(values) == 1:
            if not values[0].startswith(MAGIC):
                return values
        elif not any(value.startswith(MAGIC) for value in values):
            return values
    return [wrap(key, value) for value in values]


def _forget_durable(writer: PartitionWriter, ranges: collections.deque[tuple[int, int]]) -> int:
    """Drop the ranges of `writer`'s positions that are all durable; `writer.durable()`."""
    durable = writer.durable()
    while ranges and ranges[0][1] <= durable:
        ranges.popleft()
    return durable


class ProducerHandle(Producer):
    """One session's view: which positions of which writers are its own."""

    def __init__(self, engine: DafkaEngine, session_id: str) -> None:
        self._engine = engine
        self._session_id = session_id
        # writer -> ranges [start, end) of positions this session produced, in order.
        self._ranges: dict[PartitionWriter, collections.deque[tuple[int, int]]] = {}
        # Ranges added since `_forget_all` counted them, and how many make it run again.
        self._kept = 0
        self._forget_at = FORGET_AT_LEAST
        self._closed = False

    def produce(self, topic: str, key: bytes | None, value: bytes) -> None:
        # One RPUSHX value, the common case: no generator to look for the envelope's mark.
        if key is not None or value.startswith(MAGIC):
            value = wrap(key, value)
        self._submit(topic, key, (value,))

    def produce_many(self, topic: str, key: bytes | None, values: Sequence[bytes]) -> int:
        return self._submit(topic, key, _wrapped(key, values))

    def produce_runs(self, runs: Sequence[Run]) -> int:
        # A pipeline over many topics: runs of a value or a few, 10 a writer in a
        # pipeline of 1,000 over 100 topics. Order holds where it is kept: per writer (a
        # partition), and the writers' records are handed to the actor together at the
        # end of the pass anyway; so the runs go at once when none can be refused.
        if self._closed or self._engine.stopped:
            raise ProduceError(STOPPED)
        if self.produce_grouped(runs):
            return sum(len(values) for _, _, values in runs)
        return super().produce_runs(runs)  # run by run, in order, up to a refusal

    def produce_grouped(self, runs: Sequence[Run]) -> bool:
        # Each writer's values of all the runs queued at once (one queue, one note of
        # this session's positions), when none can be refused: the writers are the
        # clients' and have not failed, and the queue has room for all. submit()'s checks
        # and counts paid once for all: at 1,000 topics a writer takes one value a pass,
        # and submit() per writer was a tenth of the loop's time.
        if self._closed or self._engine.stopped:
            return False
        writer_this_pass = self._engine.writer_this_pass
        try:
            writers = [writer_this_pass(topic, key) for topic, key, _ in runs]
        except ProduceError:  # refused at once: produce_runs says where
            return False
        for writer in writers:
            if writer.failed is not None or writer.internal:
                return False  # may refuse values for another reason than room
        total = sum([len(values) for _, _, values in runs])
        handover = self._engine.handover
        if handover.unacked + total > self._engine.settings.queue_max_messages:
            return False
        # Wrapped before any is queued: all or none.
        wrapped = [_wrapped(key, values) for _, key, values in runs]
        queued: Iterable[tuple[PartitionWriter, Sequence[bytes]]]
        queued = zip(writers, wrapped, strict=True)
        if len(set(writers)) < len(writers):
            # Runs that share a writer (produce_runs may pass them), in one queue each. The
            # gateway's runs are a topic each: no table of their values (at 1,000 topics a
            # lookup, a list and a copy a run).
            by_writer: dict[PartitionWriter, list[bytes]] = {}
            for writer, values in queued:
                by_writer.setdefault(writer, []).extend(values)
            queued = by_writer.items()
        note = self._note_range
        for writer, values in queued:
            start = writer.submitted
            note(writer, start, writer.queue(values))
        handover.unacked += total
        handover.produced += total
        return True

    def _submit(self, topic: str, key: bytes | None, values: Sequence[bytes]) -> int:
        """`values`, already wrapped where they must be, to `topic`'s writer for `key`."""
        if self._closed or self._engine.stopped:
            raise ProduceError(STOPPED)
        if not values:
            return 0
        writer = self._engine.writer_this_pass(topic, key)
        start = writer.submitted
        try:
            end = writer.submit(values)
        except QueueFullError as full:
            if full.enqueued:
                self._note(writer, start, start + full.enqueued)
            raise
        self._note(writer, start, end)
        return len(values)

    def _note(self, writer: PartitionWriter, start: int, end: int) -> None:
        """This session's records at positions [start, end) of `writer`, counted as
        produced."""
        self._note_range(writer, start, end)
        self._engine.handover.produced += end - start

    def _note_range(self, writer: PartitionWriter, start: int, end: int) -> None:
        """This session's records at positions [start, end) of `writer`; the caller
        counts them as produced."""
        ranges = self._ranges.get(writer)
        # Tuples, not lists: the garbage collector stops tracking a tuple of ints, and a
        # session can hold one per record in flight (a list each: 0.1-0.2 s pauses of the
        # loop at 1,000 topics, every list walked at each full collection).
        if ranges and ranges[-1][1] == start:
            ranges[-1] = (ranges[-1][0], end)
        else:
            if ranges is None:
                ranges = self._ranges[writer] = collections.deque()
            ranges.append((start, end))
            self._kept += 1
            if self._kept >= self._forget_at:
                self._forget_all()

    def _forget_all(self) -> None:
        """Drop what is durable, on every writer. Sessions that interleave on a writer add
        a range per record: forgotten only at a DUMP, they grew without bound on a
        connection that never sent one (a steady RPUSHX producer held ~100 bytes for each
        record it ever sent).
        The walk looks at each writer the session holds ranges of: it runs again after
        twice as many ranges as it kept, and at least four per writer it looked at (the
        writers whose ranges were all durable are forgotten, and most come back: at
        1,000 topics, counting only those it kept made it 5% of the loop)."""
        kept = 0
        looked_at = len(self._ranges)
        for writer, ranges in list(self._ranges.items()):
            _forget_durable(writer, ranges)
            if ranges:
                kept += len(ranges)
            else:
                del self._ranges[writer]
        self._kept = kept
        self._forget_at = max(FORGET_AT_LEAST, 2 * kept, 4 * looked_at)

    async def wait_for_room(self, timeout: float) -> None:
        # Writers make room when a store acknowledges (or a writer fails): both call
        # engine.progress() on this loop. Progress may come between a refusal and this
        # wait (the waiting task starts a pass later): the caller tries again first.
        await self._engine.wait_progress(timeout)

    def outstanding(self) -> int:
        left = 0
        for writer, ranges in list(self._ranges.items()):
            acked = _forget_durable(writer, ranges)
            if not ranges:
                del self._ranges[writer]
                continue
            # A failed writer's too: what a store acknowledged before the failure (its
            # `acked` stops there) is durable, the rest never will be.
            left += sum(end - max(start, acked) for start, end in ranges)
        return left

    async def flush(self, timeout: float) -> int:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        while True:
            # Not outstanding() at each wake-up: every ACK of every partition wakes the
            # flush, and a walk over all its writers each time made a DUMP after records
            # spread over 4,000 partitions spend 0.6-0.8 s of its ~1 s walking them.
            remaining = deadline - loop.time()
            if remaining <= 0 or self._settled():
                return self.outstanding()
            if self._engine.settings.acks == "all":
                # The stores do not say when they have a record: ask them.
                self._engine.observer.ask({writer.topic for writer in self._ranges})
                remaining = min(remaining, ASK_INTERVAL)
            await self._engine.wait_progress(remaining)

    def _settled(self) -> bool:
        """No writer that has not failed holds records of this session that are not yet
        durable: what a flush waits for. Forgets the writers whose records all are, and
        stops at the first one still waited for, so that the walks of a whole flush cost
        about one pass over its writers, not one per wake-up."""
        done: list[PartitionWriter] = []
        try:
            for writer, ranges in self._ranges.items():
                _forget_durable(writer, ranges)
                if not ranges:
                    done.append(writer)
                elif writer.failed is None:
                    return False
            return True
        finally:
            for writer in done:
                del self._ranges[writer]

    async def close(self, timeout: float) -> int:
        if self._closed:
            return 0
        left = await self.flush(timeout)
        self._closed = True
        self._ranges.clear()
        if left:
            self._engine.stats.incr(Stats.UNFLUSHED, left)
        return left
