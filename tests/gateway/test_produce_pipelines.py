"""Pipelined produce under concurrency, on both engines: what the produce path's fast
counting (Kafka: a lock-free produced count per session) and the RESP fast path's reads
of 8 KiB at a time must not break. Several connections pipeline RPUSHX at once, with a
value larger than one parse step among them; each one's DUMP still waits for every
record it produced, the stats count each record once, and every record is consumed
once, in each connection's order."""

from __future__ import annotations

import threading
from collections.abc import Callable

from gateway.runner import ServerThread
from tests.support.gateway import Raw
from tests.support.waiting import wait_until

CONNECTIONS = 6
RECORDS = 1500  # one-value RPUSHX per connection, ~180 KB of pipeline each
BIG = 100 * 1024  # one value spanning many 8 KiB parse steps


def rpushx(key: bytes, value: bytes) -> bytes:
    return b"*3\r\n$6\r\nRPUSHX\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(key), key, len(value), value)


def values_of(connection: int) -> list[bytes]:
    values = [b"c%d-%05d-" % (connection, n) + b"x" * 90 for n in range(RECORDS)]
    values[RECORDS // 2] = b"c%d-big-" % connection + b"y" * BIG
    return values


def stats(raw: Raw) -> dict[bytes, int]:
    raw.command("HGETALL", "stats")
    reply = raw.read_reply()
    pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2], strict=True)
    return {name: int(value) for name, value in pairs}


