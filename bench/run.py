"""Gateway benchmark: figures next to references measured in the same run.

Dafka engine (embedded: the gateway runs its own dafka-towerd and dafka-stored; the Dafka
perf tools join that network, so they and the gateway write to the same store):
0. redis-benchmark RPUSHX (50 clients, without and with -P 16) against the gateway and
   against a redis-server, as on Kafka (4. below); `--front-only`: these rows alone, on
   either engine.
1. Produce through the gateway (pipelined RPUSHX, 1000 per pipeline, + DUMP, with redis-py
   and pre-encoded; RPUSHX with 100 values + DUMP) next to `dafka-perf-store` (publish
   until a store has acknowledged); redis-py's own ceiling against a redis-server.
2. Consume stored records through the gateway (BLPOP one record per call; pipelined
   BLPOPs; BLMPOP with COUNT) next to `dafka-perf-consumer` reading stored records from the start.
3. Produce-to-BLPOP latency at fixed rates (a producer process sending timestamped RPUSHX,
   what is due at each instant in one pipeline; this process reading with 1 or N BLPOPs in
   flight; percentiles after a warm-up) next to `dafka-perf-store --rate --timestamp` with
   `dafka-perf-consumer --latency`. A consumer that falls behind the rate is flagged: its
   latency is then the backlog.
Every record consumed through the gateway is checked: records lost or delivered twice, and
what the gateway logged above info, are reported.

Kafka engine (on a Tansu broker):
4. redis-benchmark RPUSHX (50 clients, without and with -P 16) against the rafka gateway
   and against a redis-server: the cost of the RESP front.
5. Produce and consume through the gateway against a direct confluent-kafka client on the
   same Tansu broker: the cost of the gateway on the Kafka path. Consuming is measured
   fairly: every row (direct consumer, BLPOP, BLMPOP) reads the same `--records` records
   of one topic filled beforehand, each with its own group, the join and first record
   untimed for all (then `--settle` seconds of prefetch for all before the clock
   starts), and each reads every record's partition, offset and value (the
   direct consumer checks its error too) and checks that every record came once. (The
   direct consumer used to drain 3,000 records touching none, against 50,000 through
   the gateway: two different things.) BLMPOP is measured with redis-py and with
   commands encoded in advance and replies parsed by hiredis: redis-py's per-call cost
   is the client library's, not the gateway's, and the pre-encoded row shows the two apart.
   `--kafka-consume-only` skips the RESP front and produce rows. The same comparison
   in instructions per record, steady from run to run: bench/consume_instructions.py.
   The pipelined RPUSHX row is printed twice, as on Dafka: with redis-py, whose
   encoding runs in this process on the same 2 cores as the gateway (so the client
   library's cost is in the figure; the redis-py ceiling against a redis-server is
   printed beside it), and pre-encoded (commands encoded before the clock starts,
   replies parsed by hiredis): the gateway's own cost, which is what a fast client
   (hiredis, redis-benchmark, Go, Java) sees. `--linger-ms` sets both producers'
   `queue.buffering.max.ms` (the tests' configuration has 0: librdkafka then sends what
   it holds at once, so records that the gateway produces one command at a time leave
   in small requests, which cost the broker and librdkafka several times more per
   record than the direct producer's large ones).

Every figure is the median of --runs runs (default 3), the reference's too. Prints figures
and ratios; never passes or fails anything. Usage: `make bench` (`make bench
BENCH_ARGS="--engine dafka"`), or `.venv/bin/python bench/run.py [--engine dafka|kafka|both]
[--runs N] [--records N] ...`.

Over ~500 lines on purpose: one script (bench/ is a directory of scripts, not a package)
whose two halves, one per engine, share the rows, the record checks and the command line;
each half is a list of small measuring functions.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import hiredis
import redis
from confluent_kafka import Consumer, KafkaError, Producer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backends.dafka.config import Config
from backends.dafka.tools.perf_consumer import percentile
from backends.dafka.tools.perf_store import STAMP
from backends.kafka.settings import KafkaSettings, consumer_properties, parse_settings
from backends.process import ProcessError
from backends.settings import json_decoder
from tests.support.dafka_programs import Program
from tests.support.kafka import kafka_document
from tests.support.rafka_process import RafkaProcess
from tests.support.redis_server import RedisServer, redis_benchmark
from tests.support.resp import command
from tests.support.tansu import TansuBroker
from tests.support.waiting import wait_until

SIZE = 100  # bytes per record
VALUE = "x" * SIZE
PADDING = b"x" * (SIZE - 8)
PERCENTILES: tuple[float, ...] = (50, 90, 99, 99.9)
TOOL_TIMEOUT = 180.0  # seconds a Dafka perf tool may run before it is given up on
WARM_UP_RECORDS = 8  # per Dafka topic, produced and made durable before any timing


def numbered(i: int) -> bytes:
    """Record `i` of a run: 100 bytes starting with its number, so that a consumer can
    tell a lost or duplicated record."""
    return b"%08d" % i + PADDING


# --- rows ---------------------------------------------------------------------------------


def row(name: str, ours: Sequence[float], reference: Sequence[float], reference_name: str) -> None:
    """Medians of the runs, and the ratio of the medians."""
    mine, theirs = statistics.median(ours), statistics.median(reference)
    print(
        f"{name:<44} {mine:>12,.0f}/s   {reference_name:<22} {theirs:>12,.0f}/s"
        f"   ratio {mine / theirs:5.2f}",
        flush=True,
    )


# --- Kafka engine ---------------------------------------------------------------------------


def start_redis_server() -> RedisServer:
    """The reference redis-server, holding `topics:bench` so that RPUSHX really appends."""
    server = RedisServer()
    server.start()
    redis.Redis(port=server.port).rpush("topics:bench", "seed")
    return server


def gateway_produce(port: int, topic: str, records: int, batch: int) -> float:
    """Records/s of pipelined RPUSHX (`batch` per pipeline) until DUMP answers 0; the
    records are numbered 0 .. records-1."""
    client = redis.Redis(port=port)
    target = f"topics:{topic}"
    start = time.perf_counter()
    pipe = client.pipeline(transaction=False)
    for i in range(records):
        pipe.execute_command("RPUSHX", target, numbered(i))
        if (i + 1) % batch == 0:
            pipe.execute()
    pipe.execute()
    left = client.execute_command("DUMP", "60000")
    elapsed = time.perf_counter() - start
    assert left == 0, f"{left} records not delivered"
    client.close()
    return records / elapsed


def gateway_produce_multi(port: int, topic: str, records: int, per_command: int) -> float:
    """Records/s of RPUSHX with `per_command` values each until DUMP answers 0; the
    records are numbered 0 .. records-1."""
    client = redis.Redis(port=port)
    target = f"topics:{topic}"
    start = time.perf_counter()
    for first in range(0, records - records % per_command, per_command):
        values = [numbered(i) for i in range(first, first + per_command)]
        client.execute_command("RPUSHX", target, *values)
    left = client.execute_command("DUMP", "60000")
    elapsed = time.perf_counter() - start
    assert left == 0, f"{left} records not delivered"
    client.close()
    return records / elapsed


def kafka_config(bootstrap: str, linger_ms: int | None = None) -> dict[str, dict[str, object]]:
    """The tests' configuration (Rafka's, with `queue.buffering.max.ms` 0), or with
    `linger_ms` as the producer's `queue.buffering.max.ms`."""
    document = kafka_document(bootstrap)
    if linger_ms is not None:
        document["producer"] = {**document["producer"], "queue.buffering.max.ms": linger_ms}
    return document


