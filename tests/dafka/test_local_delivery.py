"""Records a gateway writes reach its own consumer groups in process (`Group.on_published`),
before the reader brings them over TCP; the reader's copies are dropped by offset. On a
real tower and store: order, each record once, the buffer bound and rebalances hold
whichever path a record came by first."""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Iterable, Mapping
from pathlib import Path

import structlog
import zmq
from zmq.utils.monitor import recv_monitor_message

from backends.base import Producer, Record
from backends.dafka.config import Config
from backends.dafka.engine import DafkaEngine
from backends.dafka.groups import MIN_SHARE, Member, _Partition
from backends.dafka.partitions import make_partitioner
from backends.dafka.store import Store
from backends.dafka.tower import Tower
from tests.dafka.stores import other_db
from tests.dafka.test_engine import WAIT, engine_on, network, run, take
from tests.support.consuming import by_partition
from tests.support.waiting import wait_until_async

__all__ = ["network"]  # the fixture, used by name


async def one_pass() -> None:
    """Let the callbacks already queued on the loop run (a writer hands what this pass
    produced to its publisher at the end of the pass), and nothing that a thread queues
    meanwhile: the reader's deliveries come on a later pass."""
    await asyncio.sleep(0)


def buffered(engine: DafkaEngine, group: str) -> int:
    return sum(len(part.buffer) for part in engine._groups[group].parts.values())


async def started(member: Member, engine: DafkaEngine) -> None:
    """The member's partition is found and positioned: one record came the reader's way."""
    producer = engine.producer("starter")
    producer.produce_many("t", None, [b"first"])
    [record] = await take(member, 1)
    assert record.value == b"first"


async def stored_and_taken(engine: DafkaEngine, value: bytes) -> tuple[Member, Producer]:
    """Group `g`'s member on `t` and a producer: `value` produced, stored (DUMP), taken."""
    member = await engine.consumer("g", "c", ["t"], {})
    producer = engine.producer("s1")
    producer.produce_many("t", None, [value])
    assert await producer.flush(WAIT) == 0
    assert [r.value for r in await take(member, 1)] == [value]
    return member, producer


def test_records_written_here_are_ready_in_the_same_loop_pass(network: Config) -> None:
    async def body() -> None:
        async with engine_on(network, partitions=1) as engine:
            member = await engine.consumer("g", "c", ["t"], {})
            await started(member, engine)
            producer = engine.producer("s1")
            producer.produce_many("t", None, [b"a", b"b", b"c"])
            await one_pass()
            got = member.take_ready(10)
            assert [r.value for r in got] == [b"a", b"b", b"c"], (
                "records this gateway wrote are not in its group's buffer one loop pass "
                "after they were handed to the publisher (no in-process delivery)"
            )
            assert [r.offset for r in got] == [1, 2, 3]
            # The reader's copies come later and are dropped: the next record is the next.
            producer.produce_many("t", None, [b"d"])
            [record] = await take(member, 1)
            assert (record.offset, record.value) == (4, b"d")
            assert await producer.flush(WAIT) == 0
            await member.close()

    run(body())


def test_each_record_once_and_in_order_in_every_group_whichever_path(network: Config) -> None:
    """Two groups on two partitions with a 20-record buffer: one takes as records come,
    the other only after everything was produced, so its credit runs out and the rest
    comes the reader's way (FETCHes) while the first group's came in process. A marker
    produced last must come right after the last record: no copy of an earlier one."""
    values = [b"%04d" % i for i in range(1200)]

    async def body() -> None:
        async with engine_on(network, consume_batch=20, partitions=1) as engine:
            fast = await engine.consumer("fast", "c", ["t"], {})
            slow = await engine.consumer("slow", "c", ["t"], {})
            await started(fast, engine)
            await started_in(slow)
            producer = engine.producer("s1")
            got: list[Record] = []
            for first in range(0, len(values), 3):
                producer.produce_many("t", None, values[first : first + 3])
                await one_pass()
                assert buffered(engine, "slow") <= 20, "the buffer bound holds in process"
                got += fast.take_ready(3)
            got += await take(fast, len(values) - len(got))
            late = await take(slow, len(values))
            producer.produce_many("t", None, [b"marker"])
            for records, member in ((got, fast), (late, slow)):
                assert [r.value for r in records] == values
                assert [r.offset for r in records] == list(range(1, len(values) + 1))
                [after] = await take(member, 1)
                assert after.value == b"marker", f"a copy came again: {after}"
            assert await producer.flush(WAIT) == 0
            await fast.close()
            await slow.close()

    async def started_in(member: Member) -> None:
        [record] = await take(member, 1)
        assert record.value == b"first"

    run(body())


