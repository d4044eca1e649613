"""LLEN and LRANGE (reads by offset) through the gateway, on every engine of
tests.support.engines.FACTORIES, and against a plain Redis list (the client's double).

What a user sees: LLEN is the partition's next offset, LRANGE the records of an offset
range with Redis's index rules, errors with the texts of docs/gateway.md, and no group
position or commit moves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis

from backends.base import Engine, Stats
from gateway.config import ConfigError, from_dict
from gateway.runner import ServerThread
from tests.support.consuming import new_group
from tests.support.engines import EngineFactory, MemoryEngineFactory
from tests.support.fixtures import EngineFactories
from tests.support.gateway import Raw, client, configured_engine, running
from tests.support.memory_engine import MemoryEngine, MemoryLog
from tests.support.redis_server import RedisServer

KEY = "one-key"  # every record of these tests: one partition of the topic


@contextmanager
def gateway(factory: EngineFactory, **settings: Any) -> Iterator[ServerThread]:
    with running(factory.gateway_config(**settings)) as server:
        yield server


def produce(c: redis.Redis, topic: str, values: list[bytes], key: str | None = KEY) -> None:
    target = f"topics:{topic}" + (f":{key}" if key is not None else "")
    assert c.execute_command("RPUSHX", target, *values) == len(values)
    assert c.execute_command("DUMP", "10000") == 0, "records still outstanding"


def split(c: redis.Redis, topic: str) -> tuple[int, int]:
    """(the partition of a 2-partition topic that holds the records, the empty one)."""
    lengths = [c.llen(f"topics:{topic}:{p}") for p in (0, 1)]
    assert sorted(lengths)[0] == 0 and sorted(lengths)[1] > 0, f"LLEN per partition: {lengths}"
    full = lengths.index(max(lengths))
    return full, 1 - full


def refusal(call: Callable[..., object], *args: object) -> str:
    """The error reply's text as on the wire (redis-py drops the `ERR ` prefix)."""
    with pytest.raises(redis.ResponseError) as refused:
        call(*args)
    return f"ERR {refused.value}"


def fields(reply: Any) -> dict[bytes, Any]:
    assert isinstance(reply, list) and len(reply) == 12, reply
    assert reply[0::2] == [b"topic", b"partition", b"offset", b"value", b"key", b"timestamp"]
    return dict(zip(reply[0::2], reply[1::2], strict=True))


@pytest.mark.parametrize("protocol", [2, 3])
def test_llen_is_the_next_offset_and_lrange_answers_records_by_offset(
    engine_factory: EngineFactory, protocol: int
) -> None:
    topic, plain = engine_factory.new_topic(2), engine_factory.new_topic(1)
    values = [b"v%d" % n for n in range(5)]
    with gateway(engine_factory) as server, client(server, protocol=protocol) as c:
        produce(c, topic, values[:2])
        produce(c, topic, values[2:])
        full, empty = split(c, topic)
        key = f"topics:{topic}:{full}"
        assert c.llen(key) == 5
        assert c.llen(f"topics:{topic}:{empty}") == 0

        records = [fields(r) for r in c.lrange(key, 0, -1)]
        assert [r[b"value"] for r in records] == values
        assert [r[b"offset"] for r in records] == [0, 1, 2, 3, 4]
        for record in records:
            assert (record[b"topic"], record[b"partition"]) == (topic.encode(), full)
            assert record[b"key"] == KEY.encode()
            if engine_factory.has_timestamps:
                assert isinstance(record[b"timestamp"], int) and record[b"timestamp"] > 0
            else:
                assert record[b"timestamp"] is None
        assert [fields(r)[b"value"] for r in c.lrange(key, 3, 3)] == [b"v3"]

        produce(c, plain, [b"no key"], key=None)
        [unkeyed] = c.lrange(f"topics:{plain}:0", 0, 0)
        assert fields(unkeyed)[b"key"] is None
        assert fields(unkeyed)[b"value"] == b"no key"
        assert c.llen(key) == 5, "producing elsewhere moved this partition"


