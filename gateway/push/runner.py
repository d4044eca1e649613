"""One running subscription: a consumer of its group, partition lanes, acks, dead letters.

`SubscriptionRunner.run()` is one task that owns everything of the subscription: the
engine consumer, the HTTP client session, the dead-letter producer and one task per
partition with records to deliver (in an asyncio.TaskGroup). Cancelling it stops them
all; the consumer is closed (committing what was acked) before it returns.

Order and memory: records of one partition go through one lane, one after the other, and
are acked in offset order as soon as each is delivered or dead-lettered (an ack never
waits for the pump's next(), on any engine: base.Consumer.ack); lanes of different
partitions run side by side. At most `concurrency` records are held at once (a slot is
taken before the consumer is asked for a record, and given back after the record's ack).
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
from dataclasses import dataclass, field

import aiohttp
import structlog

from backends.base import (
    AckError,
    ConsumeError,
    Consumer,
    ConsumerCreationError,
    Engine,
    ProduceError,
    Producer,
    ProducerCreationError,
    Record,
    Stats,
)
from gateway.push.delivery import Deliverer, Outcome, backoff, payload
from gateway.push.spec import RetryPolicy, Subscription

log = structlog.get_logger("rafka.gateway.push")

# Retrying what the engine refuses (a consumer, a dead-letter write): how long to wait.
ENGINE_RETRY = RetryPolicy(attempts=1, backoff_base=0.2, backoff_max=5.0, jitter=0.5)
# Bound on one wait for a record.
POLL = 0.2
# Bound on one flush of a dead letter; a letter not durable by then is written again.
DEAD_LETTER_FLUSH = 10.0


COUNTER_KINDS = ("delivered", "failed_attempts", "dead_lettered", "errors")


def counter_names(name: str) -> dict[str, str]:
    """The stats counters of subscription `name` (HGETALL stats): `push.<name>.<kind>`."""
    return {kind: f"push.{name}.{kind}" for kind in COUNTER_KINDS}


def counter_of(stat: str) -> tuple[str, str] | None:
    """(subscription, kind) of a counter `counter_names` made; None for another stat."""
    if not stat.startswith("push."):
        return None
    name, _, kind = stat.removeprefix("push.").rpartition(".")
    return (name, kind) if name and kind in COUNTER_KINDS else None


@dataclass
class _Lane:
    """Records of one partition waiting for their turn, and whether a task runs them."""

    records: collections.deque[Record] = field(default_factory=collections.deque)
    running: bool = False


@dataclass
class _Flow:
    """What the pump and the lanes share: the records held, the pump's wake-up."""

    held: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def done(self) -> None:
        """A lane finished a record (delivered or dead-lettered, then acked): a free slot."""
        self.held -= 1
        self.wake.set()