def test_a_partition_moved_while_records_came_in_process_redelivers_from_the_ack(
    network: Config,
) -> None:
    """The first member takes records that came in process and acks only some; it leaves
    and the second member gets the partition: it starts at the ack (at least once), then
    every later record once and in order, in process again once it caught up."""

    async def body() -> None:
        async with engine_on(network, partitions=1) as engine:
            first = await engine.consumer("g", "c1", ["t"], {})
            second = await engine.consumer("g", "c2", ["t"], {})
            await started(first, engine)
            producer = engine.producer("s1")
            producer.produce_many("t", None, [b"a", b"b", b"c", b"d"])
            await one_pass()
            taken = first.take_ready(4)
            assert [r.value for r in taken] == [b"a", b"b", b"c", b"d"]
            first.ack("t", taken[1].partition, taken[1].offset)  # a and b
            producer.produce_many("t", None, [b"e"])  # on its way while the owner changes
            await first.close()
            producer.produce_many("t", None, [b"f"])
            again = await take(second, 4)
            assert [r.value for r in again] == [b"c", b"d", b"e", b"f"]
            assert [r.offset for r in again] == [3, 4, 5, 6]
            await wait_until_async(
                lambda: bool(second_caught_up(engine)),
                WAIT,
                "the new owner's partition never caught up with the live records",
            )
            producer.produce_many("t", None, [b"g", b"h"])
            await one_pass()
            assert [r.value for r in second.take_ready(2)] == [b"g", b"h"], (
                "after the move, records written here come in process again"
            )
            producer.produce_many("t", None, [b"i"])
            [record] = await take(second, 1)
            assert (record.offset, record.value) == (9, b"i")
            assert await producer.flush(WAIT) == 0
            await second.close()

    def second_caught_up(engine: DafkaEngine) -> bool:
        """The reader delivered up to the last record written: the next ones can come in
        process (they are the partition's next)."""
        [part] = engine._groups["g"].parts.values()
        return part.expected == 7

    run(body())


def test_a_member_leaving_many_partitions_unacked_is_one_log_line(network: Config) -> None:
    """Its partitions go to the member left, each from its last ack (at least once), and
    the operator reads one line for the rebalance, not one per partition."""
    topics = [f"t{n}" for n in range(5)]

    async def body() -> None:
        async with engine_on(network, partitions=1) as engine:
            first = await engine.consumer("g", "c1", topics, {})
            second = await engine.consumer("g", "c2", topics, {})
            producer = engine.producer("s1")
            for topic in topics:
                producer.produce_many(topic, None, [topic.encode()])
            taken = await take(first, len(topics), ack=False)  # the first joined owns all
            with structlog.testing.capture_logs() as logs:
                await first.close()
            again = await take(second, len(topics))
            assert (
                {r.value for r in again} == {r.value for r in taken} == {t.encode() for t in topics}
            )
            await second.close()
        moved = [line for line in logs if "reassigned" in line["event"]]
        assert len(moved) == 1, moved
        assert (moved[0]["partitions"], moved[0]["records"]) == (5, 5), moved[0]

    run(body())


def test_a_commit_never_passes_what_no_store_holds(dafka_config: Config, tower: Tower) -> None:
    """Records are taken before a store has them. Were the gateway to crash then, they
    would be lost and the next run would write other records at their offsets: a commit
    past them would make the group skip those. With the store gone, acks of records it
    never held are committed only once a store (a new one) holds them."""
    context: zmq.Context = zmq.Context.instance()

    async def body() -> None:
        store = Store(dafka_config, context)
        try:
            async with engine_on(dafka_config, partitions=1) as engine:
                member, producer = await stored_and_taken(engine, b"a")
                await engine.commit_now()
                assert engine.offsets.committed("g", "t") == {0: 1}
                await asyncio.to_thread(store.close)
                producer.produce_many("t", None, [b"b", b"c"])
                assert [r.value for r in await take(member, 2)] == [b"b", b"c"]
                await engine.commit_now()
                assert engine.offsets.committed("g", "t") == {0: 1}, (
                    "committed past records no store holds"
                )
                store = Store(dafka_config, context)  # fetches b and c from the gateway
                await wait_until_async(
                    lambda: engine.offsets.committed("g", "t") == {0: 3},
                    WAIT,
                    "the acks were not committed once a store held the records",
                )
                await member.close()
        finally:
            await asyncio.to_thread(store.close)

    run(body())


