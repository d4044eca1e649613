"""The engine interface shared by the gateway and every engine (kafka, dafka).

The gateway only talks to these classes. An engine is constructed with the
server-wide `Stats`, counts what it does there, and raises the errors below with
the exact text (without the `CONS `/`PROD `/`ERR ` prefix, which the gateway adds).

Partitions and offsets are what clients see in BLPOP replies and send back in
`RPUSH acks <topic>:<partition>:<offset>`, so an engine that has to invent them (Dafka
has neither) must give them Kafka's meaning:

- A partition is a small non-negative int (< 2**31). It is stable across restarts and
  means the same partition on every gateway of one deployment: a client may ack on a
  new connection, through another gateway, after a restart.
- An offset is a non-negative int, per partition, strictly increasing by one from one
  record of the partition to the next, never reused.
- `ack(topic, partition, offset)` commits `offset + 1`: the position of the next record
  the group wants. A member that takes the partition over starts there.
- Records of one partition are handed out in offset order; records with the same key
  land in the same partition.

Reads by offset (`Engine.partition_offsets`, `Engine.read`; the gateway's LLEN and LRANGE) belong
to no consumer group: they never join one, never commit, and never move a group's
committed offset or a member's position.

Over ~500 lines on purpose: this file is the whole contract an engine implements (the
records, the errors with their texts, Producer, Consumer, Engine and the stats they
count), read top to bottom by whoever writes an engine; a third of it is docstrings.
"""

from __future__ import annotations

import asyncio
import operator
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Self, TypeAlias, overload