class SubscriptionRunner:
    def __init__(self, subscription: Subscription, engine: Engine, stats: Stats) -> None:
        self.subscription = subscription
        self._engine = engine
        self._stats = stats
        self.counters = counter_names(subscription.name)
        self._random = random.Random()
        self._producer: Producer | None = None
        self._consume_failures = 0

    async def run(self) -> None:
        """Deliver until cancelled."""
        sub = self.subscription
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:
            deliverer = Deliverer(sub, http, self._stats, self.counters["failed_attempts"])
            try:
                failures = 0
                while True:
                    try:
                        consumer = await self._engine.consumer(
                            sub.group, f"push-{sub.name}", [sub.topic], {}
                        )
                    except ConsumerCreationError as error:
                        failures += 1
                        self._error("cannot make the consumer", error)
                        await asyncio.sleep(backoff(ENGINE_RETRY, failures, self._random))
                        continue
                    failures = 0
                    try:
                        await self._pump(consumer, deliverer)
                    finally:
                        await consumer.close()
            finally:
                if self._producer is not None:
                    await self._producer.close(DEAD_LETTER_FLUSH)

    def _error(self, what: str, error: BaseException) -> None:
        self._stats.incr(self.counters["errors"])
        log.error(what, subscription=self.subscription.name, error=str(error))

    async def _pump(self, consumer: Consumer, deliverer: Deliverer) -> None:
        """Hand records to partition lanes, `concurrency` at most at once; the lanes ack
        what they finish at once, while this task may be waiting in next()."""
        flow = _Flow()
        lanes: dict[tuple[str, int], _Lane] = {}
        async with asyncio.TaskGroup() as group:
            while True:
                if flow.held >= self.subscription.concurrency:
                    flow.wake.clear()
                    await flow.wake.wait()
                    continue
                record = await self._next(consumer)
                if record is None:
                    if consumer.closed:
                        # Closed under us (the engine stopped): next() would return None
                        # at once for ever. run() makes another consumer or backs off.
                        return
                    continue
                flow.held += 1
                lane = lanes.setdefault((record.topic, record.partition), _Lane())
                lane.records.append(record)
                if not lane.running:
                    lane.running = True
                    group.create_task(self._lane(lane, consumer, deliverer, flow))

    async def _next(self, consumer: Consumer) -> Record | None:
        """The next record or None. Cancelling it loses no record (base.Consumer.next)."""
        try:
            record = await consumer.next(POLL)
        except ConsumeError as error:
            self._consume_failures += 1
            self._error("consume failed", error)
            await asyncio.sleep(backoff(ENGINE_RETRY, self._consume_failures, self._random))
            return None
        self._consume_failures = 0
        return record

    async def _lane(
        self, lane: _Lane, consumer: Consumer, deliverer: Deliverer, flow: _Flow
    ) -> None:
        try:
            while lane.records:
                record = lane.records[0]
                outcome = await deliverer.deliver(record)
                if outcome.delivered:
                    self._stats.incr(self.counters["delivered"])
                else:
                    await self._dead_letter(record, outcome)
                lane.records.popleft()
                self._ack(consumer, record)
                flow.done()
        finally:
            lane.running = False

    def _ack(self, consumer: Consumer, record: Record) -> None:
        try:
            consumer.ack(record.topic, record.partition, record.offset)
        except AckError as error:
            # The partition went to another member of the group, which delivers from
            # the last ack: the record is delivered again there, not lost.
            self._error("ack refused", error)

    async def _dead_letter(self, record: Record, outcome: Outcome) -> None:
        """Write the record to the dead-letter topic and wait until it is durable."""
        sub = self.subscription
        letter = {
            **payload(record),
            "subscription": sub.name,
            "attempts": outcome.attempts,
            "errors": list(outcome.errors),
        }
        value = json.dumps(letter, separators=(",", ":")).encode()
        failures = 0
        while True:
            try:
                if await self._write_durably(record.key, value):
                    break
                problem: Exception = ProduceError("the dead letter was not written in time")
            except (ProducerCreationError, ProduceError) as error:
                problem = error
            failures += 1
            self._error(f"dead-letter write to {sub.dead_letter_topic} failed", problem)
            await asyncio.sleep(backoff(ENGINE_RETRY, failures, self._random))
        self._stats.incr(self.counters["dead_lettered"])
        log.warning(
            "record dead-lettered",
            subscription=sub.name,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            dead_letter_topic=sub.dead_letter_topic,
            errors=list(outcome.errors),
        )

    async def _write_durably(self, key: bytes | None, value: bytes) -> bool:
        """Produce one letter and flush it. The interface counts failed deliveries only
        server-wide: a failure anywhere during the flush counts as this letter's (it is
        then written again, a duplicate at worst, never a loss)."""
        if self._producer is None:
            self._producer = self._engine.producer(f"push-{self.subscription.name}")
        errors_before = self._stats.get(Stats.DELIVERY_ERRORS)
        self._producer.produce(self.subscription.dead_letter_topic, key, value)
        left = await self._producer.flush(DEAD_LETTER_FLUSH)
        return left == 0 and self._stats.get(Stats.DELIVERY_ERRORS) == errors_before