def test_a_member_leaving_right_after_its_acks_has_them_all_committed(network: Config) -> None:
    """Taken in process, the records are acked and the member leaves before a store has
    them: the leave waits (bounded) for the stores, so every ack is committed and the
    group's next member starts after them, with nothing delivered twice. (No periodic
    commit comes in between: only the leave commits.)"""

    async def body() -> None:
        async with engine_on(network, partitions=1, commit_interval=60) as engine:
            member = await engine.consumer("g", "c1", ["t"], {})
            await started(member, engine)
            producer = engine.producer("s1")
            producer.produce_many("t", None, [b"a", b"b", b"c"])
            await one_pass()
            taken = member.take_ready(3)
            assert [r.value for r in taken] == [b"a", b"b", b"c"]
            for record in taken:
                member.ack(record.topic, record.partition, record.offset)
            await member.close()
            assert engine.offsets.committed("g", "t") == {0: 4}
            producer.produce_many("t", None, [b"d"])
            after = await engine.consumer("g", "c2", ["t"], {})
            [record] = await take(after, 1)
            assert record.value == b"d", f"delivered again after a clean leave: {record}"
            await after.close()

    run(body())


def test_records_taken_from_a_writer_that_failed_give_way_to_its_replacements(
    dafka_config: Config, tower: Tower
) -> None:
    """Records handed to the writers' actor reach the group in process; the actor then
    dies before any store has them (no store runs; its death is stood for by closing it
    behind the engine's back, as in test_engine_writers). The replacement writer resumes
    where the stores' records end, so its records take the lost ones' offsets: the group
    must get them, not skip them as copies of what it already took."""
    context: zmq.Context = zmq.Context.instance()

    async def body() -> None:
        store = Store(dafka_config, context)
        try:
            async with engine_on(dafka_config, partitions=1) as engine:
                member, producer = await stored_and_taken(engine, b"kept")
                await asyncio.to_thread(store.close)
                producer.produce_many("t", None, [b"lost-1", b"lost-2"])
                taken = await take(member, 2)
                assert [(r.offset, r.value) for r in taken] == [(1, b"lost-1"), (2, b"lost-2")]
                engine.publisher().close(0)  # the actor dies: lost-1 and lost-2 with it
                producer.produce("t", None, b"refused")  # fails the writer at the hand-over
                await one_pass()
                store = Store(dafka_config, context)
                producer.produce_many("t", None, [b"new-1", b"new-2"])  # on a new actor
                got = await take(member, 2)
                assert [(r.offset, r.value) for r in got] == [(1, b"new-1"), (2, b"new-2")], (
                    "the replacement's records at the lost records' offsets were skipped"
                )
                await member.close()
        finally:
            await asyncio.to_thread(store.close)

    run(body())


def heads_only_at_subscribe(config: Config) -> Config:
    """The stores tell heads only when asked, and the reader asks only at subscribe: the
    heads of records written after that reach the reader from the writers' ACKs alone."""
    quiet = config.copy()
    quiet.set("consumer/heads_interval", "0")
    quiet.set("store/push_heads/interval", "0")
    return quiet


def test_a_partition_taken_over_after_records_came_in_process_starts_at_the_stores_head(
    dafka_config: Config, tower: Tower
) -> None:
    """The group took the records in process, so the reader never heard their heads;
    a member leaves without acking them, and the next one is handed them again from
    the stores at once (the restart tells the reader what the stores hold)."""
    config = heads_only_at_subscribe(dafka_config)

    async def body() -> None:
        store = Store(config, zmq.Context.instance())
        try:
            async with engine_on(config, partitions=1) as engine:
                first = await engine.consumer("g", "c1", ["t"], {})
                second = await engine.consumer("g", "c2", ["t"], {})
                await started(first, engine)
                producer = engine.producer("s1")
                producer.produce_many("t", None, [b"a", b"b", b"c"])
                await one_pass()
                assert [r.value for r in first.take_ready(3)] == [b"a", b"b", b"c"]
                assert await producer.flush(WAIT) == 0  # stored: their ACKs came
                await first.close()
                again = await take(second, 3)
                assert [(r.offset, r.value) for r in again] == [(1, b"a"), (2, b"b"), (3, b"c")]
                await second.close()
        finally:
            await asyncio.to_thread(store.close)

    run(body())


