"""The engine's partition writers, all partitions of one producer actor (`WriterNode`,
`publisher.Publisher`): records of many topics through it, DUMP, a restart resuming each
partition, and a replacement actor when the shared one is gone. A real store and tower
(`store` fixture) in this process, over 127.0.0.1 TCP."""

from __future__ import annotations

import asyncio
import threading

import pytest
import zmq

from backends.base import ProduceError, Producer, Stats
from backends.dafka.config import Config
from backends.dafka.engine import DafkaEngine
from backends.dafka.partitions import make_partitioner, own_address
from backends.dafka.producing import FORGET_AT_LEAST
from backends.dafka.publisher import Publisher
from backends.dafka.store import Store
from tests.dafka.test_engine import WAIT, engine_on, run, take
from tests.support.waiting import wait_until, wait_until_async

TOPICS = 300
# Rounds of 100 records from each of two sessions: more than FORGET_AT_LEAST in all.
INTERLEAVED_ROUNDS = 30


def test_many_topics_share_one_actor_and_every_record_is_read_back(
    dafka_config: Config, store: Store
) -> None:
    async def body() -> None:
        async with engine_on(dafka_config, partitions=1) as engine:
            producer = engine.producer("s1")
            producer.produce("warm-up", None, b"w")
            assert await producer.flush(WAIT) == 0
            threads = threading.active_count()
            topics = [f"many-{i:03d}" for i in range(TOPICS)]
            for topic in topics:
                producer.produce_many(topic, None, [f"{topic}:0".encode(), f"{topic}:1".encode()])
            assert await producer.flush(WAIT) == 0, "DUMP over 300 partitions of one actor"
            assert engine.publisher().partition_count() == TOPICS + 1
            # Opening writers runs on asyncio's default executor (at most min(32, cores
            # + 4) threads); no thread per partition.
            assert threading.active_count() - threads <= 32
            member = await engine.consumer("g", "c", topics, {})
            records = await take(member, 2 * TOPICS)
            got = {(r.topic, r.offset): r.value for r in records}
            assert got == {(t, n): f"{t}:{n}".encode() for t in topics for n in (0, 1)}
            await member.close()

    run(body())


def test_writers_resume_after_a_restart_on_one_new_actor(
    dafka_config: Config, store: Store
) -> None:
    async def body() -> None:
        for run_number in range(2):
            async with engine_on(dafka_config, partitions=1) as engine:
                producer = engine.producer("s")
                for topic in ("r-a", "r-b", "r-c"):
                    producer.produce(topic, None, f"{topic}:{run_number}".encode())
                assert await producer.flush(WAIT) == 0
        async with engine_on(dafka_config, partitions=1) as engine:
            member = await engine.consumer("g", "c", ["r-a", "r-b", "r-c"], {})
            records = await take(member, 6)
            got = {(r.topic, r.offset): r.value for r in records}
            # A restarted gateway resumes each partition after what the stores hold.
            assert got == {
                (t, n): f"{t}:{n}".encode() for t in ("r-a", "r-b", "r-c") for n in (0, 1)
            }
            await member.close()

    run(body())


def test_a_new_actor_takes_over_when_the_shared_one_is_gone(
    dafka_config: Config, store: Store
) -> None:
    """The actor's thread dying of a bug cannot be provoked from outside: closing it
    behind the engine's back stands for that (its partitions refuse records the same way).
    With a queue of one record, the record lost with the dead actor must not keep its
    room: the next one is taken at once."""

    async def body() -> None:
        async with engine_on(dafka_config, partitions=1, queue_max_messages=1) as engine:
            producer = engine.producer("s1")
            producer.produce_many("t", None, [b"kept"])
            assert await producer.flush(WAIT) == 0
            gone = engine.publisher()
            gone.close(0)
            producer.produce("t", None, b"refused")  # handed to the actor at the end of the pass
            assert await producer.flush(WAIT) == 1, "a record the dead actor never sent"
            # The failed writer is replaced at the next record, on a new actor.
            producer.produce("t", None, b"after")
            assert await producer.flush(WAIT) == 1, "only the refused record is missing"
            assert engine.publisher() is not gone
            member = await engine.consumer("g", "c", ["t"], {})
            records = await take(member, 2)
            assert [(r.offset, r.value) for r in records] == [(0, b"kept"), (1, b"after")]
            await member.close()

    run(body())


