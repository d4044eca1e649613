"""When a group asks the reader for more of a partition (`Group._after_take`): a partition
read alone is granted more once half its share is left, so that records keep coming while
the fetch is on its way; one read among many that hold records waits until little is left,
so that each fetch brings most of a share (the others keep the member busy meanwhile).
On a real tower and store; the grants are observed on the engine's own reader."""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import cast

from backends.dafka.config import Config
from backends.dafka.engine import DafkaEngine
from backends.dafka.groups import MIN_SHARE, Member
from tests.dafka.test_engine import WAIT, engine_on, network, run, take
from tests.dafka.test_local_delivery import check_held, found_and_filled, one_key_per_partition
from tests.support.waiting import wait_until_async

__all__ = ["network"]  # the fixture, used by name

PARTITIONS = 16
COVER = 50  # the group's cover: half the largest share, consume_batch


@dataclass(frozen=True)
class Grant:
    partition: int
    size: int
    held_before: int  # what the partition held or had on its way when it was granted more
    ready: int  # the member's partitions holding records then


def observe_grants(engine: DafkaEngine, member: Member) -> list[Grant]:
    """Every positive grant the group's takes make from now on (the reader still gets it)."""
    grants: list[Grant] = []
    reader = engine.reader
    grant: Callable[[Hashable, int], None] = reader.grant
    group = engine._groups["g"]

    def observed(cursor: Hashable, credit: int) -> None:
        if credit > 0:
            _, topic, address = cast(tuple[str, str, str], cursor)
            part = group.parts[(topic, address)]
            held = len(part.buffer) + part.credit - credit
            grants.append(Grant(part.number, credit, held, member.ready_count()))
        grant(cursor, credit)

    reader.grant = observed  # type: ignore[method-assign]
    return grants


async def found(engine: DafkaEngine, member: Member, keys: dict[int, bytes]) -> None:
    """Every partition found by the group (a record each, taken): shares of MIN_SHARE."""
    producer = engine.producer("finder")
    for number in range(PARTITIONS):
        producer.produce("t", keys[number], b"found")
    assert await producer.flush(WAIT) == 0
    got = await take(member, PARTITIONS)
    assert sorted(record.partition for record in got) == list(range(PARTITIONS))


def test_partitions_read_together_are_fetched_a_share_at_a_time(network: Config) -> None:
    """16 partitions with a backlog each, read in turn, with shares of MIN_SHARE (16): a
    partition is granted more once at most 3 records are left (the cover of 50 split
    among 16), where it was at 8 before (half its share), so each fetch brings about 13
    records instead of 8. Every record still comes once, in order."""
    keys = one_key_per_partition(PARTITIONS)
    backlog = 200

    async def body() -> None:
        async with engine_on(
            network, 2 * COVER, partitions=PARTITIONS, group_buffer=PARTITIONS * MIN_SHARE
        ) as engine:
            member = await engine.consumer("g", "c", ["t"], {})
            await found(engine, member, keys)
            producer = engine.producer("s1")
            for number in range(PARTITIONS):
                producer.produce_many("t", keys[number], [b"%d" % number] * backlog)
            assert await producer.flush(WAIT) == 0
            await wait_until_async(
                functools.partial(found_and_filled, engine._groups["g"].parts, PARTITIONS),
                WAIT,
                "every partition's grant filled from the backlog",
            )
            grants = observe_grants(engine, member)
            got = await take(member, backlog * PARTITIONS)
            check_held(engine, "g")
            for number in range(PARTITIONS):
                offsets = [r.offset for r in got if r.partition == number]
                assert offsets == list(range(1, backlog + 1)), f"partition {number}"
            together = [g for g in grants if g.ready >= PARTITIONS - 1]
            assert len(together) >= PARTITIONS, f"grants while read together: {grants}"
            early = [g for g in together if g.held_before > COVER // (PARTITIONS - 1)]
            assert not early, f"granted more with more than the cover left: {early}"
            await member.close()

    run(body())


def test_a_partition_read_alone_is_granted_more_before_it_runs_dry(network: Config) -> None:
    """Of the group's 16 partitions only one holds records: the others cover nothing, so
    it is granted more with half its share (32) still in hand, as the group's only
    partition would be, and the member does not wait for each fetch (all grants but the
    first, which follows the partition's start). The group's buffer has room for every
    share: a grant waits for none."""
    keys = one_key_per_partition(PARTITIONS)
    share = 64
    backlog = 10 * share

    async def body() -> None:
        async with engine_on(
            network, share, partitions=PARTITIONS, group_buffer=2 * share * PARTITIONS
        ) as engine:
            member = await engine.consumer("g", "c", ["t"], {})
            await found(engine, member, keys)
            grants = observe_grants(engine, member)
            producer = engine.producer("s1")
            producer.produce_many("t", keys[0], [b"hot"] * backlog)
            assert await producer.flush(WAIT) == 0
            got = await take(member, backlog)
            assert [r.offset for r in got] == list(range(1, backlog + 1))
            mine = [g for g in grants if g.partition == 0]
            assert len(mine) >= backlog // share, f"grants of partition 0: {mine}"
            dry = [g for g in mine if g.held_before <= 0]
            assert not dry, f"granted more only once drained: {dry}"
            halves = [g for g in mine if g.held_before >= share // 2]
            assert len(halves) >= len(mine) - 1, f"granted later than at half: {mine}"
            await member.close()

    run(body())
