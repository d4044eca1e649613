"""An engine that keeps the log in memory: the gateway's tests without any broker.

Not a stub: it implements `backends.base` as a broker-backed engine behaves, and passes
the contract suite (tests/engines/test_contract.py) like the real engines.

- A `MemoryLog` plays the broker: topics of partitions of records, and each consumer
  group's members and committed offsets. Engines naming the same log (its `log`
  setting) are gateways of one deployment; the log outlives them, so a new engine on
  it sees the partitions, offsets and commits of the previous one (a restart).
- A keyed record goes to partition `crc32(key) % partitions`; unkeyed records go round
  robin. Offsets count up from 0 per partition.
- Producing enqueues; records reach the log on a later turn of the event loop, so
  `outstanding()` and `flush()` mean something.
- A group deals each topic's partitions out to the members subscribed to it, in join
  order, whenever a member joins or leaves or a topic appears. A revoked partition's acked offset is
  committed first; its new owner starts at the committed offset, so the records handed
  out but not acked are delivered again. Acks are committed on revocation and close.
- Acks for a partition the member does not own are refused, as librdkafka refuses them.
- Reads by offset (`partition_offsets`, `read`) look at the log under its lock and touch no group.
  `MemoryLog.expire(topic, partition, before)` plays retention: records below `before`
  are no longer held (reads skip them, members positioned before them jump to `before`).

Registered for the tests as engine "memory" (tests/support/fixtures.py). Its section of
the configuration document::

    "memory": {"log": "<name>", "partitions": 0, "auto.offset.reset": "latest"}

`partitions` > 0 creates unknown topics on first produce with that many partitions
(0: producing to an unknown topic is refused). `auto.offset.reset` (`earliest` or
`latest`) is where a group without a committed offset starts; a client's BLPOP
settings may override it, and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from backends.base import (
    AckError,
    Consumer,
    ConsumerCreationError,
    Engine,
    EngineConfigError,
    EngineOptions,
    EngineSettings,
    MetadataError,
    PartitionOffsets,
    ProduceError,
    Producer,
    ProducerCreationError,
    ReadError,
    Record,
    Stats,
    UnknownPartitionError,
)

SECTION = "memory"
RESETS = ("earliest", "latest")
STOPPED = "Engine stopped"
Partition = tuple[str, int]


# --- the entry points of backends.registry ---------------------------------------------


@dataclass(frozen=True)
class MemorySettings:
    log: str = "default"
    partitions: int = 0  # of topics created on first produce; 0: unknown topics refused
    offset_reset: str = "latest"


def parse_settings(document: Mapping[str, object]) -> MemorySettings:
    section = document.get(SECTION)
    if section is None:
        return MemorySettings()
    if not isinstance(section, dict):
        raise EngineConfigError(f"section '{SECTION}' must be a JSON object")
    known = {"log", "partitions", "auto.offset.reset"}
    for key in section:
        if key not in known:
            raise EngineConfigError(f"unknown setting {SECTION}.{key}")
    log = section.get("log", "default")
    if not isinstance(log, str):
        raise EngineConfigError(f"{SECTION}.log must be a string")
    try:
        partitions = int(section.get("partitions", 0))
    except (TypeError, ValueError):
        partitions = -1
    if partitions < 0:
        raise EngineConfigError(f"{SECTION}.partitions must be an integer >= 0")
    reset = section.get("auto.offset.reset", "latest")
    if reset not in RESETS:
        raise EngineConfigError(f"{SECTION}.auto.offset.reset must be one of {', '.join(RESETS)}")
    return MemorySettings(log=log, partitions=partitions, offset_reset=str(reset))


def create(settings: EngineSettings, stats: Stats, options: EngineOptions) -> MemoryEngine:
    assert isinstance(settings, MemorySettings), settings
    return MemoryEngine(stats, settings, options)


def describe(settings: EngineSettings) -> dict[str, object]:
    assert isinstance(settings, MemorySettings), settings
    return {
        "log": settings.log,
        "partitions": settings.partitions,
        "auto.offset.reset": settings.offset_reset,
    }


# --- the log: what a broker would hold --------------------------------------------------


class _Group:
    def __init__(self) -> None:
        self.members: list[MemoryConsumer] = []  # in join order
        self.committed: dict[Partition, int] = {}


class MemoryLog:
    """Topics, records and groups, shared by every engine naming it (any thread)."""

    _named: ClassVar[dict[str, MemoryLog]] = {}
    _named_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        # One lock for everything: records, group membership, members' positions.
        self.lock = threading.RLock()
        self.topics: dict[str, list[list[Record]]] = {}
        self._next_unkeyed: dict[str, int] = {}
        self.groups: dict[str, _Group] = {}
        # Partition -> its first held offset, once retention removed records (expire()).
        self.first_held: dict[Partition, int] = {}

    @classmethod
    def named(cls, name: str) -> MemoryLog:
        with cls._named_lock:
            return cls._named.setdefault(name, MemoryLog())

    @classmethod
    def forget(cls, name: str) -> None:
        with cls._named_lock:
            cls._named.pop(name, None)

    def create_topic(self, name: str, partitions: int) -> None:
        if partitions < 1:
            raise ValueError(f"a topic needs at least one partition, not {partitions}")
        with self.lock:
            if name in self.topics:
                return
            self.topics[name] = [[] for _ in range(partitions)]
            for group in self.groups.values():
                self._rebalance(group)

    def append(self, topic: str, key: bytes | None, value: bytes) -> None:
        with self.lock:
            partitions = self.topics[topic]
            if key is None:
                index = self._next_unkeyed.get(topic, 0)
                self._next_unkeyed[topic] = index + 1
                number = index % len(partitions)
            else:
                number = zlib.crc32(key) % len(partitions)
            records = partitions[number]
            records.append(
                Record(topic, number, len(records), key, value, time.time_ns() // 1_000_000)
            )
            for group in self.groups.values():
                for member in group.members:
                    if (topic, number) in member.positions:
                        member.wake()

    def join(self, group_id: str, member: MemoryConsumer) -> None:
        with self.lock:
            group = self.groups.setdefault(group_id, _Group())
            group.members.append(member)
            self._rebalance(group)

    def leave(self, group_id: str, member: MemoryConsumer) -> None:
        with self.lock:
            group = self.groups[group_id]
            member.revoke(set(member.positions), group)
            group.members.remove(member)
            self._rebalance(group)

    def _rebalance(self, group: _Group) -> None:
        """Deal each topic's partitions out to the members subscribed to it."""
        wanted: dict[MemoryConsumer, set[Partition]] = {m: set() for m in group.members}
        for topic, partitions in self.topics.items():
            members = [m for m in group.members if topic in m.topics]
            for number in range(len(partitions)):
                if members:
                    wanted[members[number % len(members)]].add((topic, number))
        # Revoke everything first, so that no partition ever has two owners.
        for member, owned in wanted.items():
            member.revoke(set(member.positions) - owned, group)
        for member, owned in wanted.items():
            for tp in sorted(owned - set(member.positions)):
                start = group.committed.get(tp)
                if start is None:
                    start = 0 if member.offset_reset == "earliest" else len(self._records(tp))
                member.positions[tp] = start
            member.wake()

    def _records(self, tp: Partition) -> list[Record]:
        return self.topics[tp[0]][tp[1]]

    def expire(self, topic: str, partition: int, before: int) -> None:
        """Retention: the records of (topic, partition) below offset `before` are gone."""
        with self.lock:
            held = len(self._records((topic, partition)))
            self.first_held[(topic, partition)] = min(max(before, 0), held)

    def offsets(self, topic: str, partition: int) -> PartitionOffsets:
        with self.lock:
            partitions = self.topics.get(topic)
            if partitions is None or not 0 <= partition < len(partitions):
                raise UnknownPartitionError(f"Unknown partition {topic}:{partition}")
            return PartitionOffsets(
                self.first_held.get((topic, partition), 0), len(partitions[partition])
            )

    def read(self, topic: str, partition: int, start: int, stop: int, limit: int) -> list[Record]:
        with self.lock:
            first, following = self.offsets(topic, partition)
            begin, end = max(start, first), min(stop + 1, following, max(start, first) + limit)
            return self._records((topic, partition))[begin:end] if begin < end else []

    def take(self, member: MemoryConsumer) -> Record | None:
        """The next record of one of `member`'s partitions, taking turns between them."""
        with self.lock:
            owned = sorted(member.positions)
            for step in range(len(owned)):
                tp = owned[(member.turn + step) % len(owned)]
                position = max(member.positions[tp], self.first_held.get(tp, 0))
                records = self._records(tp)
                if position < len(records):
                    member.positions[tp] = position + 1
                    member.turn = (member.turn + step + 1) % len(owned)
                    return records[position]
            return None


