"""Consumer groups on Dafka, inside one gateway.

Dafka has no groups: a consumer gets every partition of its topics. Here one Dafka
consumer actor per group reads the group's topics, and the group hands each partition to
one member at a time:

- Members subscribed to a topic share its partitions round-robin in join order; every join
  or leave reassigns at once (no broker round trip: milliseconds).
- A partition whose owner changes restarts from the group's acked position, so what the
  old owner was handed and did not ack is delivered again (at least once). The old owner's
  later acks of that partition are refused, as librdkafka refuses them after a revoke.
- Each partition buffers at most `buffer` records ahead of its owner. Records beyond are
  dropped and fetched again from the stores (a seek) once the owner has taken half.
- A partition starts at the group's committed offset; without one, at `auto.offset.reset`:
  earliest (the oldest record the stores keep) or latest (after the head known when the
  group first saw the partition).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import structlog

from backends.base import AckError, ConsumeError, Consumer, Record, Stats
from backends.dafka.consumer import Consumer as DafkaConsumer
from backends.dafka.consumer import DafkaRecord

if TYPE_CHECKING:
    from backends.dafka.engine import DafkaEngine

log = structlog.get_logger(__name__)

NOT_ASSIGNED = "Local: Erroneous state"
CLOSED = "Consumer closed"
_joins = itertools.count()


class _Partition:
    __slots__ = (
        "acked",
        "address",
        "buffer",
        "dirty",
        "expected",
        "number",
        "owner",
        "paused",
        "position",
        "seeking",
        "started",
        "topic",
    )

    def __init__(self, topic: str, address: str, number: int) -> None:
        self.topic = topic
        self.address = address
        self.number = number
        self.owner: Member | None = None
        self.started = False  # position known (a commit, a seek, or the first record)
        self.position = 0  # next offset to hand out
        self.acked = 0  # next offset after the last ack (what a new owner starts from)
        self.expected = 0  # next sequence taken from the actor
        self.buffer: collections.deque[Record] = collections.deque()
        self.paused = False  # records past the buffer were dropped: seek when there is room
        self.seeking: int | None = None  # a seek to this offset was asked for
        self.dirty = False  # acked moved since the last commit

    def start_at(self, offset: int) -> None:
        self.started = True
        self.position = self.acked = self.expected = offset
        self.buffer.clear()
        self.paused = False
        self.seeking = None


class Group:
    def __init__(self, engine: DafkaEngine, name: str) -> None:
        self.engine = engine
        self.name = name
        self.members: list[Member] = []
        self.parts: dict[tuple[str, str], _Partition] = {}
        self.by_number: dict[tuple[str, int], _Partition] = {}
        self.topics: set[str] = set()
        self._actor: DafkaConsumer | None = None
        self._loop = asyncio.get_running_loop()
        self._inbox: list[DafkaRecord] = []
        self._inbox_lock = threading.Lock()
        self._buffer = max(2, engine.consume_batch)
        self._seeks: set[asyncio.Task[None]] = set()

    # --- membership ------------------------------------------------------------------

    async def join(self, member: Member) -> None:
        new_topics = [t for t in member.topics if t not in self.topics]
        if self._actor is None:
            self._actor = await asyncio.to_thread(
                DafkaConsumer, self.engine.consumer_config(), None, self._sink_thread
            )
        for topic in new_topics:
            self.topics.add(topic)
            await asyncio.to_thread(self._seek_all, topic, self._starts(topic, member.reset))
            await asyncio.to_thread(self._actor.subscribe, topic)
        self.members.append(member)
        self._rebalance()

    def _starts(self, topic: str, reset: str) -> list[tuple[str, int]]:
        """Where the partitions the network already has start for this group: at the
        group's commit, or past the head for `latest` (the others: earliest)."""
        committed = self.engine.offsets.committed(self.name, topic)
        heads = self.engine.observer.heads(topic)
        numbers = self.engine.partition_map
        starts: list[tuple[str, int]] = []
        for address, head in heads.items():
            start = committed.get(numbers.number(topic, address))
            if start is None and reset == "latest":
                start = head + 1
            if start is not None:
                starts.append((address, start))
        # Partitions only known by a commit (the stores have not answered yet).
        for number, offset in committed.items():
            known = numbers.address(topic, number)
            if known is not None and known not in heads:
                starts.append((known, offset))
        for address, offset in starts:
            self._start_part(topic, address, offset)
        return starts

    def _seek_all(self, topic: str, starts: list[tuple[str, int]]) -> None:
        assert self._actor is not None
        for address, offset in starts:
            self._actor.seek(topic, address, offset)

    def _start_part(self, topic: str, address: str, offset: int) -> None:
        part = self._part(topic, address)
        if part is not None and not part.started:
            part.start_at(offset)

    async def leave(self, member: Member) -> None:
        if member in self.members:
            self.members.remove(member)
        self._rebalance()
        if not self.members:
            await self.close()

    async def close(self) -> None:
        self.engine.forget_group(self)
        actor, self._actor = self._actor, None
        if actor is not None:
            await asyncio.to_thread(actor.close)
        for task in list(self._seeks):
            task.cancel()

    def _rebalance(self) -> None:
        members_of: dict[str, list[Member]] = {}
        for member in self.members:  # join order
            for topic in member.topics:
                members_of.setdefault(topic, []).append(member)
        by_topic: dict[str, list[_Partition]] = {}
        for part in self.parts.values():
            by_topic.setdefault(part.topic, []).append(part)
        for topic, parts in by_topic.items():
            members = members_of.get(topic, [])
            for index, part in enumerate(sorted(parts, key=lambda p: p.number)):
                owner = members[index % len(members)] if members else None
                if owner is not part.owner:
                    self._reassign(part, owner)
        for member in self.members:
            member.wake()

    def _reassign(self, part: _Partition, owner: Member | None) -> None:
        previous = part.owner
        part.owner = owner
        if previous is not None:
            previous.owned.discard(part)
        if owner is not None:
            owner.owned.add(part)
        if part.started and part.position > part.acked:
            # Handed out and not acked: the new owner gets them again.
            redelivered = part.position - part.acked
            part.position = part.expected = part.acked
            part.buffer.clear()
            self._seek(part)
            log.info(
                "partition reassigned, unacked records delivered again",
                group=self.name,
                topic=part.topic,
                partition=part.number,
                records=redelivered,
            )

    # --- records from the actor ---------------------------------------------------------

    def _sink_thread(self, record: DafkaRecord) -> None:
        with self._inbox_lock:
            first = not self._inbox
            self._inbox.append(record)
        if first:
            self._loop.call_soon_threadsafe(self._drain_inbox)

    def _part(self, topic: str, address: str) -> _Partition | None:
        part = self.parts.get((topic, address))
        if part is None:
            number = self.engine.partition_map.number(topic, address)
            if number < 0:
                return None
            part = _Partition(topic, address, number)
            self.parts[(topic, address)] = part
            self.by_number[(topic, number)] = part
            self._rebalance()
        return part

    def _drain_inbox(self) -> None:
        with self._inbox_lock:
            records, self._inbox = self._inbox, []
        woken: set[Member] = set()
        limit = self._buffer
        for rec in records:
            part = self._part(rec.subject, rec.partition)
            if part is None:
                continue
            if not part.started:
                part.start_at(rec.sequence)
            seq = rec.sequence
            if seq != part.expected:
                if seq > part.expected and part.seeking != part.expected:
                    # Ahead of us: records we dropped, or the stream before a rewind.
                    if len(part.buffer) <= limit // 2:
                        self._seek(part)
                    else:
                        part.paused = True
                continue
            if len(part.buffer) >= limit:
                part.paused = True
                continue
            part.buffer.append(Record(part.topic, part.number, seq, None, rec.content, None))
            part.expected = seq + 1
            if part.owner is not None:
                woken.add(part.owner)
        for member in woken:
            member.wake()

    def _seek(self, part: _Partition) -> None:
        """Have the actor deliver `part` again from `part.expected` (it FETCHes it)."""
        part.paused = False
        part.seeking = part.expected
        actor = self._actor
        if actor is None:
            return
        task = self._loop.create_task(
            asyncio.to_thread(actor.seek, part.topic, part.address, part.expected)
        )
        self._seeks.add(task)
        task.add_done_callback(self._seek_done)

    def _seek_done(self, task: asyncio.Task[None]) -> None:
        self._seeks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("seek failed", group=self.name, error=str(task.exception()))

    # --- members' side ------------------------------------------------------------------

    def take(self, member: Member) -> Record | None:
        for part in member.rotation():
            if part.buffer:
                record = part.buffer.popleft()
                part.position = record.offset + 1
                if part.paused and len(part.buffer) <= self._buffer // 2:
                    self._seek(part)
                return record
        return None

    def ack(self, member: Member, topic: str, number: int, offset: int) -> None:
        part = self.by_number.get((topic, number))
        if part is None or part.owner is not member:
            raise AckError(NOT_ASSIGNED)
        part.acked = offset + 1
        part.dirty = True

    def pending_commits(self) -> list[tuple[str, int, int]]:
        """(topic, partition, next offset) acked since the last call."""
        out = []
        for part in self.parts.values():
            if part.dirty:
                part.dirty = False
                out.append((part.topic, part.number, part.acked))
        return out