async def a_full_queue_on_a_dying_actor(engine: DafkaEngine) -> Producer:
    """A session (queue_max_messages 2) whose first record of "stranded" is stored, then
    two more fill the queue, and the writers' actor dies before the pass hands them over
    (closed behind the engine's back, as the tests above stand for its death)."""
    producer = engine.producer("s1")
    producer.produce("stranded", None, b"kept")
    assert await producer.flush(WAIT) == 0
    producer.produce_many("stranded", None, [b"lost-1", b"lost-2"])  # the queue, full
    engine.publisher().close(0)
    return producer


def test_records_stranded_on_a_dead_actor_give_back_the_queue_at_once(
    dafka_config: Config, store: Store
) -> None:
    """The queue (queue_max_messages) counts every partition's records not acknowledged:
    full of records the dead actor will never send (closing it behind the engine's back
    stands for its death, as above), it takes another topic's record at once, not after
    the full queue's records failed at a hand-over that a full queue keeps from coming."""

    async def body() -> None:
        async with engine_on(dafka_config, partitions=1, queue_max_messages=2) as engine:
            producer = await a_full_queue_on_a_dying_actor(engine)
            producer.produce("elsewhere", None, b"taken")  # raised Queue full before
            assert await producer.flush(WAIT) == 2, "the two records the dead actor held"
            member = await engine.consumer("g", "c", ["stranded", "elsewhere"], {})
            records = await take(member, 2)
            assert sorted(r.value or b"" for r in records) == [b"kept", b"taken"]
            await member.close()

    run(body())


def test_a_full_queue_that_fails_a_dead_actors_writer_refuses_its_record(
    dafka_config: Config, store: Store
) -> None:
    """With the queue full, the check for writers stranded on a dead actor may fail the
    very writer a record is for: the record is refused with the writer's failure. It was
    queued in the failed writer instead (answered as taken, never sent, not counted as
    lost), and its room in the queue was never given back."""

    async def body() -> None:
        async with engine_on(dafka_config, partitions=1, queue_max_messages=2) as engine:
            producer = await a_full_queue_on_a_dying_actor(engine)
            with pytest.raises(ProduceError, match=r"^Local: Transport failure: "):
                producer.produce("stranded", None, b"refused")
            assert await producer.flush(WAIT) == 2, "the two records the dead actor held"
            producer.produce_many("elsewhere", None, [b"a", b"b"])  # the whole queue again
            assert await producer.flush(WAIT) == 2, "a and b stored; the lost two, still lost"

    run(body())


async def a_record_on_a_dying_actor(engine: DafkaEngine, store: Store, topic: str) -> Producer:
    """A session whose first record of `topic` is stored; then, no store answering any
    more, its second is handed to the writers' actor, which dies (closed behind the
    engine's back, as the tests above stand for its death)."""
    producer = engine.producer("s1")
    producer.produce(topic, None, b"kept")
    assert await producer.flush(WAIT) == 0
    store.close()  # no ACK from now on
    producer.produce(topic, None, b"handed")
    engine._writers[(topic, 0)].publish_pending()
    engine.publisher().close(0)
    return producer


def test_delivery_errors_count_every_record_a_dead_actor_held(
    dafka_config: Config, store: Store
) -> None:
    """A writer failing at a hand-over to a dead actor counts as delivery errors the
    records it had handed over before and no store acknowledged, as DUMP does; it used to
    count only that hand-over's."""

    async def body() -> None:
        async with engine_on(dafka_config, partitions=1) as engine:
            producer = await a_record_on_a_dying_actor(engine, store, "errs")
            before = engine.stats.get(Stats.DELIVERY_ERRORS)
            producer.produce("errs", None, b"refused")  # the hand-over fails the writer
            assert await producer.flush(WAIT) == 2
            assert engine.stats.get(Stats.DELIVERY_ERRORS) - before == 2

    run(body())