def test_concurrent_pipelines_each_dump_waits_for_all_its_records(
    server: ServerThread, new_topic: Callable[[int], str]
) -> None:
    topic = new_topic(1)  # one partition: each connection's records keep their order
    key = f"topics:{topic}".encode()
    with Raw(server.port, timeout=60) as watcher:
        before = stats(watcher)
        start = threading.Barrier(CONNECTIONS)
        answers: dict[int, list[object]] = {}
        failures: list[BaseException] = []

        def produce(connection: int) -> None:
            try:
                data = b"".join(rpushx(key, value) for value in values_of(connection))
                with Raw(server.port, timeout=60) as raw:
                    start.wait(30)
                    raw.send(data + b"*2\r\n$4\r\nDUMP\r\n$5\r\n30000\r\n")
                    answers[connection] = [raw.read_reply() for _ in range(RECORDS + 1)]
            except BaseException as error:  # reported by the test thread
                failures.append(error)

        threads = [threading.Thread(target=produce, args=(c,)) for c in range(CONNECTIONS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not failures, f"a producing connection failed: {failures[0]!r}"
        for connection in range(CONNECTIONS):
            replies = answers[connection]
            assert replies[:-1] == [1] * RECORDS, f"connection {connection}: a refusal"
            assert replies[-1] == 0, f"connection {connection}: DUMP left {replies[-1]}"

        total = CONNECTIONS * RECORDS
        after = stats(watcher)
        produced = after[b"producer.produced.messages"] - before[b"producer.produced.messages"]
        delivered = after[b"producer.delivered.messages"] - before[b"producer.delivered.messages"]
        errors = after[b"producer.delivery.errors"] - before[b"producer.delivery.errors"]
        assert (produced, delivered, errors) == (total, total, 0), "each record counted once"

        watcher.command("CLIENT", "SETNAME", f"{topic}:reader")
        assert watcher.read_reply() in ("OK", b"OK")
        got: list[bytes] = []

        def consumed_all() -> bool:
            watcher.command("BLMPOP", "2", "1", key.decode(), "LEFT", "COUNT", "1000")
            reply = watcher.read_reply()
            if reply is not None:
                got.extend(record[7] for record in reply[1])
            return len(got) >= total

        wait_until(consumed_all, 60, f"all {total} records consumed", interval=0)
        assert len(got) == total, f"{len(got)} records consumed, {total} produced"
        for connection in range(CONNECTIONS):
            mine = [value for value in got if value.startswith(b"c%d-" % connection)]
            assert mine == values_of(connection), f"connection {connection}: order or content"


def test_del_stats_zeroes_the_produced_count_and_counting_goes_on(
    server: ServerThread, new_topic: Callable[[int], str]
) -> None:
    """The Kafka engine counts produced records without Stats' lock (its own running
    total): DEL stats must still zero what HGETALL shows, and counting go on from 0."""
    key = f"topics:{new_topic(1)}"
    with Raw(server.port, timeout=60) as raw:
        for values in (("a", "b"), ("c",)):
            raw.command("RPUSHX", key, *values)
            assert raw.read_reply() == len(values)
        raw.command("DUMP", "30000")  # delivered before the reset, not after it
        assert raw.read_reply() == 0
        assert stats(raw)[b"producer.produced.messages"] >= 3
        raw.command("DEL", "stats")
        assert raw.read_reply() == 1
        assert stats(raw)[b"producer.produced.messages"] == 0
        for values in (("d", "e"), ("f",)):
            raw.command("RPUSHX", key, *values)
            assert raw.read_reply() == len(values)
        raw.command("DUMP", "30000")
        assert raw.read_reply() == 0
        counted = stats(raw)
        assert counted[b"producer.produced.messages"] == 3
        assert counted[b"producer.delivered.messages"] == 3


def command(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def mixed(topic: str) -> list[bytes]:
    """RPUSHX to one key one behind the other (the gateway runs them together), broken by
    commands it must answer as alone: a wrong arity, a bad key form, another key, another
    spelling of RPUSHX, a PING."""
    key = b"topics:%s:a" % topic.encode()
    return [
        command(b"RPUSHX", key, b"v0"),
        command(b"RPUSHX", key, b"v1", b"v2"),
        command(b"RPUSHX", key),
        command(b"RPUSHX", key, b"v3"),
        command(b"RPUSHX", b"no-colon", b"x"),
        command(b"RPUSHX", b"topics:%s:b" % topic.encode(), b"w0"),
        command(b"RPUSHX", key, b"v4"),
        command(b"rpushx", key, b"v5"),
        command(b"RPUSHX", key, b"v6"),
        command(b"PING"),
        command(b"RPUSHX", key, b"v7"),
        command(b"DUMP", b"30000"),
    ]


def consume(raw: Raw, topic: str, count: int) -> list[bytes]:
    raw.command("CLIENT", "SETNAME", f"{topic}:reader")
    assert raw.read_reply() in ("OK", b"OK")
    got: list[bytes] = []

    def consumed_all() -> bool:
        raw.command("BLMPOP", "2", "1", f"topics:{topic}", "LEFT", "COUNT", "100")
        reply = raw.read_reply()
        if reply is not None:
            got.extend(record[7] for record in reply[1])
        return len(got) >= count

    wait_until(consumed_all, 60, f"{count} records of {topic} consumed", interval=0)
    return got


def test_rpushx_behind_rpushx_is_answered_as_alone(
    server: ServerThread, new_topic: Callable[[int], str]
) -> None:
    """The same commands pipelined and sent one round trip at a time: the same replies,
    and the same records in the same order (one partition)."""
    alone, piped = new_topic(1), new_topic(1)
    with Raw(server.port, timeout=60) as raw:
        one_by_one = []
        for data in mixed(alone):
            raw.send(data)
            one_by_one.append(raw.read_reply())
        commands = mixed(piped)
        raw.send(b"".join(commands))
        pipelined = [raw.read_reply() for _ in commands]
        assert pipelined == one_by_one
        assert pipelined[:4] == [1, 2, pipelined[2], 1] and pipelined[-1] == 0
        assert isinstance(pipelined[2], tuple) and pipelined[2][0] == "-", "arity error"
        expected = [b"v0", b"v1", b"v2", b"v3", b"w0", b"v4", b"v5", b"v6", b"v7"]
        assert consume(raw, alone, 9) == expected
    with Raw(server.port, timeout=60) as raw:
        assert consume(raw, piped, 9) == expected


def test_monitor_sees_each_rpushx_of_a_pipeline(
    server: ServerThread, new_topic: Callable[[int], str]
) -> None:
    key = b"topics:%s" % new_topic(1).encode()
    with Raw(server.port, timeout=30) as monitor, Raw(server.port, timeout=30) as producer:
        monitor.command("MONITOR")
        assert monitor.read_line() == b"+OK\r\n"
        producer.send(b"".join(command(b"RPUSHX", key, b"m%d" % n) for n in range(3)))
        assert [producer.read_reply() for _ in range(3)] == [1, 1, 1]
        lines = [monitor.read_line() for _ in range(3)]
        for n, line in enumerate(lines):
            assert b'"RPUSHX" "%s" "m%d"' % (key, n) in line, line


def test_a_pipeline_that_changes_topic_at_every_rpushx_keeps_each_topics_order(
    server: ServerThread, new_topic: Callable[[int], str]
) -> None:
    """RPUSHX round-robin over three topics in one round trip (the gateway runs them
    together, looking each key up as it changes), a bad key among them: each answered as
    alone, each topic's records in the order sent."""
    topics = [new_topic(1) for _ in range(3)]
    commands = [
        command(b"RPUSHX", b"topics:%s" % topics[n % 3].encode(), b"r%d" % n) for n in range(60)
    ]
    commands.insert(31, command(b"RPUSHX", b"a:b:c:d", b"x"))
    with Raw(server.port, timeout=60) as raw:
        raw.send(b"".join([*commands, command(b"DUMP", b"30000")]))
        replies = [raw.read_reply() for _ in range(len(commands) + 1)]
        assert replies[:31] + replies[32:] == [1] * 60 + [0]
        assert isinstance(replies[31], tuple) and replies[31][0] == "-", "the bad key's error"
    for at, topic in enumerate(topics):
        with Raw(server.port, timeout=60) as raw:
            assert consume(raw, topic, 20) == [b"r%d" % n for n in range(at, 60, 3)]


def test_a_pipeline_with_two_keys_to_one_topic_keeps_the_partitions_order(
    server: ServerThread, new_topic: Callable[[int], str]
) -> None:
    """RPUSHX round-robin over two topics, one of them reached by three keys (without a
    partition key, with one, and through another prefix, which Rafka does not check): its
    one partition holds the records in the order sent, however the gateway gathers a
    pipeline's values by topic."""
    shared, other = new_topic(1), new_topic(1)
    keys = [
        b"topics:%s" % shared.encode(),
        b"topics:%s:k" % shared.encode(),
        b"x:%s" % shared.encode(),
    ]
    commands: list[bytes] = []
    for n in range(30):
        commands.append(command(b"RPUSHX", keys[n % 3], b"s%d" % n))
        commands.append(command(b"RPUSHX", b"topics:%s" % other.encode(), b"o%d" % n))
    with Raw(server.port, timeout=60) as raw:
        raw.send(b"".join([*commands, command(b"DUMP", b"30000")]))
        assert [raw.read_reply() for _ in range(len(commands) + 1)] == [1] * 60 + [0]
    with Raw(server.port, timeout=60) as raw:
        assert consume(raw, shared, 30) == [b"s%d" % n for n in range(30)]
    with Raw(server.port, timeout=60) as raw:
        assert consume(raw, other, 30) == [b"o%d" % n for n in range(30)]