class Member(Consumer):
    """One session's consumer: a member of a group on this gateway."""

    def __init__(
        self, engine: DafkaEngine, group: Group, name: str, topics: Sequence[str], reset: str
    ) -> None:
        self._engine = engine
        self.group = group
        self.name = name
        self.topics = list(dict.fromkeys(topics))
        self.reset = reset
        self.owned: set[_Partition] = set()
        self.join_order = next(_joins)
        self._turn = 0
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self._close_task: asyncio.Task[None] | None = None
        # Called once closed (the engine forgets the member then).
        self.on_closed: Callable[[Member], None] | None = None

    def rotation(self) -> list[_Partition]:
        parts = sorted(self.owned, key=lambda p: (p.topic, p.number))
        if not parts:
            return parts
        self._turn = (self._turn + 1) % len(parts)
        return parts[self._turn :] + parts[: self._turn]

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next(self, timeout: float | None) -> Record | None:
        if self._closed:
            raise ConsumeError(CLOSED)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            record = self.group.take(self)
            if record is not None:
                self._engine.stats.incr(Stats.CONSUMED)
                return record
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return None
            self._waiter = loop.create_future()
            try:
                async with asyncio.timeout(remaining):
                    await self._waiter
            except TimeoutError:
                return None
            finally:
                self._waiter = None
            if self._closed:
                raise ConsumeError(CLOSED)

    def ack(self, topic: str, partition: int, offset: int) -> None:
        if self._closed:
            raise AckError(CLOSED)
        self.group.ack(self, topic, partition, offset)
        self._engine.stats.incr(Stats.ACKED)

    async def close(self) -> None:
        if self._close_task is None:
            self._closed = True
            self.wake()
            self._close_task = asyncio.get_running_loop().create_task(self._close())
        await asyncio.shield(self._close_task)

    async def _close(self) -> None:
        try:
            await self._engine.commit_now()
        finally:
            await self.group.leave(self)
            if self.on_closed is not None:
                self.on_closed(self)
