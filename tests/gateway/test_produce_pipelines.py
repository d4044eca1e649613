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