def gateway_properties(bootstrap: str, linger_ms: int | None = None) -> KafkaSettings:
    """The librdkafka properties of the gateway under test, as its Kafka engine reads them
    from the configuration file: the direct clients are configured exactly as the
    gateway's, so the ratio is the gateway's cost."""
    document = kafka_config(bootstrap, linger_ms)
    return parse_settings(json_decoder().decode(json.dumps(document)))


def direct_produce(bootstrap: str, topic: str, records: int, linger_ms: int | None = None) -> float:
    producer = Producer(dict(gateway_properties(bootstrap, linger_ms).producer))
    start = time.perf_counter()
    for _ in range(records):
        while True:
            try:
                producer.produce(topic, VALUE.encode())
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    left = producer.flush(60)
    elapsed = time.perf_counter() - start
    assert left == 0
    return records / elapsed


def rss_kb(pid: int) -> int:
    """A process's resident set size, KB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def idle_connections(port: int, pid: int, count: int) -> tuple[float, int]:
    """Open `count` connections to the gateway, each served a PING, kept open while the
    gateway's RSS is read: (KB of RSS per connection, connections that got PONG)."""

    async def run() -> tuple[float, int]:
        before = rss_kb(pid)
        streams: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        for start in range(0, count, 500):
            opened = await asyncio.gather(
                *(
                    asyncio.open_connection("127.0.0.1", port)
                    for _ in range(start, min(count, start + 500))
                )
            )
            streams.extend(opened)
        for _, writer in streams:
            writer.write(b"PING\r\n")
        answers = await asyncio.gather(*(reader.readline() for reader, _ in streams))
        served = sum(answer == b"+PONG\r\n" for answer in answers)
        after = rss_kb(pid)
        for _, writer in streams:
            writer.close()
        return (after - before) / count, served

    return asyncio.run(run())


def wait_delivered(port: int, timeout: float = 120) -> None:
    """Wait until the gateway's producer has delivered everything produced so far.

    redis-benchmark leaves records queued in librdkafka when it disconnects; timing the
    next test on top of that backlog measured the backlog (or failed with `PROD Local:
    Queue full`).
    """
    client = redis.Redis(port=port)

    def delivered() -> bool:
        stats = client.hgetall("stats")
        done = int(stats[b"producer.delivered.messages"])
        done += int(stats[b"producer.delivery.errors"])
        return done >= int(stats[b"producer.produced.messages"])

    wait_until(delivered, timeout, "the gateway to deliver the records already produced")
    client.close()


def resp_front(port: int, key: str, redis_port: int, args: argparse.Namespace) -> None:
    """redis-benchmark RPUSHX to the gateway next to redis-server's RPUSH, 50 clients,
    without and with -P 16; each run waits until the gateway's engine delivered what it
    took (its records are really produced) before the next one starts."""
    # Without a pipeline the gateway does a few ten thousand requests/s: a quarter of the
    # records keeps the run short and is still 250 requests per client.
    print("RESP front: redis-benchmark RPUSHX, 50 clients")
    for pipeline in (1, 16):
        requests = args.records if pipeline > 1 else args.records // 4
        ours, reference = [], []
        rpushx = ("-P", str(pipeline), "RPUSHX")
        for _ in range(args.runs):
            ours.append(redis_benchmark(port, requests, *rpushx, key, VALUE))
            # Not while the engine still works on them: that time is the gateway's.
            wait_delivered(port)
            reference.append(redis_benchmark(redis_port, requests, *rpushx, "topics:bench", VALUE))
        row(f"  gateway -P {pipeline}", ours, reference, "redis-server")