def test_the_wire_shape_of_a_record_in_resp2_and_resp3(engine_factory: EngineFactory) -> None:
    topic = engine_factory.new_topic(1)
    with gateway(engine_factory) as server, Raw(server.port) as raw:
        raw.command("RPUSHX", f"topics:{topic}", "hello")
        raw.expect(b":1\r\n")
        raw.command("DUMP", "10000")
        raw.expect(b":0\r\n")
        raw.command("LLEN", f"topics:{topic}:0")
        raw.expect(b":1\r\n")
        t = topic.encode()
        head = (
            b"*1\r\n*12\r\n$5\r\ntopic\r\n$%d\r\n%b\r\n$9\r\npartition\r\n:0\r\n"
            b"$6\r\noffset\r\n:0\r\n$5\r\nvalue\r\n$5\r\nhello\r\n$3\r\nkey\r\n" % (len(t), t)
        )
        raw.command("LRANGE", f"topics:{topic}:0", "0", "-1")
        raw.expect(head + b"$-1\r\n$9\r\ntimestamp\r\n")
        stamp = raw.read_line()
        assert stamp.startswith(b":") if engine_factory.has_timestamps else stamp == b"$-1\r\n"
        raw.command("HELLO", "3")
        assert raw.read_reply()[b"proto"] == 3
        raw.command("LRANGE", f"topics:{topic}:0", "0", "-1")
        raw.expect(head + b"_\r\n$9\r\ntimestamp\r\n")
        stamp = raw.read_line()
        assert stamp.startswith(b":") if engine_factory.has_timestamps else stamp == b"_\r\n"
        raw.command("LRANGE", f"topics:{topic}:0", "1", "-1")
        raw.expect(b"*0\r\n")


# (start, stop) pairs on a 7-record partition: every index rule of Redis's LRANGE.
RANGES = [
    (0, -1), (0, 6), (0, 0), (6, 6), (2, 4), (-1, -1), (-3, -1), (-7, -1), (-100, -1),
    (-100, 2), (2, 100), (0, 10**12), (7, 10), (100, 200), (3, 1), (-1, -2), (0, -8),
    (5, -3), (-7, 0), (-2, 100),
]  # fmt: skip


@pytest.mark.parametrize("protocol", [2, 3])
def test_indexes_mean_what_they_mean_on_a_plain_redis_list(
    engine_factory: EngineFactory, redis_server: RedisServer, protocol: int
) -> None:
    topic = engine_factory.new_topic(1)
    values = [b"v%d" % n for n in range(7)]
    double = redis_server.client(protocol)
    key = f"topics:{topic}:0"
    double.rpush(key, *values)  # the double holds the partition's values, one per offset
    with gateway(engine_factory) as server, client(server, protocol=protocol) as c:
        produce(c, topic, values)
        assert c.llen(key) == double.llen(key) == 7
        for start, stop in RANGES:
            records = [fields(r) for r in c.lrange(key, start, stop)]
            expected: list[Any] = double.lrange(key, start, stop)
            assert [r[b"value"] for r in records] == expected, (start, stop)
            assert [r[b"offset"] for r in records] == [values.index(v) for v in expected]
    double.delete(key)