def test_dump_returns_once_the_actor_holding_its_records_is_gone(
    dafka_config: Config, store: Store
) -> None:
    """The writers' actor stops with a record of the session not acknowledged: its
    writers fail at once (the actor's thread says so to the loop as it ends), and a
    DUMP waiting for the record returns it as not delivered. They failed only at their
    next record, or a full queue: the DUMP waited its whole timeout (3 s here)."""

    async def body() -> None:
        async with engine_on(dafka_config, partitions=1) as engine:
            producer = await a_record_on_a_dying_actor(engine, store, "gone")
            loop = asyncio.get_running_loop()
            started = loop.time()
            assert await producer.flush(3.0) == 1
            waited = loop.time() - started
            assert waited < 1.5, f"DUMP waited {waited:.1f} s for records no actor holds"

    run(body())


def stored(store: Store, topic: str) -> list[bytes]:
    """What `store` holds of partition 0 of `topic` (written by this gateway)."""
    address = own_address(topic, 0).encode()
    return [content for _, content in store.storage.records(topic.encode(), address)]


# How long a held refresh of the heads waits for the new writer to open first: far longer
# than a writer that does not wait for the refresh takes to open on a new actor.
HELD_REFRESH = 2.0


@pytest.mark.parametrize("refresh", ["prompt", "held"])
def test_a_writer_replacing_one_whose_actor_died_starts_after_what_the_stores_hold(
    dafka_config: Config, store: Store, refresh: str
) -> None:
    """The actor dies right after sending r1: the store keeps r1, but its ACK never
    reaches the gateway, so the heads known here say 0. The next writer of the partition
    asks the stores for their heads first and writes r2 at 2. It opened at 1, the store
    dropped r2 there (it holds r1) and ACKed 1, which the writer took for r2's: DUMP
    returned 0 for a record no store held.
    "held": the stores' answer to that question is held back (a stand-in for a slow
    store: the observer's refresh waits) until the new writer has opened, or
    HELD_REFRESH. A new writer must wait for it: one that opened meanwhile would open at
    1 again (the first version of the fix was proved only by "prompt", where the new
    actor's start took longer than the refresh)."""

    async def body() -> None:
        async with engine_on(dafka_config, partitions=1) as engine:
            answer = threading.Event()
            if refresh == "held":
                ask_stores = engine.observer.refresh

                def held_refresh(min_stores: int, timeout: float) -> None:
                    answer.wait(WAIT)
                    ask_stores(min_stores, timeout)

                engine.observer.refresh = held_refresh  # type: ignore[method-assign]
            producer = engine.producer("s1")
            producer.produce("reuse", None, b"r0")
            assert await producer.flush(WAIT) == 0
            producer.produce("reuse", None, b"r1")
            old = engine._writers[("reuse", 0)]
            old.publish_pending()  # on the wire now ...
            engine.publisher().close(0)  # ... and the actor gone before any ACK
            wait_until(lambda: stored(store, "reuse") == [b"r0", b"r1"], WAIT, "r1 stored")
            assert engine.observer.stored_head("reuse", own_address("reuse", 0)) == 0
            await wait_until_async(lambda: old.failed, WAIT, "the dead actor's writer to fail")
            producer.produce("reuse", None, b"r2")  # a new writer, on a new actor
            if refresh == "held":
                assert engine.heads_refreshing() is not None, "no refresh of the heads to hold"
                new = engine._writers[("reuse", 0)]
                assert new is not old
                await asyncio.wait([new.ready], timeout=HELD_REFRESH)
                answer.set()
            assert await producer.flush(WAIT) == 1, "r1, never acknowledged to us"
            assert stored(store, "reuse") == [b"r0", b"r1", b"r2"]

    run(body())