def kafka_bench(args: argparse.Namespace, problems: Problems) -> None:
    runs = args.runs
    linger = "0 (Rafka's test configuration)" if args.linger_ms is None else args.linger_ms
    with TansuBroker() as broker, tempfile.TemporaryDirectory() as scratch:
        config = Path(scratch) / "librdkafka.json"
        config.write_text(json.dumps(kafka_config(broker.bootstrap, args.linger_ms)))
        gateway = RafkaProcess(config, None, "--event-loop", args.event_loop)
        gateway.start()
        redis_server = start_redis_server()
        redis_port = redis_server.port
        try:
            # The producer refuses unknown topics (as Rafka's tests require): create it,
            # and warm the gateway's producer up so the first timed request is not a cold one.
            bench_topic = broker.create_topic(4)
            subprocess.run(
                [
                    "redis-cli",
                    "-p",
                    str(gateway.port),
                    "RPUSHX",
                    f"topics:{bench_topic}",
                    "warm-up",
                ],
                check=True,
                capture_output=True,
            )
            print(
                f"\n== Kafka engine: rafka gateway on :{gateway.port}, redis-server on "
                f":{redis_port}, Tansu on {broker.bootstrap}; {args.records:,} records of "
                f"{SIZE} bytes; producers' queue.buffering.max.ms {linger}; medians of "
                f"{runs} runs\n",
                flush=True,
            )
            if args.kafka_consume_only:
                kafka_consume(args, broker, gateway.port, problems)
                return
            resp_front(gateway.port, f"topics:{bench_topic}", redis_port, args)
            if args.front_only:
                return

            print("\nKafka path: records/s, gateway vs direct confluent-kafka")
            direct, piped, multi, raw, ceiling = [], [], [], [], []
            for _ in range(runs):
                topic_a = broker.create_topic(4)
                topic_b = broker.create_topic(4)
                topic_c = broker.create_topic(4)
                direct.append(
                    direct_produce(broker.bootstrap, topic_b, args.records, args.linger_ms)
                )
                piped.append(gateway_produce(gateway.port, topic_a, args.records, 1000))
                raw.append(raw_produce(gateway.port, broker.create_topic(4), args.records, 1000))
                ceiling.append(redis_py_ceiling(redis_port, args.records, 1000))
                multi.append(gateway_produce_multi(gateway.port, topic_c, args.records, 100))
            row("  produce, pipelined RPUSHX (1000/batch)", piped, direct, "direct producer")
            row("    the same, pre-encoded (no redis-py)", raw, direct, "direct producer")
            row("  produce, RPUSHX with 100 values", multi, direct, "direct producer")
            ceiling_row(ceiling)
            print()
            if not args.kafka_produce_only:
                kafka_consume(args, broker, gateway.port, problems)
        finally:
            redis_server.stop()
            gateway.terminate()


# --- Kafka engine: consume -------------------------------------------------------------------
#
# Every consume row reads the same topic, filled before any of them starts, each with a
# group of its own, so each starts from the same state: every record stored on the broker,
# none consumed. The group join and the first record are not timed for any of them, and
# each then waits --settle seconds before its clock starts: the gateway's librdkafka and
# the direct consumer's prefetch alike (from the same broker, with the same settings)
# before timing, so that the rows compare the consumers, not how fast Tansu answered
# fetches at that moment (a direct consumer timed from its first record ran from 100k to
# 1M records/s on the loaded machine, waiting on fetches). Each
# consumer does what a real one does with every record: the direct one checks its error
# and reads its partition, offset and value; the gateway's clients read them from the
# reply. Every row then checks it got every record exactly once.

# A record as a consume row keeps it: (partition, offset).
Position = tuple[int, int]


def fill_topic(bootstrap: str, topic: str, records: int) -> None:
    """`records` numbered records into `topic`, all delivered, before any consume row."""
    producer = Producer(dict(gateway_properties(bootstrap).producer))
    for i in range(records):
        while True:
            try:
                producer.produce(topic, numbered(i))
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    assert producer.flush(120) == 0, f"records of {topic} not delivered"


def check_positions(what: str, got: Sequence[Position], records: int, problems: Problems) -> None:
    """Every one of `records` came, and none twice."""
    if len(got) != records or len(set(got)) != records:
        problems.add(
            f"{what}: {len(got):,} records, {len(set(got)):,} distinct, for {records:,} stored"
        )


def direct_consume(
    bootstrap: str, topic: str, group: str, records: int, settle: float
) -> tuple[float, list[Position]]:
    """Records/s of a confluent-kafka consumer configured as the gateway's (consume() in
    batches of up to 1000), after its first record; each record's error checked and its
    partition, offset and value read."""
    properties = consumer_properties(gateway_properties(bootstrap))  # the engine's defaults too
    consumer = Consumer({**properties, "group.id": group})
    consumer.subscribe([topic])
    got: list[Position] = []
    size = 0

    def take(messages: list[Any]) -> None:
        nonlocal size
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise RuntimeError(f"direct consumer: {error.str()}")
            size += len(message.value())
            got.append((message.partition(), message.offset()))

    while not got:  # the group join, not timed
        first = consumer.poll(1.0)
        if first is not None:
            take([first])
    time.sleep(settle)
    start = time.perf_counter()
    while len(got) < records:
        # consume() waits its whole timeout for a full batch: never ask past the last record.
        take(consumer.consume(num_messages=min(1000, records - len(got)), timeout=1.0))
    elapsed = time.perf_counter() - start
    consumer.close()
    assert size >= len(got) * SIZE, "records shorter than produced"
    return (len(got) - 1) / elapsed, got


def gateway_consume(
    port: int, topic: str, group: str, records: int, settle: float
) -> tuple[float, list[Position]]:
    """Records/s of redis-py BLPOP, one record per call, after the first record."""
    client = redis.Redis(port=port, client_name=f"{group}:bench", socket_timeout=60)
    key = f"topics:{topic}"
    got: list[Position] = []
    first: Any = client.blpop([key], timeout=30)  # the group join, not timed
    assert first is not None, "gateway consumer got nothing"
    got.append((as_int(first[3]), as_int(first[5])))
    time.sleep(settle)
    start = time.perf_counter()
    while len(got) < records:
        reply: Any = client.blpop([key], timeout=30)
        assert reply is not None, f"BLPOP waited 30 s for nothing after {len(got)} records"
        got.append((as_int(reply[3]), as_int(reply[5])))
    elapsed = time.perf_counter() - start
    client.close()
    return (len(got) - 1) / elapsed, got


def batch_positions(reply: Any, got: list[Position]) -> None:
    """The records of a BLMPOP reply `[key, [[topic, t, partition, p, offset, o, value, v],
    ...]]` onto `got`, each checked as a consumer would read it."""
    for record in reply[1]:
        assert len(record[7]) == SIZE, record
        got.append((record[3], record[5]))