# --- the engine -------------------------------------------------------------------------


class MemoryEngine(Engine):
    def __init__(self, stats: Stats, settings: MemorySettings, options: EngineOptions) -> None:
        super().__init__(stats)
        self.settings = settings
        self.log = MemoryLog.named(settings.log)
        self._options = options
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: list[tuple[MemoryProducer, str, bytes | None, bytes]] = []
        self.producers: set[MemoryProducer] = set()  # open handles, for stop() to flush
        self._consumers: set[MemoryConsumer] = set()
        self.stopped = False

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()

    async def stop(self) -> None:
        self.stopped = True
        await asyncio.gather(*(consumer.close() for consumer in list(self._consumers)))
        # Like a shared producer's close: what is queued may still be delivered.
        await asyncio.gather(
            *(handle.flush(self._options.stop_flush_timeout) for handle in self.producers)
        )

    def producer(self, session_id: str) -> MemoryProducer:
        if self.stopped:
            raise ProducerCreationError(STOPPED)
        handle = MemoryProducer(self)
        self.producers.add(handle)
        return handle

    async def consumer(
        self, group: str, name: str, topics: Sequence[str], settings: Mapping[str, object]
    ) -> MemoryConsumer:
        if self.stopped:
            raise ConsumerCreationError(STOPPED)
        reset = self.settings.offset_reset
        for key, value in settings.items():
            if isinstance(value, dict | list) or value is None:
                raise ConsumerCreationError(f"{key}: must be a string, a number or a boolean")
            if key != "auto.offset.reset":
                raise ConsumerCreationError(f"{key}: no such setting")
            if value not in RESETS:
                raise ConsumerCreationError(f"{key}: must be one of {', '.join(RESETS)}")
            reset = str(value)
        member = MemoryConsumer(self, group, name, list(topics), reset)
        self._consumers.add(member)
        self.log.join(group, member)
        return member

    def forget(self, consumer: MemoryConsumer) -> None:
        self._consumers.discard(consumer)

    async def topics(self) -> list[str]:
        if self.stopped:
            raise MetadataError(STOPPED)
        with self.log.lock:
            return sorted(self.log.topics)

    async def partition_offsets(self, topic: str, partition: int) -> PartitionOffsets:
        if self.stopped:
            raise ReadError(STOPPED)
        return self.log.offsets(topic, partition)

    async def read(
        self, topic: str, partition: int, start: int, stop: int, limit: int
    ) -> list[Record]:
        if self.stopped:
            raise ReadError(STOPPED)
        if start < 0 or limit < 1:
            raise ValueError(f"read needs start >= 0 and limit >= 1, got {start}, {limit}")
        return self.log.read(topic, partition, start, stop, limit)

    def enqueue(self, handle: MemoryProducer, topic: str, key: bytes | None, value: bytes) -> None:
        """Accept a record now, deliver it on a later turn of the loop (as a broker
        acknowledges later); raises ProduceError when it is refused at once."""
        if self.stopped:
            raise ProduceError(STOPPED)
        with self.log.lock:
            if topic not in self.log.topics:
                if not self.settings.partitions:
                    raise ProduceError("Unknown topic")
                self.log.create_topic(topic, self.settings.partitions)
        if not self._pending:
            assert self._loop is not None, "produce before start()"
            self._loop.call_soon(self._deliver)
        self._pending.append((handle, topic, key, value))

    def _deliver(self) -> None:
        batch, self._pending = self._pending, []
        for handle, topic, key, value in batch:
            self.log.append(topic, key, value)
            handle.settle()
        self.stats.incr(Stats.DELIVERED, len(batch))