def test_grouped_runs_are_taken_whole_or_declined_without_room_for_all(
    dafka_config: Config, store: Store
) -> None:
    """produce_grouped takes none of the runs when the queue (queue_max_messages) has
    room for only some of them, where values taken one run at a time would have filled
    it, and all of them when it has room for all."""

    async def body() -> None:
        async with engine_on(dafka_config, partitions=1, queue_max_messages=3) as engine:
            producer = engine.producer("s1")
            assert not producer.produce_grouped(
                [("g-a", None, [b"a0", b"a1"]), ("g-b", b"k", [b"b0", b"b1"])]
            )
            assert engine.stats.get(Stats.PRODUCED) == 0, "declined, yet records went in"
            assert producer.outstanding() == 0
            assert producer.produce_grouped([("g-a", None, [b"a0", b"a1"]), ("g-b", b"k", [b"b0"])])
            assert engine.stats.get(Stats.PRODUCED) == 3
            assert await producer.flush(WAIT) == 0
            member = await engine.consumer("g", "c", ["g-a", "g-b"], {})
            records = await take(member, 3)
            got = sorted((r.topic, r.offset, r.key, r.value) for r in records)
            assert got == [
                ("g-a", 0, None, b"a0"),
                ("g-a", 1, None, b"a1"),
                ("g-b", 0, b"k", b"b0"),
            ]
            await member.close()

    run(body())


def test_dump_waits_for_every_topic_behind_a_failed_writer_and_counts_its_records(
    dafka_config: Config, store: Store
) -> None:
    """DUMP stops looking at the first writer still waited for: a failed writer met first
    must neither end the wait for the topics produced after it nor go uncounted. (The
    actor's death is stood for by closing it behind the engine's back, as above.)"""

    async def body() -> None:
        async with engine_on(dafka_config, partitions=1) as engine:
            producer = engine.producer("s1")
            for topic in ("mixed-a", "mixed-b", "mixed-c"):
                producer.produce(topic, None, b"kept")
            assert await producer.flush(WAIT) == 0
            engine.publisher().close(0)
            producer.produce_many("mixed-a", None, [b"refused-1", b"refused-2"])
            producer.produce("mixed-b", None, b"refused-3")
            producer.produce("mixed-c", None, b"refused-4")
            assert await producer.flush(WAIT) == 4, "the dead actor's records are counted"
            # New writers on a new actor, after the failed ones in the session's order.
            producer.produce_many("mixed-b", None, [b"after-1", b"after-2"])
            producer.produce("mixed-c", None, b"after-3")
            assert producer.outstanding() == 7, "3 not yet acknowledged, 4 never sent"
            assert await producer.flush(WAIT) == 4, "DUMP waited for mixed-b and mixed-c"
            assert producer.outstanding() == 4
            member = await engine.consumer("g", "c", ["mixed-b", "mixed-c"], {})
            records = await take(member, 5)
            got = sorted((r.topic, r.offset, r.value) for r in records)
            assert got == [
                ("mixed-b", 0, b"kept"),
                ("mixed-b", 1, b"after-1"),
                ("mixed-b", 2, b"after-2"),
                ("mixed-c", 0, b"kept"),
                ("mixed-c", 1, b"after-3"),
            ]
            await member.close()

    run(body())


def another_writer_stores(config: Config, topic: str, contents: list[bytes]) -> None:
    """Another writer of this gateway's partition 0 of `topic` (a second gateway with the
    same dafka.node, played by a Publisher of the test) stores `contents` from offset 1."""
    other = Publisher(config, zmq.Context.instance())
    try:
        theirs = other.open(topic, address=own_address(topic, 0), first_sequence=1)
        theirs.publish_many(contents)
        wait_until(lambda: theirs.unacked_count() == 0, WAIT, "the other writer stored")
    finally:
        other.close(timeout=0)


def test_a_partition_another_writer_wrote_to_refuses_records_and_dump_counts_them(
    dafka_config: Config, store: Store
) -> None:
    """Another writer of this gateway's partition (a second gateway with the same
    dafka.node, played by a Publisher of the test on the partition's address): the store
    keeps the other writer's records at the offsets ours would take. Our records are not
    confirmed by DUMP, the partition says why on the next RPUSHX, and the stored records
    stay the other writer's."""

    async def body() -> None:
        async with engine_on(dafka_config, partitions=1) as engine:
            producer = engine.producer("s1")
            producer.produce("shared", None, b"ours-0")
            assert await producer.flush(WAIT) == 0
            another_writer_stores(dafka_config, "shared", [b"theirs-1", b"theirs-2", b"theirs-3"])
            producer.produce_many("shared", None, [b"ours-1", b"ours-2"])
            assert await producer.flush(WAIT) == 2, "records the store dropped were confirmed"
            # The offset named is the first ACK beyond what we sent: the store ACKs each
            # write batch's highest offset, and our writer hears the other writer's ACKs
            # too (same address), so 1, 2 or 3 as the store batched theirs-1..3.
            with pytest.raises(
                ProduceError,
                match=r"Partition conflict: the stores hold offset [123] of shared partition 0,",
            ):
                producer.produce("shared", None, b"refused")
            records = store.storage.records(b"shared", own_address("shared", 0).encode())
            assert [content for _, content in records] == [
                b"ours-0",
                b"theirs-1",
                b"theirs-2",
                b"theirs-3",
            ]

    run(body())