def gateway_consume_batch(
    port: int, topic: str, group: str, records: int, count: int, settle: float
) -> tuple[float, list[Position]]:
    """Records/s of redis-py BLMPOP ... COUNT `count`, after the first record."""
    client = redis.Redis(port=port, client_name=f"{group}:bench", socket_timeout=60)
    key = f"topics:{topic}"
    got: list[Position] = []
    first = client.blmpop(30, 1, key, direction="LEFT", count=1)  # the join, not timed
    assert first is not None, "gateway consumer got nothing"
    batch_positions(first, got)
    time.sleep(settle)
    start = time.perf_counter()
    while len(got) < records:
        reply = client.blmpop(30, 1, key, direction="LEFT", count=min(count, records - len(got)))
        assert reply is not None, f"BLMPOP waited 30 s for nothing after {len(got)} records"
        batch_positions(reply, got)
    elapsed = time.perf_counter() - start
    client.close()
    return (len(got) - 1) / elapsed, got


def raw_consume_batch(
    port: int, topic: str, group: str, records: int, count: int, settle: float
) -> tuple[float, list[Position]]:
    """gateway_consume_batch without redis-py: BLMPOP encoded before the clock starts,
    replies parsed by hiredis. The gap to the redis-py row is the client library's."""
    key = f"topics:{topic}".encode()
    client = RawClient(port, f"{group}:bench")
    got: list[Position] = []
    batch_positions(client.call(b"BLMPOP", b"30", b"1", key, b"LEFT", b"COUNT", b"1"), got)
    full = command(b"BLMPOP", b"30", b"1", key, b"LEFT", b"COUNT", count)
    time.sleep(settle)
    start = time.perf_counter()
    while len(got) < records:
        left = records - len(got)
        client.send(
            full if left >= count else command(b"BLMPOP", 30, 1, key, b"LEFT", b"COUNT", left)
        )
        (reply,) = client.replies(1)
        assert reply is not None, f"BLMPOP waited 30 s for nothing after {len(got)} records"
        batch_positions(reply, got)
    elapsed = time.perf_counter() - start
    client.close()
    return (len(got) - 1) / elapsed, got


def kafka_consume(
    args: argparse.Namespace, broker: TansuBroker, port: int, problems: Problems
) -> None:
    """The consume rows: `--records` records per row and run, all read from one topic
    filled beforehand (see the comment above fill_topic)."""
    records, count, settle = args.records, args.blmpop_count, args.settle
    print(f"Kafka consume: records/s over the same {records:,} stored records per row")
    rows: dict[str, Callable[[str, str], tuple[float, list[Position]]]] = {
        "direct": lambda t, g: direct_consume(broker.bootstrap, t, g, records, settle),
        "blpop": lambda t, g: gateway_consume(port, t, g, records, settle),
        "blmpop": lambda t, g: gateway_consume_batch(port, t, g, records, count, settle),
        "raw": lambda t, g: raw_consume_batch(port, t, g, records, count, settle),
    }
    rates: dict[str, list[float]] = {what: [] for what in rows}
    for run in range(args.runs):
        topic = broker.create_topic(4)
        fill_topic(broker.bootstrap, topic, records)
        # Each run starts with another row: none is always the first to read the topic.
        order = list(rows)[run % len(rows) :] + list(rows)[: run % len(rows)]
        for what in order:
            rate, got = rows[what](topic, f"{what}{run}")
            rates[what].append(rate)
            check_positions(f"Kafka consume, {what}", got, records, problems)
        figures = ", ".join(f"{what} {rates[what][-1]:,.0f}" for what in order)
        print(f"  run {run + 1}: {figures}", flush=True)
    direct, blpop, blmpop, raw = (rates[what] for what in rows)
    name = "direct consumer"
    row("  consume, BLPOP one record per call", blpop, direct, name)
    row(f"  consume, BLMPOP COUNT {count} (redis-py)", blmpop, direct, name)
    row(f"  consume, BLMPOP COUNT {count} (pre-encoded)", raw, direct, name)


# --- Dafka engine ---------------------------------------------------------------------------