class Record(NamedTuple):
    """One record of the log, as a consumer hands it out.

    A named tuple, not a dataclass: engines build a batch of records from columns
    without running Python code per record (`tuple.__new__` over zipped columns), and
    the gateway takes a batch apart into columns (`zip(*records)`) to encode it in one
    pass. Immutable and hashable as before; a frozen dataclass cost four times as much
    to build, which was a fifth of the gateway's time on the consume path.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None = None


class RecordBatch(Sequence[Record]):
    """Records held as columns, one list per field, all as long: what an engine may
    hand out from `take_ready()` / `next_batch()` instead of a list of Records, so that
    neither it nor the gateway (which encodes BLMPOP's reply from the columns) builds an
    object per record. Indexing and iterating give Records (a slice, a RecordBatch); it
    equals any sequence of the same records. `timestamps` may be any sequence (an engine
    may read them only when asked: the gateway's BLMPOP never does)."""

    __slots__ = ("keys", "offsets", "partitions", "timestamps", "topics", "values")

    def __init__(
        self,
        topics: list[str],
        partitions: list[int],
        offsets: list[int],
        keys: list[bytes | None],
        values: list[bytes | None],
        timestamps: Sequence[int | None],
    ) -> None:
        self.topics = topics
        self.partitions = partitions
        self.offsets = offsets
        self.keys = keys
        self.values = values
        self.timestamps = timestamps

    @classmethod
    def of(cls, records: Sequence[Record]) -> RecordBatch:
        """The columns of `records`."""
        if isinstance(records, RecordBatch):
            return records
        if not records:
            return cls([], [], [], [], [], [])
        columns = [list(column) for column in zip(*records, strict=True)]
        return cls(*columns)

    @classmethod
    def joined(cls, batches: Sequence[RecordBatch]) -> RecordBatch:
        """One batch of the records of `batches`, in order."""
        return cls(
            [topic for batch in batches for topic in batch.topics],
            [partition for batch in batches for partition in batch.partitions],
            [offset for batch in batches for offset in batch.offsets],
            [key for batch in batches for key in batch.keys],
            [value for batch in batches for value in batch.values],
            [stamp for batch in batches for stamp in batch.timestamps],
        )

    def __len__(self) -> int:
        return len(self.offsets)

    @overload
    def __getitem__(self, index: int) -> Record: ...

    @overload
    def __getitem__(self, index: slice) -> RecordBatch: ...

    def __getitem__(self, index: int | slice) -> Record | RecordBatch:
        if isinstance(index, slice):
            return RecordBatch(
                self.topics[index],
                self.partitions[index],
                self.offsets[index],
                self.keys[index],
                self.values[index],
                self.timestamps[index],
            )
        return Record(
            self.topics[index],
            self.partitions[index],
            self.offsets[index],
            self.keys[index],
            self.values[index],
            self.timestamps[index],
        )

    def __iter__(self) -> Iterator[Record]:
        return map(
            Record, self.topics, self.partitions, self.offsets, self.keys, self.values,
            self.timestamps,
        )  # fmt: skip

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and all(map(operator.eq, self, other))

    __hash__ = None  # type: ignore[assignment]  # mutable columns, as a list

    def __repr__(self) -> str:
        return f"RecordBatch({list(self)!r})"


class PartitionOffsets(NamedTuple):
    """Where one partition's log stands (`Engine.partition_offsets`)."""

    # The offset of the oldest record still held: 0 until retention removes records
    # from the head of the log; equal to `next` when no record is held.
    first: int
    # The offset the next record produced to the partition will get: one past the last
    # record's, 0 for a partition that never had a record.
    next: int


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """The gateway's own settings (its `gateway` section) that engines need too."""

    # Bound on a topic listing (KEYS topics:), seconds.
    metadata_timeout: float = 5.0
    # Records a consumer may fetch ahead of its BLPOPs: a consumer holds at most this
    # many in memory.
    consume_batch: int = 500
    # How long stop() may wait for records still not durable, seconds.
    stop_flush_timeout: float = 5.0
    # Where an engine that keeps data on this machine keeps it (the embedded Dafka
    # network); created if missing.
    data_dir: str = "rafka-data"


# An engine's parsed configuration sections, as its parse_settings() returns them (see
# backends.registry): the gateway keeps them without looking into them.
EngineSettings: TypeAlias = object

# What Producer.produce_runs enqueues: (topic, key, values), the values in order.
Run: TypeAlias = "tuple[str, bytes | None, Sequence[bytes]]"


@dataclass(frozen=True, slots=True)
class EngineFlag:
    """A command-line flag of `rafka` that sets one key of an engine's section (an
    engine module lists its own in `FLAGS`)."""

    flag: str  # e.g. "--tower-sub"
    section: str  # the configuration section it writes to, e.g. "dafka"
    key: str
    type: type[str] | type[int]
    help: str


class EngineConfigError(Exception):
    """An engine's configuration section is wrong; the text names the key."""


class EngineError(Exception):
    """Base of every error an engine raises; str(error) is the text shown to clients."""


class ProduceError(EngineError):
    """Produce refused at once, e.g. `Local: Queue full` (gateway answers `PROD <text>`).
    `enqueued`: how many values of the refused call (`produce_many`) went in before the
    refusal."""

    def __init__(self, text: str, enqueued: int = 0) -> None:
        super().__init__(text)
        self.enqueued = enqueued


class QueueFullError(ProduceError):
    """Refused because the engine's queue of records not yet durable is full (`Local:
    Queue full`): transient, room comes as queued records become durable or fail."""


class ProducerCreationError(EngineError):
    """The engine could not make a producer (gateway: `PROD Error spawning producer: <text>`)."""


class ConsumerCreationError(EngineError):
    """The engine could not make a consumer; the text is logged, clients see Rafka's error #8."""


class ConsumeError(EngineError):
    """A non-transient error while consuming (gateway answers `CONS Poll <text>`)."""


class AckError(EngineError):
    """An ack the engine refused (gateway answers `CONS <text>`)."""


class MetadataError(EngineError):
    """Topic listing failed (gateway answers `ERR Error getting metadata: <text>`)."""


class MetadataClientError(MetadataError):
    """Topic listing failed because the engine could not make the client it lists topics
    with (gateway answers `ERR Error spawning producer: <text>`, Rafka's text: it listed
    topics through the connection's producer)."""


class ReadError(EngineError):
    """A read by offset failed (gateway answers `ERR read failed: <text>`)."""


class UnknownPartitionError(ReadError):
    """A read by offset named a topic or a partition the engine does not have (gateway
    answers `ERR unknown topic or partition <topic>:<partition>`)."""


READS_NOT_SUPPORTED = "reads by offset are not supported by this engine"


class Stats:
    """The engine's counters, thread-safe because engines count from their own threads.

    Rafka's three counters come first, in Rafka's order; `reset()` (DEL stats) zeroes
    them. The gateway adds its own (connections) to what HGETALL stats shows
    (`gateway/stats.py`).
    """

    # Rafka 0.6.2's counters, in HGETALL order.
    UNFLUSHED = "producer.unflushed.messages"
    DELIVERY_ERRORS = "producer.delivery.errors"
    UNKNOWN_EVENTS = "producer.unknown.events"
    # Per stage, so that a user can find where a record was lost.
    PRODUCED = "producer.produced.messages"
    DELIVERED = "producer.delivered.messages"
    CONSUMED = "consumer.consumed.messages"
    ACKED = "consumer.acked.messages"
    COMMITTED = "consumer.committed.offsets"
    COMMIT_ERRORS = "consumer.commit.errors"

    COUNTERS: tuple[str, ...] = (
        UNFLUSHED,
        DELIVERY_ERRORS,
        UNKNOWN_EVENTS,
        PRODUCED,
        DELIVERED,
        CONSUMED,
        ACKED,
        COMMITTED,
        COMMIT_ERRORS,
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # The fixed counters, then those added at run time (add_counters), in order.
        self._values: dict[str, int] = dict.fromkeys(self.COUNTERS, 0)
        # Counters also counted by their owner (count_in): name -> the owner's total.
        self._owned: dict[str, Callable[[], int]] = {}

    def count_in(self, name: str, total: Callable[[], int]) -> None:
        """`name` is also counted by its owner: `total()` is the owner's running total,
        kept by one thread without a lock (cheaper per record than incr()). get() and
        snapshot() add it to what incr() counted; reset() zeroes the sum."""
        with self._lock:
            self._owned[name] = total

    def add_counters(self, names: Sequence[str]) -> None:
        """Counters that live as long as what they count (e.g. one HTTP push
        subscription's), listed after the fixed ones from 0; reset() zeroes them too.
        Adding a name that exists keeps its value."""
        with self._lock:
            for name in names:
                self._values.setdefault(name, 0)

    def remove_counters(self, names: Sequence[str]) -> None:
        """Forget counters added with add_counters (the fixed ones stay)."""
        with self._lock:
            for name in names:
                if name not in self.COUNTERS:
                    self._values.pop(name, None)

    def incr(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._values[name] += amount

    def get(self, name: str) -> int:
        with self._lock:
            owned = self._owned.get(name)
            return self._values[name] + (owned() if owned is not None else 0)

    def snapshot(self) -> dict[str, int]:
        """Every counter, Rafka's three first."""
        with self._lock:
            values = dict(self._values)
            for name, owned in self._owned.items():
                values[name] += owned()
            return values

    def reset(self) -> None:
        with self._lock:
            for name in self._values:
                self._values[name] = 0
            for name, owned in self._owned.items():
                self._values[name] = -owned()  # what the owner counts from now on


class Producer(ABC):
    """One session's producing handle. Engines may share one real producer between
    handles, but every count here is this handle's own."""

    @abstractmethod
    def produce(self, topic: str, key: bytes | None, value: bytes) -> None:
        """Enqueue one record without blocking; raise ProduceError when refused at once."""

    def produce_many(self, topic: str, key: bytes | None, values: Sequence[bytes]) -> int:
        """Enqueue `values` in order, all with `key`; return how many were enqueued.

        On the first refused record, raise its ProduceError, whose `enqueued` says how
        many went in: the records before it stay enqueued (they count as produced and
        outstanding, and are delivered), the refused one and those after it are not
        enqueued. This default loops over produce(); engines override it to pay their
        per-call costs once per batch.
        """
        produce = self.produce
        for enqueued, value in enumerate(values):
            try:
                produce(topic, key, value)
            except ProduceError as refused:
                refused.enqueued = enqueued
                raise
        return len(values)

    def produce_runs(self, runs: Sequence[Run]) -> int:
        """Enqueue each run's values in order, with its topic and key, the runs in order,
        as one produce_many() each; return how many values were enqueued.

        On the first refused record, raise its ProduceError, whose `enqueued` counts the
        values of all the runs that went in before it; none after it goes in. This
        default calls produce() or produce_many() per run; engines override it to pay
        their per-call costs once for all the runs (a pipeline over many topics).
        """
        enqueued = 0
        for topic, key, values in runs:
            try:
                if len(values) == 1:
                    self.produce(topic, key, values[0])
                else:
                    self.produce_many(topic, key, values)
            except ProduceError as refused:
                refused.enqueued += enqueued
                raise
            enqueued += len(values)
        return enqueued

    def produce_grouped(self, runs: Sequence[Run]) -> bool:
        """Enqueue every run's values in order, with its topic and key, if all of them can
        be enqueued now, and return True; else enqueue none and return False (the caller
        then produces them in order, with produce_runs, to learn which is refused).

        Each run is to a topic of its own, so the runs' order is not one a consumer could
        see: a pipeline round-robin over many topics, its values gathered by topic, is
        produced in one run per topic instead of one per value. This default takes none;
        engines that can tell in advance that all will be taken override it."""
        return False

    async def wait_for_room(self, timeout: float) -> None:
        """After a QueueFullError: return once queued records (anyone's) have become
        durable or failed since that refusal, so that a retry may find room, or after
        `timeout` seconds. Never raises. This default only waits out the timeout: an
        engine that raises QueueFullError overrides it."""
        await asyncio.sleep(max(timeout, 0.0))

    @abstractmethod
    def outstanding(self) -> int:
        """Records of this handle neither durable (delivered) nor failed yet."""

    @abstractmethod
    async def flush(self, timeout: float) -> int:
        """Wait up to `timeout` seconds for this handle's records; return outstanding().

        Returns as soon as nothing is outstanding; a timeout <= 0 does not wait.
        """

    @abstractmethod
    async def close(self, timeout: float) -> int:
        """Flush up to `timeout` seconds, release the handle, return what was left.

        Idempotent: a second call returns 0 at once.
        """


class Consumer(ABC):
    """One session's consumer: a member of consumer group `group`, fixed topics."""

    @abstractmethod
    async def next(self, timeout: float | None) -> Record | None:
        """The next record, or None after `timeout` seconds (None: wait forever).

        Raises ConsumeError for a non-transient engine error. Cancelling the awaiting
        task must leave the consumer usable and lose no record.
        """

    @property
    def closed(self) -> bool:
        """Closed, by close() or by the engine (its stop): next() then returns None at
        once, so a loop over next() must look here rather than spin. This default: an
        engine whose consumers never close under their owner."""
        return False

    def next_ready(self) -> Record | None:
        """The next record when it can be handed out at once, without waiting, I/O or a
        thread hop (the gateway then answers BLPOP without a task); else None. Counts and
        raises as next() does. This default has no fast path."""
        return None

    # A ConsumeError met by the default take_ready() after some records: raised by the
    # next take_ready() (engines that override both keep errors in place instead).
    _batch_error: ConsumeError | None = None

    def take_ready(self, limit: int) -> Sequence[Record]:
        """Up to `limit` records that can be handed out at once (as next_ready()), in the
        order next_ready() would hand them out; [] when none is. Counts as next() does;
        raises a ConsumeError only when it returns no record (an error met after some
        records is raised by the next call). A list of Records or a RecordBatch. This
        default loops on next_ready(); engines override it to pay their per-record costs
        once per batch."""
        error, self._batch_error = self._batch_error, None
        if error is not None:
            raise error
        return self._gather([], limit)

    def _gather(self, records: list[Record], limit: int) -> list[Record]:
        """`records` followed by records handed out at once, up to `limit` in all (counted
        as next() does). This default loops on next_ready(); engines override it (with
        take_ready()) to take a batch at once, and next_batch() then uses theirs."""
        while len(records) < limit:
            try:
                record = self.next_ready()
            except ConsumeError as error:
                if not records:
                    raise
                self._batch_error = error
                break
            if record is None:
                break
            records.append(record)
        return records

    async def next_batch(self, limit: int, timeout: float | None) -> Sequence[Record]:
        """Between 1 and `limit` records, waiting up to `timeout` seconds (None: forever)
        for the first; [] after the timeout. Records already held come without waiting
        for more; once a first record has come, whatever else is held then comes with
        it. Order, counting and cancellation as next(): cancelling loses no record."""
        ready = self.take_ready(limit)
        if ready:
            return ready
        first = await self.next(timeout)
        if first is None:
            return []
        return self._gather([first], limit)

    @abstractmethod
    def ack(self, topic: str, partition: int, offset: int) -> None:
        """Store `offset + 1` as the committed position of (topic, partition).

        Raises AckError when the engine refuses. Committing happens later (periodically
        and on close). Returns at once, also while a next() of this consumer is in
        flight on another task: it never waits for that next() nor for I/O.
        """

    @abstractmethod
    async def close(self) -> None:
        """Commit what was acked, leave the group, release everything. Idempotent."""


class Engine(ABC):
    """A log engine. `start()` before use, `stop()` once at the end."""

    def __init__(self, stats: Stats) -> None:
        self.stats = stats

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def stop(self) -> None:
        """Release engine-wide resources; producers and consumers are closed before."""

    @abstractmethod
    def producer(self, session_id: str) -> Producer:
        """A new producing handle; raises ProducerCreationError."""

    @abstractmethod
    async def consumer(
        self,
        group: str,
        name: str,
        topics: Sequence[str],
        settings: Mapping[str, object],
    ) -> Consumer:
        """A new member of consumer group `group` subscribed to `topics`.

        `name` is the member's name within the group (the client's id). `settings` are
        the client's BLPOP JSON settings as decoded: str, bool, `JsonNumber` (a str
        keeping the number's literal text), and whatever else the JSON held (nested
        objects, lists, None), which the engine refuses. The engine applies them over
        its own consumer configuration; group and name win over them. Raises
        ConsumerCreationError, also for a setting it cannot use.
        """

    @abstractmethod
    async def topics(self) -> list[str]:
        """Every topic name the engine knows; raises MetadataError (or a subclass) only."""

    def where(self) -> str:
        """Where the log is, for the start-up line: e.g. the brokers, or a directory."""
        return ""

    def disk_paths(self) -> tuple[str, ...]:
        """The directories on this machine the engine keeps the log in (the gateway's
        metrics report their size); () when the log lives elsewhere (a broker, a joined
        network). Called from any thread."""
        return ()

    async def partition_offsets(self, topic: str, partition: int) -> PartitionOffsets:
        """The first held and the next offset of (topic, partition), as of now.

        Belongs to no consumer group (see the module docstring). Raises
        UnknownPartitionError for a topic or partition that does not exist, ReadError for
        any other failure (the engine stopped, a timeout). This default raises ReadError:
        an engine without reads by offset answers every LLEN and LRANGE with an error.
        """
        raise ReadError(READS_NOT_SUPPORTED)

    async def read(
        self, topic: str, partition: int, start: int, stop: int, limit: int
    ) -> list[Record]:
        """The records of (topic, partition) with `start <= offset <= stop`, in offset
        order, at most the first `limit` of them (`0 <= start`, `1 <= limit`).

        Offsets past the last record, or no longer held, are simply absent: a range past
        the head gives what is there up to the head (maybe nothing), `start > stop` gives
        []. Does not wait for records to arrive. Records carry topic, partition, offset,
        key, value and timestamp as BLPOP's would. Belongs to no consumer group. Raises
        UnknownPartitionError / ReadError as `partition_offsets()` does; this default raises
        ReadError.
        """
        raise ReadError(READS_NOT_SUPPORTED)


# --- administration: topics (rafka-topics) -----------------------------------------------
#
# Kept in one block at the end of the module. An engine module of `backends.registry`
# provides `make_admin(settings, options) -> Admin`; `rafka-topics` talks to nothing else.


class AdminError(EngineError):
    """An administrative operation failed; in particular the engine cannot be reached
    (no broker answers, no Dafka store answers). The text says what and where."""


class TopicExistsError(AdminError):
    """A create of a topic that exists already."""


class UnknownTopicError(AdminError):
    """An operation on a topic the engine does not know."""


@dataclass(frozen=True, slots=True)
class TopicPartitionOffsets:
    """One partition of a topic: the oldest offset the log keeps and the offset the next
    record will get (`first == next`: nothing kept)."""

    partition: int
    first: int
    next: int


@dataclass(frozen=True, slots=True)
class GroupOffsets:
    """A consumer group's committed offset (the next record it wants) on one partition,
    and how far behind the partition's next offset it is."""

    group: str
    partition: int
    committed: int
    lag: int


@dataclass(frozen=True, slots=True)
class TopicDescription:
    """What `rafka-topics --describe` shows of one topic.

    `config`: the topic's settings as Kafka names them (`retention.ms`,
    `retention.bytes`), as far as the engine knows them; `groups` only lists partitions
    on which a group has committed.
    """

    name: str
    partitions: tuple[TopicPartitionOffsets, ...]
    config: Mapping[str, str]
    groups: tuple[GroupOffsets, ...] = ()

    @property
    def retention_ms(self) -> str | None:
        return self.config.get("retention.ms")


# The topic settings `create_topic` accepts, on every engine.
TOPIC_CONFIG_KEYS = ("retention.ms", "retention.bytes")


class Admin(ABC):
    """Topic administration on one engine's deployment. Every method raises AdminError
    (or a subclass) only; `close()` once at the end, also after an error (`async with`
    does it)."""

    @abstractmethod
    async def create_topic(self, name: str, partitions: int, config: Mapping[str, str]) -> None:
        """Create `name` with `partitions` partitions and `config` (TOPIC_CONFIG_KEYS).

        Raises TopicExistsError when the topic exists (created before, or holding
        records), AdminError for a name, count or setting the engine refuses.
        """

    @abstractmethod
    async def list_topics(self) -> list[str]:
        """Every topic, sorted, internal ones included."""

    @abstractmethod
    async def describe(self, topic: str) -> TopicDescription:
        """Partitions with their offsets, settings, groups; UnknownTopicError."""

    async def describe_many(self, topics: Sequence[str]) -> list[TopicDescription]:
        """`describe` of each of `topics`, in order, leaving out those that do not exist
        (deleted since they were listed). Engines override it to share the work between
        topics (the gateway's metrics describe every topic at each scrape)."""
        described: list[TopicDescription] = []
        for topic in topics:
            try:
                described.append(await self.describe(topic))
            except UnknownTopicError:
                continue
        return described

    @abstractmethod
    async def delete_topic(self, name: str) -> None:
        """Delete `name` and its records; UnknownTopicError."""

    @abstractmethod
    async def close(self) -> None:
        """Release every connection (and whatever the admin started). Idempotent."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