def test_after_a_conflict_dump_counts_only_the_records_no_store_acknowledged(
    dafka_config: Config, store: Store
) -> None:
    """A session's records to one writer without a DUMP between them are one range;
    once the writer fails on a conflict, DUMP counts the part of it that a store
    acknowledged before as durable. It counted the failed writer's ranges whole: 3 here,
    ours-0 included, which a client would then send again."""

    async def body() -> None:
        async with engine_on(dafka_config, partitions=1) as engine:
            producer = engine.producer("s1")
            producer.produce("shared", None, b"ours-0")
            writer = engine._writers[("shared", 0)]
            assert await engine.wait_durable(writer, 1, WAIT), "ours-0 stored"
            another_writer_stores(dafka_config, "shared", [b"theirs-1", b"theirs-2", b"theirs-3"])
            producer.produce_many("shared", None, [b"ours-1", b"ours-2"])
            assert await producer.flush(WAIT) == 2, "only ours-1 and ours-2 are not stored"
            assert writer.failed is not None

    run(body())


def test_records_of_many_writers_in_one_pass_keep_each_topics_order(
    dafka_config: Config, store: Store
) -> None:
    """Every writer that got records in one pass of the event loop is handed to the actor
    at its end, together, whether it opened in that pass (on the loop, the actor running)
    or before: records interleaved over many topics come back in each topic's order, each
    exactly once, and DUMP sees every ACK (they reach the loop in batches)."""

    async def body() -> None:
        async with engine_on(dafka_config, partitions=1) as engine:
            producer = engine.producer("s1")
            producer.produce("pass-warm-up", None, b"w")  # its writer starts the actor
            assert await producer.flush(WAIT) == 0
            topics = [f"pass-{i:02d}" for i in range(40)]
            for topic in topics:  # 40 writers opened on the loop, their records in one pass
                producer.produce(topic, None, f"{topic}:0".encode())
            assert producer.outstanding() == len(topics)
            assert await producer.flush(WAIT) == 0
            for n in range(1, 6):  # one pass: no await in between
                for topic in topics:
                    producer.produce_many(topic, None, [f"{topic}:{n}".encode()])
            assert producer.outstanding() == 5 * len(topics)
            assert await producer.flush(WAIT) == 0, "DUMP over 40 writers of one pass"
            member = await engine.consumer("g", "c", topics, {})
            records = await take(member, 6 * len(topics))
            by_topic: dict[str, list[bytes | None]] = {}
            for record in records:
                by_topic.setdefault(record.topic, []).append(record.value)
            assert by_topic == {t: [f"{t}:{n}".encode() for n in range(6)] for t in topics}
            await member.close()

    run(body())