def connected(monitor: zmq.Socket, seen: set[bytes], endpoint: bytes) -> bool:
    """Wait (bounded) until the monitored socket connected to `endpoint`; every endpoint
    it connected to meanwhile goes into `seen`."""
    while endpoint not in seen and monitor.poll(int(WAIT * 1000)):
        event = recv_monitor_message(monitor)
        if event["event"] == zmq.EVENT_CONNECTED:
            seen.add(event["endpoint"])
    return endpoint in seen


def test_a_group_without_room_gets_the_rest_from_the_stores_never_from_the_writer(
    dafka_config: Config, tower: Tower, tmp_path: Path
) -> None:
    """The reader never connects to its own gateway's writers: their records reach the
    groups in process, and what a group had no room for is fetched from the stores once
    they hold it (the writers' ACKs tell the reader the heads). Every record comes once,
    in order; no copy of a record travels to the reader, and no copy of a lost record
    can pass for its replacement's (test above)."""
    context: zmq.Context = zmq.Context.instance()
    config = heads_only_at_subscribe(dafka_config)

    async def body() -> None:
        stores = [Store(config, context)]
        try:
            async with engine_on(config, consume_batch=4, partitions=1) as engine:
                monitor = engine.reader._sub.get_monitor_socket(zmq.EVENT_CONNECTED)
                try:
                    member = await engine.consumer("g", "c", ["t"], {})
                    await started(member, engine)
                    producer = engine.producer("s1")
                    values = [b"v%d" % n for n in range(40)]
                    producer.produce_many("t", None, values)  # 4 fit the group's buffer
                    got = await take(member, len(values))
                    assert [r.value for r in got] == values
                    assert [r.offset for r in got] == list(range(1, 41))
                    # Announced after the writers' actor: once the reader connected to
                    # it, it had heard the actor's beacon too.
                    stores.append(Store(other_db(config, tmp_path, "second"), context))
                    seen: set[bytes] = set()
                    second = f"tcp://127.0.0.1:{stores[-1].reader_port}".encode()
                    assert await asyncio.to_thread(connected, monitor, seen, second), (
                        f"the reader did not connect to a new store: {seen}"
                    )
                    writer = f"tcp://127.0.0.1:{engine.publisher().port}".encode()
                    assert writer not in seen, "the reader connected to its gateway's writer"
                finally:
                    engine.reader._sub.disable_monitor()
                    monitor.close()
                await member.close()
        finally:
            for store in stores:
                await asyncio.to_thread(store.close)

    run(body())


def test_a_group_reading_many_partitions_shares_its_buffer_among_them(network: Config) -> None:
    """`dafka.group_buffer` bounds what a group holds ahead of its members, all partitions
    together (each an equal share, at least MIN_SHARE): without it, a group reading 1,000
    partitions held up to `consume_batch` records of each. Whatever the share held back
    comes later, from the stores: every record once, each partition in order."""
    keys = [b"k%d" % n for n in range(32)]
    values = [b"%04d" % n for n in range(800)]

    async def body() -> None:
        async with engine_on(
            network, consume_batch=100, partitions=8, group_buffer=8 * MIN_SHARE
        ) as engine:
            member = await engine.consumer("g", "c", ["t"], {})
            producer = engine.producer("s1")
            for n, value in enumerate(values):
                producer.produce("t", keys[n % len(keys)], value)
                if n % 50 == 49:
                    await one_pass()
                    assert buffered(engine, "g") <= 8 * MIN_SHARE, "the group's bound holds"
            assert await producer.flush(WAIT) == 0
            parts = engine._groups["g"].parts.values()
            await wait_until_async(
                lambda: len(parts) == 8 and buffered(engine, "g") >= 8 * MIN_SHARE,
                WAIT,
                "the group's 8 partitions found, each one's share of its buffer filled",
            )
            assert [len(part.buffer) for part in parts] == [MIN_SHARE] * 8
            got = await take(member, len(values))
            check_held(engine, "g")
            for records in by_partition(got).values():
                assert [r.offset for r in records] == list(range(len(records)))
            assert sorted(r.value or b"" for r in got) == values
            await member.close()

    run(body())


def one_key_per_partition(partitions: int) -> dict[int, bytes]:
    """A key for each partition number, as the settings' partitioner places keys."""
    keys: dict[int, bytes] = {}
    partition = make_partitioner("consistent_random")
    for n in itertools.count():
        keys.setdefault(partition(b"k%d" % n, partitions), b"k%d" % n)
        if len(keys) == partitions:
            return keys
    raise AssertionError("unreachable")


