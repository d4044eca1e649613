"""Consumer groups on Dafka, inside one gateway.

Dafka has no groups: a consumer gets every partition of its topics. Here one Dafka
consumer actor per group reads the group's topics, and the group hands each partition to
one member at a time:

- Members subscribed to a topic share its partitions round-robin in join order; every join
  or leave reassigns at once (no broker round trip: milliseconds).
- A partition whose owner changes restarts from the group's acked position, so what the
  old owner was handed and did not ack is delivered again (at least once). The old owner's
  later acks of that partition are refused, as librdkafka refuses them after a revoke.
- Each partition has about its share of records on their way to its owner (buffered or
  granted to the reader, `reader.py`, which only fetches what there is room for): the
  group's `dafka.group_buffer` split equally among the most partitions it has read, at
  least MIN_SHARE and at most gateway.consume_batch (credit granted under a larger share
  is taken back as partitions are found, and a take grants more only within the buffer,
  all partitions together, or MIN_SHARE to a partition with nothing on its way). A take
  grants more once half the share is left, or less while many partitions hold records.
  Unbounded by the partition count, a group reading 1,000 partitions held up to 500
  records of each.
- A partition starts at the group's committed offset; without one, at `auto.offset.reset`:
  earliest (the oldest record the stores keep) or latest (after the head known when the
  member joined); partitions found later start at their beginning.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import structlog

from backends.base import AckError, Consumer, Record, Stats
from backends.dafka.envelope import unwrap
from backends.dafka.reader import Reader

if TYPE_CHECKING:
    from backends.dafka.engine_view import GroupsEngine as DafkaEngine

log = structlog.get_logger(__name__)

# The fewest records a partition may have on their way, however many partitions share the
# group's buffer: fewer would make every few records a grant and a fetch.
MIN_SHARE = 16

NOT_ASSIGNED = "Local: Erroneous state"
CLOSED = "Consumer closed"
_joins = itertools.count()
_ready_tokens = itertools.count(1)
# A partition's generation, new at every (re)start: unique in the process, not per group.
# The reader's cursors are keyed by the group's name, so a group closed and made again at
# once (a client's reconnect) took records still on their way for the old one, numbered
# from 1 again, for its own: they moved its position past records it never delivered.
_generations = itertools.count(1)


class _Partition:
    __slots__ = (
        "acked",
        "address",
        "buffer",
        "committed",
        "credit",
        "dirty",
        "expected",
        "generation",
        "number",
        "owner",
        "position",
        "ready",
        "started",
        "topic",
    )

    def __init__(self, topic: str, address: str, number: int) -> None:
        self.topic = topic
        self.address = address
        self.number = number
        self.owner: Member | None = None
        self.started = False  # positioned (a commit, a reset, or a rewind)
        self.position = 0  # next offset to hand out
        self.acked = 0  # next offset after the last ack (what a new owner starts from)
        self.expected = 0  # next offset to buffer (from the reader or in process)
        # The contents (as on the wire: `envelope.unwrap` gives key and value) of the
        # records at offsets `position`, `position + 1`, ...: the Record is built when a
        # member takes one. Built as they came, in process, one per group, they were a
        # third of what 1,000 topics added per record produced; records a restart drops
        # (rebalance, rewind) are then never built at all.
        self.buffer: collections.deque[bytes] = collections.deque()
        self.credit = 0  # records the reader may still deliver without a new grant
        self.generation = 0  # new at every (re)start: older records are stale
        self.dirty = False  # acked moved since the last commit
        self.committed = -1  # the offset last handed to a commit
        # Non-zero while the owner's ready queue holds this partition: the token of that
        # entry (older entries, left by a change of owner, are skipped).
        self.ready = 0


class Group:
    def __init__(self, engine: DafkaEngine, name: str) -> None:
        self.engine = engine
        self.name = name
        self.members: list[Member] = []
        self.parts: dict[tuple[str, str], _Partition] = {}
        self.by_number: dict[tuple[str, int], _Partition] = {}
        self._parts_of: dict[str, list[_Partition]] = {}  # by topic, as found
        self.topics: set[str] = set()
        self._reader: Reader = engine.reader
        self._loop = asyncio.get_running_loop()
        self._most = max(2, engine.consume_batch)  # a partition's share at most
        self._budget = engine.settings.group_buffer
        self._share = self._most  # records a partition may have on their way
        self._shared_by = 0  # the partition count `_share` was computed for
        self._reclaimed_at = self._most  # the share credit above was last taken back at
        # Records buffered or granted, all partitions together (each one's len(buffer) +
        # credit): what a member's take may grant more of only within the budget.
        self.held = 0
        # Until then, partitions the reader finds start past their head for a `latest`
        # group: the stores' answers to the join's GET_HEADS (existing partitions).
        self._latest_until = 0.0

    # --- membership ------------------------------------------------------------------

    async def join(self, member: Member, heads_known: bool = False) -> None:
        """`heads_known`: the observer holds every store's answer for the member's topics
        (partitions found later are new); else, for a `latest` member, those found within
        the settling time are taken for existing ones, started past their head."""
        if member.reset == "latest" and not heads_known:
            self._latest_until = self._loop.time() + self.engine.settle
        # Shared by the partitions known already before any starts: the first would
        # otherwise get the whole buffer.
        heads = self.engine.observer.heads
        self._share_among(
            len(self.parts) + sum(len(heads(t)) for t in member.topics if t not in self.topics)
        )
        for topic in member.topics:
            if topic in self.topics:
                continue
            self.topics.add(topic)
            self._start_known(topic, member.reset)
            self.engine.subscribe(self, topic)
        self.members.append(member)
        self._rebalance()

    def _share_among(self, count: int) -> None:
        """Each partition's share of the group's buffer, for `count` partitions (when more
        than the most so far). Credit granted under a larger share is taken back each time
        the share has fallen by a quarter: the partitions found first, granted much of the
        buffer while few shared it, would keep it (1,000 partitions found one by one, a
        member taking from each: 90,000 records held against 50,000)."""
        if count <= self._shared_by:
            return
        self._shared_by = count
        share = self._share = min(self._most, max(MIN_SHARE, self._budget // count))
        if share * 4 <= self._reclaimed_at * 3:
            self._reclaimed_at = share
            for part in self.parts.values():
                cut = min(part.credit, len(part.buffer) + part.credit - share)
                if part.started and cut > 0:
                    part.credit -= cut
                    self.held -= cut
                    self._reader.grant((self.name, part.topic, part.address), -cut)

    def _start_known(self, topic: str, reset: str) -> None:
        """Position the partitions the network already has: at the group's commit, else
        at 0 (earliest: the oldest record kept) or past the head (latest); the others
        start when the reader finds them."""
        committed = self.engine.offsets.committed(self.name, topic)
        heads = self.engine.observer.heads(topic)
        numbers = self.engine.partition_map
        for address, head in heads.items():
            part = self._part(topic, address)
            if part is None or part.started:
                continue
            start = committed.get(part.number)
            if start is None:
                start = head + 1 if reset == "latest" else 0
            self._start(part, start)
        # Partitions only known by a commit (the stores have not answered yet).
        for number, offset in committed.items():
            known = numbers.address(topic, number)
            if known is not None and known not in heads:
                part = self._part(topic, known)
                if part is not None and not part.started:
                    self._start(part, offset)

    def _start(self, part: _Partition, offset: int, credit: int | None = None) -> None:
        """(Re)position `part` at `offset`: everything buffered or on its way is dropped.
        `credit`: records it may have on their way until a member takes one (its share
        by default)."""
        part.started = True
        part.position = part.acked = part.expected = offset
        self.held -= len(part.buffer) + part.credit
        part.buffer.clear()
        part.generation = next(_generations)
        part.credit = self._share if credit is None else min(credit, self._share)
        self.held += part.credit
        # `jump`: a position below the oldest record the stores keep (retention took
        # it, while the group was away) restarts at that record, as Kafka's
        # auto.offset.reset does; it used to wait for records no store would ever send.
        self._reader.start(
            (self.name, part.topic, part.address),
            part.topic,
            part.address,
            offset,
            part.credit,
            part.generation,
            jump=True,
        )

    def writer_failed(self, topic: str, address: str) -> None:
        """The writer of this gateway's partition `address` failed: the records it handed
        to this group in process may never be stored, and its replacement writes others at
        their offsets. Restart at the last ack, or where the stores' records end if that is
        lower (acks of records taken in process, never stored): the reader brings what the
        stores hold from there on, the replacement's records included."""
        part = self.parts.get((topic, address))
        if part is not None and part.started:
            self._start(part, self.engine.committable(topic, address, part.acked))

    def topic_deleted(self, topic: str) -> None:
        """The topic was deleted (rafka-topics): its records are gone, and its offsets
        with them. Restart its partitions from the oldest record the stores will keep
        (what is written next): a position below it would wait for records that never
        come."""
        for part in self.parts.values():
            if part.topic == topic and part.started:
                self._start(part, 0)
                part.dirty = False
                part.committed = -1  # the topic's offsets went with it

    async def leave(self, member: Member) -> None:
        if member in self.members:
            self.members.remove(member)
        self._rebalance()
        if not self.members:
            await self.close()

    async def close(self) -> None:
        self.engine.forget_group(self)
        for topic in self.topics:
            self.engine.unsubscribe(self, topic)
        for part in self.parts.values():
            self._reader.drop((self.name, part.topic, part.address))

    def _rebalance(self) -> None:
        members_of: dict[str, list[Member]] = {}
        for member in self.members:  # join order
            for topic in member.topics:
                members_of.setdefault(topic, []).append(member)
        rewound: list[tuple[_Partition, int]] = []
        for topic, parts in self._parts_of.items():
            self._assign_topic(parts, members_of.get(topic, []), rewound)
        for member in self.members:
            member.wake()
        self._log_rewound(rewound)

    def _assign_topic(
        self, parts: list[_Partition], members: list[Member], rewound: list[tuple[_Partition, int]]
    ) -> None:
        """A topic's partitions round-robin by number among `members` (join order)."""
        for index, part in enumerate(sorted(parts, key=lambda p: p.number)):
            owner = members[index % len(members)] if members else None
            if owner is not part.owner:
                self._reassign(part, owner, rewound)

    def _reassign(
        self, part: _Partition, owner: Member | None, rewound: list[tuple[_Partition, int]]
    ) -> None:
        """Give `part` to `owner` (None: nobody reads its topic now); records handed out
        and not acked go again to whoever owns it next: (part, count) onto `rewound`."""
        previous = part.owner
        part.owner = owner
        if previous is not None:
            previous.disown(part)
        if owner is not None:
            owner.own(part)
        if part.started and part.position > part.acked:
            rewound.append((part, part.position - part.acked))
            self._start(part, part.acked)

    def _log_rewound(self, rewound: list[tuple[_Partition, int]]) -> None:
        """One line for a rebalance, not one per partition: a member of 1,000 topics that
        left wrote 1,000."""
        if rewound:
            log.info(
                "partitions reassigned, unacked records delivered again",
                group=self.name,
                partitions=len(rewound),
                records=sum(count for _, count in rewound),
                first=[f"{part.topic}:{part.number}" for part, _ in rewound[:3]],
            )

    def _part(self, topic: str, address: str) -> _Partition | None:
        part = self.parts.get((topic, address))
        if part is None:
            number = self.engine.partition_map.number(topic, address)
            if number < 0:
                return None
            part = _Partition(topic, address, number)
            self.parts[(topic, address)] = part
            self.by_number[(topic, number)] = part
            self._parts_of.setdefault(topic, []).append(part)
            self._share_among(len(self.parts))
            self._assign_new(part)
        return part

    def _assign_new(self, part: _Partition) -> None:
        """Give a partition just found its owner. With at most one member on its topic,
        every other partition of the topic already has the owner _rebalance would give
        them, so only this one is assigned (constant time: a group that meets a topic of
        P partitions no longer does P whole rebalances); with more, its topic's (the
        round-robin by partition number may move others of the topic, and only those: a
        whole rebalance for each partition found, 4,000 of them over 1,000 topics, held
        the loop 9 s)."""
        members = [member for member in self.members if part.topic in member.topic_set]
        if len(members) > 1:
            rewound: list[tuple[_Partition, int]] = []
            self._assign_topic(self._parts_of[part.topic], members, rewound)
            for member in members:
                member.wake()
            self._log_rewound(rewound)
            return
        if members:
            self._reassign(part, members[0], [])  # found just now: nothing handed out
            members[0].wake()

    # --- events from the reader (loop thread) -----------------------------------------

    def on_head(self, topic: str, address: str, head: int) -> None:
        part = self._part(topic, address)
        if part is None or part.started:
            return
        start = self.engine.offsets.committed(self.name, topic).get(part.number)
        if start is None:
            start = head + 1 if self._loop.time() < self._latest_until else 0
        # Found one by one (a topic's first records, a new topic of a pattern): each
        # found later gets a smaller share, and the first would keep the whole buffer's
        # credit until spent. Its share comes with the first take.
        self._start(part, start, MIN_SHARE)

    def on_record(self, topic: str, address: str, seq: int, content: bytes, gen: int) -> None:
        part = self.parts.get((topic, address))
        if part is None or gen != part.generation:
            return  # delivered before a rewind
        if seq != part.expected:
            if seq < part.expected:
                # A record taken in process that the reader fetched before it heard of
                # the take (`Reader.took`): the credit both spent once, at the take here
                # and for this answer there.
                return
            part.credit -= 1
            if not (part.expected == part.position == part.acked and seq > part.expected):
                self.held -= 1  # its credit spent, nothing buffered
                return
            # The stores' oldest record: retention took the ones before.
            part.position = part.acked = seq
        else:
            part.credit -= 1
        part.buffer.append(content)
        part.expected = seq + 1
        self._notify(part)

    def on_published(self, topic: str, address: str, first: int, contents: list[bytes]) -> None:
        """This gateway's writer of `address` handed records `first`, `first + 1`, ... to
        its publisher: the ones that are the partition's next, within the credit the
        reader has not spent yet, are buffered now, with no thread or network hop (see
        docs/dafka-engine.md, "Latency"). They spend the credit here, and the reader is
        told (`Reader.took`, once per loop pass for every partition: `engine.took`), so
        that it moves the partition's position past them and does not fetch them."""
        part = self.parts.get((topic, address))
        if part is None or not part.started:
            return  # the reader finds the partition and starts it
        skip = part.expected - first
        room = part.credit
        if skip < 0 or skip >= len(contents) or room <= 0:
            return  # a gap first (the reader fills it), here already, or no room
        if skip == 0 and room >= len(contents):
            taken = len(contents)
            part.buffer.extend(contents)
        else:
            taken_contents = contents[skip : skip + room]
            taken = len(taken_contents)
            part.buffer.extend(taken_contents)
        part.credit -= taken
        part.expected += taken
        self.engine.took((self.name, topic, address), part.expected, taken, part.generation)
        self._notify(part)

    def _notify(self, part: _Partition) -> None:
        """`part` holds records: its owner serves it in turn."""
        owner = part.owner
        if owner is not None:
            if not part.ready:
                owner.queue(part)
            owner.wake()

    # --- members' side ------------------------------------------------------------------

    def take(self, member: Member) -> Record | None:
        """The next record of the partition at the front of the member's ready queue,
        which then goes to the back if it holds more (round-robin: none starves)."""
        part = member.next_ready_partition()
        if part is None:
            return None
        offset = part.position
        key, value = unwrap(part.buffer.popleft())
        part.position = offset + 1
        self.held -= 1
        self._after_take(member, part)
        return Record(part.topic, part.number, offset, key, value, None)

    def take_many(self, member: Member, limit: int, records: list[Record]) -> list[Record]:
        """Up to `limit` records after `records`: the ready partitions in turn, each
        drained as far as the limit allows (one left part-drained goes to the back)."""
        wanted = len(records) + limit
        while len(records) < wanted:
            part = member.next_ready_partition()
            if part is None:
                break
            buffer = part.buffer
            topic, number, offset = part.topic, part.number, part.position
            for _ in range(min(len(buffer), wanted - len(records))):
                key, value = unwrap(buffer.popleft())
                records.append(Record(topic, number, offset, key, value, None))
                offset += 1
            self.held -= offset - part.position
            part.position = offset
            self._after_take(member, part)
        return records

    def _after_take(self, member: Member, part: _Partition) -> None:
        if part.buffer:
            member.requeue(part)
        else:
            part.ready = 0
        # What the reader may still bring: its credit (less what was taken in process).
        share = self._share
        in_hand = len(part.buffer) + part.credit
        # Granted more once it holds half its share or less: the rest covers the member's
        # takes while the fetch is on its way. The other partitions holding records cover
        # them too (the member takes from each in turn), so with many of those the grant
        # waits for less to be left, the group's cover (half the largest share) split
        # among them: over 1,000 partitions, shares of 16 were fetched 8 records at a
        # time, and a fetch of 8 cost the store, the reader and the loop nearly what a
        # fetch of hundreds does.
        if in_hand > share - share // 2:
            return
        ready = member.ready_count()  # only then: most takes stop above
        if ready > 1 and in_hand > self._most // 2 // ready:
            return
        room = share - in_hand
        # Within the group's budget: the partitions found first, granted a larger share
        # while few shared the buffer, may still hold it. Past it, a partition with
        # records to take or coming waits (it is taken from again), and one with none
        # gets MIN_SHARE: it is never left without records on their way.
        free = self._budget - self.held
        if room > free:
            if not part.buffer and part.credit <= 0:
                room = max(free, min(room, MIN_SHARE))
            elif free >= share // 2:
                room = free
            else:
                return
        part.credit += room
        self.held += room
        self._reader.grant((self.name, part.topic, part.address), room)

    def ack(self, member: Member, topic: str, number: int, offset: int) -> None:
        part = self.by_number.get((topic, number))
        if part is None or part.owner is not member:
            raise AckError(NOT_ASSIGNED)
        # Never past what was handed out: an ack of an offset past it (a typo, another
        # topic's offset) was committed, and the group skipped every record up to it.
        part.acked = min(offset + 1, part.position)
        part.dirty = True

    def commits_held_back(self, member: Member) -> bool:
        """An ack on a partition `member` owns is not committed yet: no store holds the
        records it covers. (The other members' acks are theirs to wait for: they keep
        acking records taken before the stores have them.)"""
        return any(part.dirty and part.owner is member for part in self.parts.values())

    def pending_commits(self) -> list[tuple[str, int, int]]:
        """(topic, partition, next offset) acked since the last call."""
        out = []
        committable = self.engine.committable
        for part in self.parts.values():
            if part.dirty:
                # Not past what a store holds of a partition this gateway writes: records
                # can be taken before a store has them (in process or live), and one lost
                # in a crash has its offset written again after the restart, which a
                # commit past it would skip. Committed once the store has it.
                offset = committable(part.topic, part.address, part.acked)
                part.dirty = offset != part.acked
                if offset != part.committed:
                    part.committed = offset
                    out.append((part.topic, part.number, offset))
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
        self.topic_set = frozenset(self.topics)  # membership in constant time
        self.reset = reset
        self.owned: set[_Partition] = set()
        # Owned partitions holding records, in turn: (token, partition); an entry whose
        # token is no longer its partition's `ready` is stale (skipped, never served).
        self._ready: collections.deque[tuple[int, _Partition]] = collections.deque()
        self.join_order = next(_joins)
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self._close_task: asyncio.Task[None] | None = None
        # Called once closed (the engine forgets the member then).
        self.on_closed: Callable[[Member], None] | None = None

    def own(self, part: _Partition) -> None:
        self.owned.add(part)
        if part.buffer and not part.ready:
            self.queue(part)

    def disown(self, part: _Partition) -> None:
        self.owned.discard(part)
        part.ready = 0  # its entry here is stale now

    def queue(self, part: _Partition) -> None:
        """Put an owned partition that holds records at the back of the ready queue."""
        ready = self._ready
        if len(ready) > 2 * len(self.owned) + 64:  # stale entries of partitions moved away
            self._ready = ready = collections.deque(
                entry for entry in ready if entry[0] == entry[1].ready and entry[1].owner is self
            )
        part.ready = token = next(_ready_tokens)
        ready.append((token, part))

    def requeue(self, part: _Partition) -> None:
        """Back of the queue for a partition just served that holds more."""
        self._ready.append((part.ready, part))

    def ready_count(self) -> int:
        """About how many owned partitions hold records (stale entries included)."""
        return len(self._ready)

    def next_ready_partition(self) -> _Partition | None:
        """The partition at the front of the ready queue that holds records (taken off
        the queue; the caller requeues it or clears its `ready`), or None."""
        ready = self._ready
        while ready:
            token, part = ready.popleft()
            if token != part.ready or part.owner is not self:
                continue  # stale: the partition moved, or has a newer entry
            if part.buffer:
                return part
            part.ready = 0  # emptied by a restart (rewind, reassignment)
        return None

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def next_ready(self) -> Record | None:
        if self._closed:
            return None
        record = self.group.take(self)
        if record is not None:
            self._engine.stats.incr(Stats.CONSUMED)
        return record

    def take_ready(self, limit: int) -> list[Record]:
        return [] if self._closed else self._gather([], limit)

    def _gather(self, records: list[Record], limit: int) -> list[Record]:
        held = len(records)
        records = self.group.take_many(self, limit - held, records)
        if len(records) > held:
            self._engine.stats.incr(Stats.CONSUMED, len(records) - held)
        return records

    async def next(self, timeout: float | None) -> Record | None:
        if self._closed:
            return None
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
                return None

    def ack(self, topic: str, partition: int, offset: int) -> None:
        if self._closed:
            raise AckError(CLOSED)
        self.group.ack(self, topic, partition, offset)
        self._engine.stats.incr(Stats.ACKED)

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        if self._close_task is None:
            self._closed = True
            self.wake()
            self._close_task = asyncio.get_running_loop().create_task(self._close())
        await asyncio.shield(self._close_task)

    async def _close(self) -> None:
        try:
            # Its last acks are often of records taken before a store had them (in
            # process): committed once a store has them, within a bound.
            await self._engine.commit_now(self._engine.close_commit_wait, self.group, self)
        finally:
            await self.group.leave(self)
            if self.on_closed is not None:
                self.on_closed(self)