def test_a_writer_failing_mid_pass_costs_only_its_own_records(
    dafka_config: Config, store: Store
) -> None:
    """One pass hands records to a dead actor (writers opened before it died) and to its
    replacement (a writer opened after): the dead one's writer fails and its records
    count as not durable; the other writer's records are stored, in order. (The actor's
    death is stood for by closing it behind the engine's back, as above; and its notice
    to the loop, which fails its writers at once, is held back: the actor dying in the
    pass that hands records to it, before the notice comes, is what this stands for.)"""

    async def body() -> None:
        async with engine_on(dafka_config, partitions=1) as engine:
            producer = engine.producer("s1")
            producer.produce("mid-old", None, b"kept")
            assert await producer.flush(WAIT) == 0
            gone = engine.publisher()
            gone._on_stopped = None  # the notice, held back
            gone.close(0)
            producer.produce("mid-new", None, b"new-0")  # a new writer, on a new actor
            assert await producer.flush(WAIT) == 0
            assert engine.publisher() is not gone
            delivery_errors = engine.stats.get(Stats.DELIVERY_ERRORS)
            for n in (1, 2):  # one pass: both writers enlisted for the same hand-over
                producer.produce("mid-old", None, f"old-{n}".encode())
                producer.produce("mid-new", None, f"new-{n}".encode())
            assert await producer.flush(WAIT) == 2, "the dead actor's two records"
            assert engine.stats.get(Stats.DELIVERY_ERRORS) - delivery_errors == 2
            member = await engine.consumer("g", "c", ["mid-old", "mid-new"], {})
            records = await take(member, 4)
            got = sorted((r.topic, r.offset, r.value) for r in records)
            assert got == [
                ("mid-new", 0, b"new-0"),
                ("mid-new", 1, b"new-1"),
                ("mid-new", 2, b"new-2"),
                ("mid-old", 0, b"kept"),
            ]
            await member.close()

    run(body())


def test_keyless_records_move_on_to_the_next_partition_once_the_sticky_time_is_over(
    dafka_config: Config, store: Store
) -> None:
    """A session looks its writer up once per loop pass for a run to one topic: records
    of one pass go to one partition (as the sticky partitioner would send them), and once
    the sticky time is over, the next pass's records go to the next partition."""
    now = [0.0]

    async def body() -> None:
        async with engine_on(dafka_config, partitions=4) as engine:
            engine._partitioner = make_partitioner("consistent_random", clock=lambda: now[0])
            producer = engine.producer("s1")
            numbers: list[int] = []

            def produce(value: bytes) -> None:
                producer.produce("sticky", None, value)
                numbers.append(engine._writers_now[("sticky", None)].number)

            produce(b"a")
            produce(b"b")
            now[0] += 1.0  # past the sticky time, within the same pass
            produce(b"c")
            assert await producer.flush(WAIT) == 0  # the pass ends: its records handed over
            produce(b"d")
            assert numbers[:3] == [numbers[0]] * 3, "one pass, one partition"
            assert numbers[3] == (numbers[0] + 1) % 4, f"still on one partition: {numbers}"
            assert await producer.flush(WAIT) == 0
            member = await engine.consumer("g", "c", ["sticky"], {})
            records = await take(member, 4)
            assert sorted(r.value or b"" for r in records) == [b"a", b"b", b"c", b"d"]
            assert {r.partition for r in records} == {numbers[0], numbers[3]}
            await member.close()

    run(body())


def test_a_session_that_never_dumps_keeps_no_account_of_what_is_stored(
    dafka_config: Config, store: Store
) -> None:
    """Two sessions whose records interleave on one partition, as clients producing
    unpipelined do: each session notes a range of positions per record. A session that
    never sends DUMP must not keep them once a store holds the records (it kept one per
    record it ever produced: memory growing with every RPUSHX of a long-lived
    connection)."""

    async def body() -> None:
        async with engine_on(dafka_config, partitions=1) as engine:
            steady, other = engine.producer("steady"), engine.producer("other")
            for _ in range(INTERLEAVED_ROUNDS):
                for n in range(100):
                    steady.produce("interleaved", None, b"s%d" % n)
                    other.produce("interleaved", None, b"o%d" % n)
                # The other session's DUMP: every record so far is stored once it returns.
                assert await other.flush(WAIT) == 0
            # Read from the handle: memory is what a user would see, and it is these.
            kept = sum(len(ranges) for ranges in steady._ranges.values())
            assert kept < FORGET_AT_LEAST, (
                f"the session keeps {kept} ranges of {100 * INTERLEAVED_ROUNDS} stored records"
            )
            assert steady.outstanding() == 0
            member = await engine.consumer("g", "c", ["interleaved"], {})
            records = await take(member, 200 * INTERLEAVED_ROUNDS)
            assert [r.value for r in records if (r.value or b"").startswith(b"s")] == [
                b"s%d" % n for _ in range(INTERLEAVED_ROUNDS) for n in range(100)
            ]
            await member.close()

    run(body())