class Problems:
    """What the checks of consumed records found: printed as found and after the figures."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def add(self, text: str) -> None:
        print(f"  !! {text}", flush=True)
        self.found.append(text)


# A record as BLPOP hands it out: (partition, offset, value).
Delivered = tuple[int, int, bytes]


def delivered(reply: Sequence[object]) -> Delivered:
    fields = dict(zip(reply[::2], reply[1::2], strict=True))
    value = fields[b"value"]
    assert isinstance(value, bytes), reply
    return as_int(fields[b"partition"]), as_int(fields[b"offset"]), value


def as_int(field: object) -> int:
    """An integer field of a BLPOP reply (an integer in RESP; bytes accepted too)."""
    if isinstance(field, bytes):
        return int(field)
    assert isinstance(field, int), field
    return field


def check_delivered(
    what: str, got: Sequence[Delivered], produced: int | None, problems: Problems
) -> None:
    """No (partition, offset) and no numbered record twice, no gap between the offsets of
    a partition; with `produced`: every record 0 .. produced-1 came."""
    positions: dict[int, list[int]] = {}
    for partition, offset, _ in got:
        positions.setdefault(partition, []).append(offset)
    for partition, offsets in sorted(positions.items()):
        distinct = sorted(set(offsets))
        if len(distinct) != len(offsets):
            problems.add(
                f"{what}: partition {partition}: {len(offsets) - len(distinct)} offsets "
                "delivered twice"
            )
        if distinct[-1] - distinct[0] + 1 != len(distinct):
            problems.add(
                f"{what}: partition {partition}: gaps between offsets {distinct[0]} and "
                f"{distinct[-1]} ({len(distinct)} distinct offsets)"
            )
    numbers = [int(value[:8]) for _, _, value in got if value[:8].isdigit()]
    if len(set(numbers)) != len(numbers):
        problems.add(f"{what}: {len(numbers) - len(set(numbers))} records delivered twice")
    if produced is not None:
        missing = sorted(set(range(produced)) - set(numbers))
        if missing:
            problems.add(
                f"{what}: {len(missing)} of {produced:,} records never delivered "
                f"(numbers {missing[:5]}...)"
            )


class RawClient:
    """A connection without a client library: commands encoded in advance, replies parsed
    by hiredis. What the gateway costs, without what redis-py costs."""

    def __init__(self, port: int, name: str | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = hiredis.Reader()
        if name is not None:
            self.call("CLIENT", "SETNAME", name)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self) -> list[Any]:
        """Every reply that has arrived; waits for at least one."""
        replies: list[Any] = []
        while not replies:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("the gateway closed the connection")
            self.reader.feed(data)
            while (reply := self.reader.gets()) is not False:
                replies.append(reply)
        return replies

    def replies(self, count: int) -> list[Any]:
        """The next `count` replies (no more may be on their way)."""
        got: list[Any] = []
        while len(got) < count:
            got.extend(self.read())
        for reply in got:
            if isinstance(reply, hiredis.ReplyError):
                raise RuntimeError(f"the gateway answered {reply}")
        return got

    def call(self, *args: bytes | str | int) -> Any:
        self.send(command(*args))
        return self.replies(1)[0]

    def close(self) -> None:
        self.sock.close()


def raw_produce(port: int, topic: str, records: int, batch: int) -> float:
    """gateway_produce without redis-py: the same commands, encoded before the clock starts."""
    target = f"topics:{topic}".encode()
    chunks = [
        (
            b"".join(command(b"RPUSHX", target, numbered(i)) for i in range(first, end)),
            end - first,
        )
        for first in range(0, records, batch)
        for end in [min(first + batch, records)]
    ]
    client = RawClient(port)
    start = time.perf_counter()
    for chunk, count in chunks:
        client.send(chunk)
        client.replies(count)
    left = client.call("DUMP", "60000")
    elapsed = time.perf_counter() - start
    assert left == 0, f"{left} records not delivered"
    client.close()
    return records / elapsed


def redis_py_ceiling(port: int, records: int, batch: int) -> float:
    """Records/s of redis-py's pipelined RPUSHX against redis-server: what the client
    library itself can send."""
    client = redis.Redis(port=port)
    start = time.perf_counter()
    pipe = client.pipeline(transaction=False)
    for i in range(records):
        pipe.execute_command("RPUSHX", "topics:bench", numbered(i))
        if (i + 1) % batch == 0:
            pipe.execute()
    pipe.execute()
    elapsed = time.perf_counter() - start
    client.close()
    return records / elapsed


def ceiling_row(ceiling: Sequence[float]) -> None:
    print(
        f"  (redis-py alone, pipelined RPUSHX to redis-server: "
        f"{statistics.median(ceiling):,.0f}/s, the ceiling of the redis-py rows)"
    )


def paced_produce(port: int, topic: str, rate: int, count: int, achieved: Any) -> None:
    """`count` RPUSHX at `rate` records/s on one connection, each value starting with its
    send time (time.monotonic_ns(), 8 bytes, as dafka-perf-store --timestamp); what is due
    at one instant goes in one pipeline (one RPUSHX per round trip tops out below 5,000/s
    here). Then DUMP. Runs in a process of its own."""
    client = RawClient(port)
    target = f"topics:{topic}".encode()
    padding = bytes(SIZE - STAMP.size)
    clock, pack = time.monotonic_ns, STAMP.pack
    started = clock()
    sent = 0
    while sent < count:
        due = min(count, int((clock() - started) * rate / 1e9) + 1)
        if due <= sent:
            time.sleep(0.0005)  # pacing: ahead of the rate
            continue
        client.send(
            b"".join(command(b"RPUSHX", target, pack(clock()) + padding) for _ in range(due - sent))
        )
        client.replies(due - sent)
        sent = due
    achieved.value = count / ((clock() - started) / 1e9)
    assert client.call("DUMP", "30000") == 0, "paced records not durable"
    client.close()


class DafkaBench:
    """An embedded Dafka gateway over a fresh data directory, and the configuration with
    which the Dafka perf tools join its network (the tower it started)."""

    def __init__(
        self,
        workdir: Path,
        problems: Problems,
        dafka: dict[str, Any] | None = None,
        event_loop: str = "uvloop",
    ) -> None:
        self.problems = problems
        data = workdir / "rafka-data"
        document = {
            "gateway": {
                "engine": "dafka",
                "data_dir": str(data),
                "event_loop": event_loop,
                "max_clients": 20_000,
            },
            "dafka": dafka or {},
        }
        config = workdir / "rafka.json"
        config.write_text(json.dumps(document, indent=2))
        self.gateway = RafkaProcess(config)
        self.gateway.start()
        self.port = self.gateway.port
        # The gateway listens once its tower and store answer; the store's configuration
        # names the tower. The perf tools announce themselves every 100 ms (found well
        # within perf-store's one-second start delay).
        stored = Config.load(data / "store-0" / "stored.cfg")
        tools = Config()
        for path in ("beacon/sub_address", "beacon/pub_address"):
            tools.set(path, stored.get(path))
        tools.set("beacon/address", "127.0.0.1")
        tools.set("beacon/interval", 100)
        self.tower = stored.get("beacon/pub_address")
        self.live = workdir / "tools.cfg"
        tools.save(self.live)
        tools.set("consumer/offset/reset", "earliest")
        self.from_start = workdir / "tools-earliest.cfg"
        tools.save(self.from_start)

    def close(self) -> None:
        """Stop the gateway; print what it logged above info (nothing, in a good run)."""
        self.gateway.terminate()
        logged = [
            line
            for line in self.gateway.stderr().splitlines()
            if re.search(
                r"\[(warning|error|critical)|Traceback|child output.*(error|warn)", line, re.I
            )
        ]
        if logged:
            print(f"\nThe Dafka gateway logged {len(logged)} warnings or errors:")
            for line in logged[:10]:
                print(f"  {line[:300]}")

    # -- the perf tools ---------------------------------------------------------------

    def tool(self, config: Path, name: str, *args: str) -> Program:
        return Program(name, "-c", str(config), *args)

    @staticmethod
    def finish(program: Program, timeout: float = TOOL_TIMEOUT) -> list[str]:
        command = shlex.join(program.args)
        try:
            code = program.wait_exit(timeout)
        except ProcessError:
            program.stop()
            raise RuntimeError(f"{command}: still running after {timeout:.0f} s") from None
        if code != 0:
            raise RuntimeError(f"{command}: exit {code}: {program.stderr()}")
        return program.lines

    @staticmethod
    def msg_per_s(lines: list[str]) -> float:
        for line in lines:
            if match := re.fullmatch(r"mean throughput: (\d+) \[msg/s\]", line):
                return float(match.group(1))
        raise RuntimeError(f"no throughput line in {lines}")

    def perf_store(self, count: int) -> float:
        program = self.tool(self.live, "dafka-perf-store", str(count), str(SIZE))
        return self.msg_per_s(self.finish(program))

    def perf_consumer(self, count: int) -> float:
        """Records/s of a new dafka-perf-consumer reading, from the start, records the
        store holds (as BLPOP does in the gateway rows)."""
        program = self.tool(self.from_start, "dafka-perf-consumer", str(count), str(SIZE))
        return self.msg_per_s(self.finish(program))

    def perf_latency(self, rate: int, count: int) -> dict[float, float]:
        """Percentiles (µs) of dafka-perf-consumer --latency next to dafka-perf-store
        --rate --timestamp (the consumer joins during perf-store's start delay)."""
        consumer = self.tool(self.live, "dafka-perf-consumer", "--latency", str(count), str(SIZE))
        try:
            producer = self.tool(
                self.live,
                "dafka-perf-store",
                *("--rate", str(rate), "--timestamp", str(count), str(SIZE)),
            )
            self.finish(producer)
            lines = self.finish(consumer, 60)
        finally:
            consumer.stop()  # nothing to do unless something failed
        found = {}
        for line in lines:
            if match := re.fullmatch(r"latency p([\d.]+): (\d+) \[us\]", line):
                found[float(match.group(1))] = float(match.group(2))
        return {pct: found[pct] for pct in PERCENTILES}

    # -- the gateway --------------------------------------------------------------------

    def warm_up(self, topic: str) -> None:
        """Open the topic's partition writers (keyless records go round-robin) and make
        the records durable, so that no timed request pays for a writer's start."""
        client = RawClient(self.port)
        client.send(command("RPUSHX", f"topics:{topic}", "warm-up") * WARM_UP_RECORDS)
        client.replies(WARM_UP_RECORDS)
        assert client.call("DUMP", "30000") == 0, f"warm-up of {topic} not durable"
        client.close()

    def consume(
        self, group: str, topic: str, count: int, depth: int, batch: int = 0
    ) -> tuple[float, list[Delivered]]:
        """Records/s of `count` BLPOPs with redis-py (after the first one, which joins the
        group), `depth` per pipeline (1: one call at a time), and what they delivered.
        With `batch`, BLMPOP ... COUNT `batch` one call at a time instead."""
        client = redis.Redis(port=self.port, client_name=f"{group}:bench", socket_timeout=60)
        key = f"topics:{topic}"
        got: list[Delivered] = []
        first = client.blpop([key], timeout=30)
        if first is None:
            self.problems.add(f"{group} on {topic}: the first BLPOP got nothing in 30 s")
            return 0.0, got
        got.append(delivered(first))
        start = time.perf_counter()
        while len(got) < count:
            replies: list[Any]
            if batch:
                popped: Any = client.blmpop(10, 1, key, direction="LEFT", count=batch)
                replies = [None] if popped is None else popped[1]
            elif depth == 1:
                replies = [client.blpop([key], timeout=10)]
            else:
                pipe = client.pipeline(transaction=False)
                for _ in range(min(depth, count - len(got))):
                    pipe.blpop([key], timeout=10)
                replies = pipe.execute()
            for reply in replies:
                if reply is None:
                    self.problems.add(
                        f"{group} on {topic}: a BLPOP waited 10 s for nothing after "
                        f"{len(got):,} of {count:,} records"
                    )
                    client.close()
                    return 0.0, got
                got.append(delivered(reply))
        elapsed = time.perf_counter() - start
        client.close()
        return (len(got) - 1) / elapsed, got

    def latency(
        self, topic: str, rate: int, warm_up: float, seconds: float, window: int
    ) -> tuple[dict[float, float], float, float]:
        """Produce-to-BLPOP percentiles (µs) of the records after `warm_up` seconds, with
        `window` BLPOPs in flight on one connection (1: one at a time; -N: one
        `BLMPOP ... COUNT N` at a time); the rates the producer and the consumer (first
        record to last) achieved."""
        count = int(rate * (warm_up + seconds))
        self.warm_up(topic)
        client = RawClient(self.port, f"latency-{topic}:bench")
        blpop = command("BLPOP", f"topics:{topic}", 10)
        # Join the group (and take the warm-up records) before the producer starts.
        client.send(blpop * WARM_UP_RECORDS)
        client.replies(WARM_UP_RECORDS)
        context = multiprocessing.get_context("spawn")
        achieved = context.Value("d", 0.0)
        producer = context.Process(
            target=paced_produce, args=(self.port, topic, rate, count, achieved), daemon=True
        )
        clock, unpack = time.monotonic_ns, STAMP.unpack_from
        latencies: list[int] = []
        got: list[Delivered] = []
        producer.start()
        first = last = 0
        batch = -window if window < 0 else 0
        if batch:
            blpop = command("BLMPOP", 10, 1, f"topics:{topic}", "LEFT", "COUNT", batch)
            window = 1
        # This process's own collector stops the world for 20-30 ms once `got` holds tens
        # of thousands of tuples: its pauses showed as the gateway's p99 (the reference,
        # dafka-perf-consumer, is C). The gateway's own pauses still count.
        gc.disable()
        try:
            client.send(blpop * min(window, count))
            sent = min(window, count)
            while len(got) < count:
                replies = client.read()
                now = last = clock()
                first = first or now
                for reply in replies:
                    if reply is None or isinstance(reply, hiredis.ReplyError):
                        raise RuntimeError(f"BLPOP answered {reply!r}")
                    for one in reply[1] if batch else [reply]:
                        record = delivered(one)
                        got.append(record)
                        latencies.append(now - unpack(record[2])[0])
                more = len(replies) if batch else min(len(replies), count - sent)
                if more > 0 and len(got) < count:
                    client.send(blpop * more)
                    sent += more
        except (RuntimeError, OSError) as error:
            self.problems.add(f"latency on {topic}: {error} after {len(got):,} of {count:,}")
        finally:
            gc.enable()
            consumed = (len(got) - 1) / ((last - first) / 1e9) if last > first else 0.0
            producer.join(60)
            client.close()
        if producer.exitcode != 0:
            self.problems.add(f"latency on {topic}: the producer exited with {producer.exitcode}")
        stamps = [unpack(value)[0] for _, _, value in got]  # unique: monotonic_ns
        if len(set(stamps)) != len(stamps):
            self.problems.add(
                f"latency on {topic}: {len(stamps) - len(set(stamps))} records delivered twice"
            )
        check_delivered(f"latency on {topic}", got, None, self.problems)
        measured = sorted(latencies[int(rate * warm_up) :]) or [0]
        figures = {pct: percentile(measured, pct) / 1000 for pct in PERCENTILES}
        return figures, achieved.value, consumed


def dafka_bench(args: argparse.Namespace, problems: Problems) -> None:
    runs, records = args.runs, args.records
    with tempfile.TemporaryDirectory(prefix="rafka-bench-") as scratch:
        bench = DafkaBench(Path(scratch), problems, event_loop=args.event_loop)
        redis_server = start_redis_server()
        redis_port = redis_server.port
        try:
            print(
                f"\n== Dafka engine: rafka gateway on :{bench.port}, embedded (its own "
                f"dafka-towerd, pub {bench.tower}, and one dafka-stored, fsync before ACK); "
                f"the perf tools join its network; {records:,} records of {SIZE} bytes; "
                f"medians of {runs} runs\n",
                flush=True,
            )
            bench.warm_up("bench-front")
            resp_front(bench.port, "topics:bench-front", redis_port, args)
            print(flush=True)
            if args.front_only:
                return
            perf_store, piped, raw, multi, ceiling = [], [], [], [], []
            perf_consumer, one, pipelined, batched = [], [], [], []
            for run in range(runs):
                topic_piped, topic_raw, topic_multi = (
                    f"bench-{kind}-{run}" for kind in ("piped", "raw", "multi")
                )
                perf_store.append(bench.perf_store(records))
                bench.warm_up(topic_piped)
                piped.append(gateway_produce(bench.port, topic_piped, records, 1000))
                bench.warm_up(topic_raw)
                raw.append(raw_produce(bench.port, topic_raw, records, 1000))
                bench.warm_up(topic_multi)
                multi.append(gateway_produce_multi(bench.port, topic_multi, records, 100))
                ceiling.append(redis_py_ceiling(redis_port, records, 1000))
                perf_consumer.append(bench.perf_consumer(records))
                rate, got = bench.consume(
                    f"one{run}", topic_multi, args.consume_records + WARM_UP_RECORDS, 1
                )
                one.append(rate)
                check_delivered(f"BLPOP one per call, {topic_multi}", got, None, problems)
                # Every record of the topic: each one must come exactly once.
                rate, got = bench.consume(
                    f"piped{run}", topic_piped, records + WARM_UP_RECORDS, args.blpop_pipeline
                )
                pipelined.append(rate)
                check_delivered(f"pipelined BLPOP, {topic_piped}", got, records, problems)
                rate, got = bench.consume(
                    f"batch{run}", topic_raw, records + WARM_UP_RECORDS, 1, args.blmpop_count
                )
                batched.append(rate)
                check_delivered(f"BLMPOP, {topic_raw}", got, records, problems)
                print(
                    f"  run {run + 1}: perf-store {perf_store[-1]:,.0f}, RPUSHX piped "
                    f"{piped[-1]:,.0f} (pre-encoded {raw[-1]:,.0f}), RPUSHX x100 "
                    f"{multi[-1]:,.0f}; perf-consumer {perf_consumer[-1]:,.0f}, BLPOP "
                    f"{one[-1]:,.0f}, BLPOP piped {pipelined[-1]:,.0f}, BLMPOP "
                    f"{batched[-1]:,.0f} records/s",
                    flush=True,
                )

            print("\nDafka path: records/s, gateway vs the Dafka perf tools on the same store")
            perf = "dafka-perf-store"
            row("  produce, pipelined RPUSHX (1000) + DUMP", piped, perf_store, perf)
            row("    the same, pre-encoded (no redis-py)", raw, perf_store, perf)
            row("  produce, RPUSHX with 100 values + DUMP", multi, perf_store, perf)
            perf = "dafka-perf-consumer"
            row("  consume, BLPOP one record per call", one, perf_consumer, perf)
            row(
                f"  consume, pipelined BLPOP ({args.blpop_pipeline})",
                pipelined,
                perf_consumer,
                perf,
            )
            row(f"  consume, BLMPOP COUNT {args.blmpop_count}", batched, perf_consumer, perf)
            if args.idle_connections:
                assert bench.gateway.child is not None
                per_connection, served = idle_connections(
                    bench.port, bench.gateway.child.popen.pid, args.idle_connections
                )
                print(
                    f"  {args.idle_connections:,} idle connections, each served a PING: "
                    f"{served:,} answered, gateway RSS {per_connection:.1f} KB per connection"
                )
            ceiling_row(ceiling)
            print(
                "\n(latency: dafka-perf-consumer's percentiles are over all its records, "
                "warm-up included; ratios are gateway/perf tools at p50/p90/p99/p99.9)"
            )
            for rate, windows in args.latency.items():
                dafka_latency(bench, args, rate, windows)
        finally:
            redis_server.stop()
            bench.close()


def dafka_latency_only(args: argparse.Namespace, problems: Problems) -> None:
    with tempfile.TemporaryDirectory(prefix="rafka-bench-") as scratch:
        bench = DafkaBench(Path(scratch), problems, event_loop=args.event_loop)
        try:
            for rate, windows in args.latency.items():
                dafka_latency(bench, args, rate, windows)
        finally:
            bench.close()


def dafka_latency(
    bench: DafkaBench, args: argparse.Namespace, rate: int, windows: list[int]
) -> None:
    warm, seconds, runs = args.warm_up, args.seconds, args.runs
    print(
        f"\nProduce-to-BLPOP latency at {rate:,} records/s ({seconds:g} s measured after "
        f"{warm:g} s; the producer pipelines what is due at each instant, one connection), "
        f"medians of {runs} runs",
        flush=True,
    )
    ours: dict[int, list[tuple[dict[float, float], float]]] = {window: [] for window in windows}
    reference: list[dict[float, float]] = []
    for run in range(runs):
        reference.append(bench.perf_latency(rate, int(rate * (warm + seconds))))
        notes = []
        for window in windows:
            figures, produced, consumed = bench.latency(
                f"bench-latency-{rate}-{window}-{run}", rate, warm, seconds, window
            )
            ours[window].append((figures, consumed))
            notes.append(
                f"{window_label(window)}: {latency_text(figures)} ({produced:,.0f}/s produced, "
                f"{consumed:,.0f}/s consumed)"
            )
        print(
            f"  run {run + 1}: " + "; ".join(notes) + f"; perf tools {latency_text(reference[-1])}"
            f" (load average {os.getloadavg()[0]:.1f})",
            flush=True,
        )
    theirs = median_percentiles(reference)
    for window in windows:
        mine = median_percentiles([figures for figures, _ in ours[window]])
        consumed = statistics.median(rate for _, rate in ours[window])
        label = window_label(window)
        ratios = "/".join(f"{mine[pct] / max(theirs[pct], 1):.0f}" for pct in PERCENTILES)
        behind = (
            f"; FELL BEHIND: consumed {consumed:,.0f}/s, the latency is the backlog"
            if consumed < 0.95 * rate
            else ""
        )
        print(f"  {'RPUSHX -> ' + label:<40} {latency_text(mine)}   ratio {ratios}{behind}")
    print(f"  {'dafka-perf-store -> dafka-perf-consumer':<40} {latency_text(theirs)}")


def window_label(window: int) -> str:
    if window < 0:
        return f"BLMPOP COUNT {-window}"
    return "one BLPOP at a time" if window == 1 else f"{window} BLPOPs in flight"


def median_percentiles(runs: Sequence[dict[float, float]]) -> dict[float, float]:
    return {pct: statistics.median(run[pct] for run in runs) for pct in PERCENTILES}


def latency_text(figures: dict[float, float]) -> str:
    return " ".join(f"p{pct:g} {figures[pct] / 1000:.2f} ms" for pct in PERCENTILES)


def latency_runs(text: str) -> dict[int, list[int]]:
    """`5000:100,1000:1,1000:m500` -> {5000: [100], 1000: [1, -500]}: BLPOPs in flight per
    rate; `mN`: one BLMPOP COUNT N at a time (-N)."""
    runs: dict[int, list[int]] = {}
    for item in text.split(","):
        rate, _, window = item.partition(":")
        count = -int(window[1:]) if window.startswith("m") else int(window or 1)
        runs.setdefault(int(rate), []).append(count)
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("dafka", "kafka", "both"), default="both")
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (the median)")
    parser.add_argument("--records", type=int, default=100_000, help="records per produce run")
    parser.add_argument(
        "--consume-records",
        type=int,
        default=10_000,
        help="Dafka: records per BLPOP-per-call run (Kafka consume rows all read --records)",
    )
    parser.add_argument(
        "--kafka-consume-only", action="store_true", help="Kafka: only the consume rows"
    )
    parser.add_argument("--latency-only", action="store_true", help="Dafka: only the latency rows")
    parser.add_argument(
        "--front-only", action="store_true", help="only the RESP front rows (redis-benchmark)"
    )
    parser.add_argument(
        "--kafka-produce-only",
        action="store_true",
        help="Kafka: only the RESP front and produce rows (no consume rows)",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=1.0,
        help="Kafka consume rows: seconds each consumer waits after its first record, "
        "before its clock starts (prefetch, for every row alike)",
    )
    parser.add_argument("--blpop-pipeline", type=int, default=200, help="BLPOPs per pipeline")
    parser.add_argument("--blmpop-count", type=int, default=500, help="BLMPOP's COUNT")
    parser.add_argument(
        "--idle-connections", type=int, default=10_000, help="idle connections (0: none)"
    )
    parser.add_argument(
        "--event-loop", choices=("asyncio", "uvloop"), default="uvloop", help="the gateway's"
    )
    parser.add_argument(
        "--latency",
        type=latency_runs,
        default=latency_runs("10000:100,10000:m500,1000:1,1000:m500"),
        help="latency runs as RATE:BLPOPS_IN_FLIGHT or RATE:mCOUNT (one BLMPOP COUNT at a "
        "time),... (default 10000:100,10000:m500,1000:1,1000:m500)",
    )
    parser.add_argument(
        "--linger-ms",
        type=int,
        help="Kafka: queue.buffering.max.ms of the gateway's and the direct producer "
        "(default: the tests' configuration, 0; librdkafka's own default is 5)",
    )
    parser.add_argument("--warm-up", type=float, default=1.0, help="latency: seconds not measured")
    parser.add_argument("--seconds", type=float, default=3.0, help="latency: seconds measured")
    args = parser.parse_args()
    problems = Problems()
    if args.engine in ("dafka", "both"):
        if args.latency_only:
            dafka_latency_only(args, problems)
        else:
            dafka_bench(args, problems)
    if args.engine in ("kafka", "both"):
        kafka_bench(args, problems)
    if problems.found:
        print(f"\n{len(problems.found)} problems with records consumed through the gateway:")
        for text in problems.found:
            print(f"  {text}")
    elif args.engine != "kafka":
        print("\nEvery record consumed through the gateway on Dafka came once, without a gap.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