class MemoryProducer(Producer):
    def __init__(self, engine: MemoryEngine) -> None:
        self._engine = engine
        self._outstanding = 0
        self._idle: asyncio.Future[None] | None = None  # resolved when nothing is outstanding
        self._closed = False

    def produce(self, topic: str, key: bytes | None, value: bytes) -> None:
        if self._closed:
            raise ProduceError("Producer closed")
        self._engine.enqueue(self, topic, key, value)
        self._outstanding += 1
        self._engine.stats.incr(Stats.PRODUCED)

    def settle(self) -> None:
        self._outstanding -= 1
        if not self._outstanding and self._idle is not None and not self._idle.done():
            self._idle.set_result(None)

    def outstanding(self) -> int:
        return self._outstanding

    async def flush(self, timeout: float) -> int:
        if self._outstanding and timeout > 0:
            if self._idle is None or self._idle.done():
                self._idle = asyncio.get_running_loop().create_future()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._idle), timeout)
        return self._outstanding

    async def close(self, timeout: float) -> int:
        if self._closed:
            return 0
        self._closed = True
        left = await self.flush(timeout)
        if left:
            self._engine.stats.incr(Stats.UNFLUSHED, left)
        self._engine.producers.discard(self)
        return left


class MemoryConsumer(Consumer):
    def __init__(
        self, engine: MemoryEngine, group: str, name: str, topics: list[str], reset: str
    ) -> None:
        self._engine = engine
        self._log = engine.log
        self.group = group
        self.name = name
        self.topics = topics
        self.offset_reset = reset
        # Owned partitions -> the offset of the next record to hand out. Guarded by the
        # log's lock: rebalances triggered by other members change it.
        self.positions: dict[Partition, int] = {}
        self.turn = 0
        self._acked: dict[Partition, int] = {}  # stored, not committed yet
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def wake(self) -> None:
        """Something to look at: a record, a new assignment, close (any thread)."""
        with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
            self._loop.call_soon_threadsafe(self._changed.set)

    def revoke(self, partitions: set[Partition], group: _Group) -> None:
        """Commit the acks of `partitions`, then give them up (under the log's lock)."""
        committed = 0
        for tp in partitions:
            self.positions.pop(tp)
            acked = self._acked.pop(tp, None)
            if acked is not None:
                group.committed[tp] = acked
                committed += 1
        if committed:
            self._engine.stats.incr(Stats.COMMITTED, committed)

    async def next(self, timeout: float | None) -> Record | None:
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        while not self._closed:
            self._changed.clear()  # before looking: a wake-up after it is not missed
            record = self._log.take(self)
            if record is not None:
                self._engine.stats.incr(Stats.CONSUMED)
                return record
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)
        return None

    def ack(self, topic: str, partition: int, offset: int) -> None:
        if self._closed:
            raise AckError("Consumer closed")
        with self._log.lock:
            if (topic, partition) not in self.positions:
                raise AckError(f"Partition {topic}:{partition} is not assigned to this member")
            self._acked[(topic, partition)] = offset + 1
        self._engine.stats.incr(Stats.ACKED)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._log.leave(self.group, self)
        self._changed.set()
        self._engine.forget(self)