def test_empty_partitions_unknown_partitions_and_ranges_over_the_limit(
    engine_factory: EngineFactory,
) -> None:
    topic = engine_factory.new_topic(2)
    with gateway(engine_factory, max_range=3) as server, client(server) as c:
        produce(c, topic, [b"v%d" % n for n in range(5)])
        full, empty = split(c, topic)
        key = f"topics:{topic}:{full}"
        assert c.lrange(f"topics:{topic}:{empty}", 0, -1) == []
        assert c.lrange(f"topics:{topic}:{empty}", 0, 0) == []
        assert c.lrange(key, 5, 10) == [], "past the head"
        assert [fields(r)[b"offset"] for r in c.lrange(key, 3, 10)] == [3, 4]
        assert len(c.lrange(key, 1, 3)) == 3, "exactly the limit"
        assert len(c.lrange(key, -3, -1)) == 3
        over = "ERR range of 5 records is over the limit of 3 (gateway.max_range)"
        for start, stop in ((0, -1), (0, 10**15), (-(10**15), 4)):
            assert refusal(c.lrange, key, start, stop) == over
        assert refusal(c.lrange, key, 1, 4).startswith("ERR range of 4 records is over")

        unknown = {
            f"topics:{topic}:2": f"ERR unknown topic or partition {topic}:2",
            "topics:no-such-topic-here:0": "ERR unknown topic or partition no-such-topic-here:0",
            # Names a Kafka broker cannot hold: librdkafka retried "Invalid topic" until
            # metadata_timeout, holding one of the engine's 4 reader threads meanwhile.
            "topics:a b:0": "ERR unknown topic or partition a b:0",
            "topics:caf\u00e9:0": "ERR unknown topic or partition caf\u00e9:0",
        }
        for where, text in unknown.items():
            assert refusal(c.llen, where) == text
            assert refusal(c.lrange, where, 0, -1) == text
        assert c.llen(key) == 5, "the connection still answers"
        # The extreme 64-bit indexes are integers (clamped like any other).
        assert c.lrange(f"topics:{topic}:{empty}", -(2**63), 2**63 - 1) == []


def test_malformed_reads_are_refused_with_redis_like_texts(engine_factory: EngineFactory) -> None:
    topic = engine_factory.new_topic(1)
    form = "ERR key must be in the form of 'topics:<topic>:<partition>', got '{}'"
    partition = "ERR partition must be an integer from 0 to 2147483647, got '{}'"
    nan = "ERR value is not an integer or out of range"
    arity = "ERR wrong number of arguments for '{}' command"
    with gateway(engine_factory) as server, Raw(server.port) as raw:
        cases: list[tuple[tuple[str, ...], str]] = [
            (("LLEN", "foo"), form.format("foo")),
            (("LLEN", f"topics:{topic}"), form.format(f"topics:{topic}")),
            (("LLEN", "topics::0"), form.format("topics::0")),
            (("LLEN", f"Topics:{topic}:0"), form.format(f"Topics:{topic}:0")),
            (("LRANGE", f"topics:{topic}:0:1", "0", "1"), form.format(f"topics:{topic}:0:1")),
            (("LLEN", f"topics:{topic}:x"), partition.format("x")),
            (("LLEN", f"topics:{topic}:-1"), partition.format("-1")),
            (("LLEN", f"topics:{topic}:2147483648"), partition.format("2147483648")),
            (("LRANGE", f"topics:{topic}:0", "a", "1"), nan),
            (("LRANGE", f"topics:{topic}:0", "0", "1.5"), nan),
            (("LRANGE", f"topics:{topic}:0", "0", "+1"), nan),
            (("LRANGE", f"topics:{topic}:0", "0", str(2**63)), nan),
            (("LRANGE", f"topics:{topic}:0", "0"), arity.format("lrange")),
            (("LLEN",), arity.format("llen")),
            (("LLEN", f"topics:{topic}:0", "x"), arity.format("llen")),
        ]  # fmt: skip
        for command, text in cases:
            raw.command(*command)
            assert raw.read_line() == f"-{text}\r\n".encode(), command