def held_or_granted(parts: Iterable[_Partition]) -> list[int]:
    """What each partition holds or has granted the reader (credit counted when
    positive)."""
    return [len(part.buffer) + max(part.credit, 0) for part in parts]


def test_partitions_found_one_by_one_give_back_what_a_larger_share_granted(
    network: Config,
) -> None:
    """A member takes from each partition as the group finds it, so each is granted the
    share of its time: the first found, while few shared the buffer, much of it. Taken
    back as the share falls, so that once all are found the group holds about its buffer
    (within a third: credit is taken back each time the share has fallen by a quarter),
    not most of it in the first partitions."""
    partitions, budget = 8, 8 * MIN_SHARE
    keys = one_key_per_partition(partitions)

    async def body() -> None:
        async with engine_on(
            network, consume_batch=100, partitions=partitions, group_buffer=budget
        ) as engine:
            member = await engine.consumer("g", "c", ["t"], {})
            producer = engine.producer("s1")
            for number in range(partitions):
                producer.produce("t", keys[number], b"found")
                [record] = await take(member, 1)
                assert record.partition == number
            for _ in range(200):
                for number in range(partitions):
                    producer.produce("t", keys[number], b"v")
            assert await producer.flush(WAIT) == 0
            parts = engine._groups["g"].parts.values()
            await wait_until_async(
                lambda: buffered(engine, "g") >= budget,
                WAIT,
                "the group's buffer filled from the 1,600 records",
            )
            check_held(engine, "g")  # the group's own count is right
            held = held_or_granted(parts)
            assert sum(held) <= budget * 4 // 3, f"records held or granted: {held}"
            got = await take(member, 200 * partitions)
            assert [r.value for r in got] == [b"v"] * 200 * partitions
            check_held(engine, "g")
            await member.close()

    run(body())


def found_and_filled(parts: Mapping[tuple[str, str], _Partition], count: int) -> bool:
    """`count` partitions found, and the stores sent what each was granted."""
    return len(parts) == count and all(part.credit <= 0 for part in parts.values())


def check_held(engine: DafkaEngine, group: str) -> None:
    """Group `group`'s own count of the records it holds or has granted (which bounds
    what a take may grant) is right: its partitions' buffers and credit."""
    state = engine._groups[group]
    held = sum(len(part.buffer) + part.credit for part in state.parts.values())
    assert state.held == held, f"the group counts {state.held} records held, it holds {held}"


def test_partitions_found_one_by_one_over_a_backlog_stay_within_the_buffer(
    network: Config,
) -> None:
    """Each partition has a backlog when the group finds it, and the member takes one
    record as each is found: every take tops its partition up to the share of the time,
    which the stores fill at once, so the first partitions found, granted large shares,
    keep them buffered after the share has fallen (credit is taken back, records are
    not). Takes grant only within the group's buffer, or MIN_SHARE to a partition with
    nothing on its way: the group holds its buffer plus MIN_SHARE a partition at most,
    where it held about the sum of the shares it granted (here 1,338 records against a
    buffer of 1,024 once 3 partitions were found). Every record still comes once, each
    partition in order."""
    partitions, budget, backlog = 16, 64 * MIN_SHARE, 600
    keys = one_key_per_partition(partitions)

    async def body() -> None:
        async with engine_on(
            network, consume_batch=500, partitions=partitions, group_buffer=budget
        ) as engine:
            member = await engine.consumer("g", "c", ["t"], {})
            producer = engine.producer("s1")
            parts = engine._groups["g"].parts
            got: list[Record] = []
            for number in range(partitions):
                producer.produce_many("t", keys[number], [b"%d" % number] * backlog)
                assert await producer.flush(WAIT) == 0
                got += await take(member, number + 1)  # one of each partition found
                await wait_until_async(
                    functools.partial(found_and_filled, parts, number + 1),
                    WAIT,
                    f"partition {number} found, and every grant so far filled",
                )
                check_held(engine, "g")  # the group's own count is right
                held = held_or_granted(parts.values())
                assert sum(held) <= budget + MIN_SHARE * partitions, f"records held: {held}"
            got += await take(member, backlog * partitions - len(got))
            check_held(engine, "g")
            grouped = by_partition(got)
            assert sorted(grouped) == list(range(partitions))
            for records in grouped.values():
                assert [r.offset for r in records] == list(range(backlog))
            await member.close()

    run(body())