def test_reads_move_no_group_position_and_count_as_no_consumption(
    engine_factory: EngineFactory,
) -> None:
    topic, group = engine_factory.new_topic(1), new_group()
    values = [b"r%d" % n for n in range(4)]
    with gateway(engine_factory, blpop_default_timeout=1) as server, client(server) as c:
        produce(c, topic, values)
        with client(server, client_name=f"{group}:first") as member:
            for expected in (0, 1):
                reply = member.blpop([f"topics:{topic}"], 10)
                assert reply is not None and int(reply[5]) == expected, reply
            assert member.rpush("acks", f"{topic}:0:1") == 1
            consumed = int(c.hgetall("stats")[b"consumer.consumed.messages"])
            assert [fields(r)[b"value"] for r in c.lrange(f"topics:{topic}:0", 0, -1)] == values
            assert c.llen(f"topics:{topic}:0") == 4
            assert int(c.hgetall("stats")[b"consumer.consumed.messages"]) == consumed
            reply = member.blpop([f"topics:{topic}"], 10)
            assert reply is not None and reply[7] == b"r2", "the member's position moved"
            member.execute_command("QUIT")
        c.lrange(f"topics:{topic}:0", 0, -1)
        # The group's commit is the ack (offset 1): a new member starts at offset 2.
        with client(server, client_name=f"{group}:second") as successor:
            reply = successor.blpop([f"topics:{topic}"], 10)
            assert reply is not None and (int(reply[5]), reply[7]) == (2, b"r2")


def test_retention_shows_as_the_first_held_offset(engines: EngineFactories) -> None:
    """On the in-memory engine, the only one here whose retention a test can trigger
    (Tansu cannot delete records)."""
    factory = engines("memory")
    assert isinstance(factory, MemoryEngineFactory)
    topic = factory.new_topic(1)
    key = f"topics:{topic}:0"
    with gateway(factory, max_range=3) as server, client(server) as c:
        produce(c, topic, [b"v%d" % n for n in range(6)])
        MemoryLog.named(factory.log_name).expire(topic, 0, 3)
        assert c.llen(key) == 6, "LLEN stays the next offset"
        assert [fields(r)[b"offset"] for r in c.lrange(key, 0, -1)] == [3, 4, 5]
        assert [fields(r)[b"offset"] for r in c.lrange(key, 1, 3)] == [3]
        text = f"ERR offsets 0 to 2 of {topic}:0 are no longer held, the first held offset is 3"
        assert refusal(c.lrange, key, 0, 2) == text
        assert refusal(c.lrange, key, -6, -4) == text
        MemoryLog.named(factory.log_name).expire(topic, 0, 6)  # nothing held any more
        assert c.lrange(key, 6, -1) == []
        assert refusal(c.lrange, key, 0, -1).endswith("the first held offset is 6")


class EngineWithoutReads(MemoryEngine):
    """An engine that does not implement reads by offset (the base class defaults)."""

    partition_offsets = Engine.partition_offsets
    read = Engine.read


def test_an_engine_without_reads_answers_an_error(engines: EngineFactories) -> None:
    config = engines("memory").gateway_config()
    engine = configured_engine(config)
    assert isinstance(engine, MemoryEngine)
    plain = EngineWithoutReads(Stats(), engine.settings, config.engine_options())
    with ServerThread(config, engine=plain) as server, client(server) as c:
        text = "ERR read failed: reads by offset are not supported by this engine"
        assert refusal(c.llen, "topics:t:0") == text
        assert refusal(c.lrange, "topics:t:0", 0, 1) == text
        assert c.ping()


def test_max_range_is_a_checked_gateway_setting() -> None:
    assert from_dict({"gateway": {"engine": "memory"}}).max_range == 1000
    assert from_dict({"gateway": {"engine": "memory", "max_range": 5}}).max_range == 5
    for value, text in (
        (0, "gateway.max_range must be >= 1 and <= 1000000, got 0"),
        (1_000_001, "gateway.max_range must be >= 1 and <= 1000000, got 1000001"),
        ("10", "gateway.max_range must be an integer, got '10'"),
    ):
        with pytest.raises(ConfigError) as refused:
            from_dict({"gateway": {"engine": "memory", "max_range": value}})
        assert str(refused.value) == text
