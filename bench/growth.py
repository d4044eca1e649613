"""How the gateway's cost grows with topics and consumer groups, on both engines.

For each engine (embedded Dafka; Kafka on a Tansu broker) and each shape -- 1, 100 and
1,000 topics with one group; 10 and 100 groups on one topic -- a fresh gateway (and a
fresh broker) is started and:
1. every topic gets one warm-up record (DUMP), and every group's consumer joins (one
   connection per group, its BLPOP key listing every topic) and reads its warm-up
   records: set-up, not timed;
2. produce: --records records of 100 bytes, round-robin over the topics, pipelined
   RPUSHX (1,000 per pipeline) on one connection, then DUMP: records/s;
3. consume: every group reads --deliveries / groups of them (all of them at most) at
   once, each connection with --window BLPOPs in flight: records delivered per second,
   all groups together;
4. the gateway's RSS (VmRSS of the `rafka` process; on Dafka, the embedded tower and
   stores are processes of their own and not counted), its threads and open files, and
   the CPU seconds its child processes (Dafka: the embedded tower and stores) used.
Each figure is printed next to the 1-topic, 1-group figure of the same engine in the same
run, with the ratio (issue 11's aim: within 20%, i.e. a ratio of 0.8 or more for the
rates, at most 1.2 for RSS).

Prints the curve; never passes or fails anything. Usage: `make bench-growth`, or
`.venv/bin/python bench/growth.py [--engine dafka|kafka|both] [--records N] ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hiredis
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.connections import raise_open_files, rss_bytes
from tests.support.kafka import kafka_document
from tests.support.rafka_process import start_rafka
from tests.support.tansu import TansuBroker

VALUE = b"x" * 100
# Open files the gateway may need: on Kafka a few per broker connection; on Dafka no more
# with 1,000 topics than with one (docs/dafka-engine.md). Raised in case.
OPEN_FILES = 100_000
PIPELINE = 1000  # RPUSHX per pipeline
WAIT = 30  # BLPOP timeout (s): a group that waits this long for a record has a problem
SHAPES = ((1, 1), (100, 1), (1000, 1), (1, 10), (1, 100))  # (topics, groups)


def encode(*args: bytes | str | int) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        raw = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(parts)


class Client:
    """One connection: commands sent encoded, replies parsed by hiredis."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._parser = hiredis.Reader()

    @classmethod
    async def connect(cls, port: int, name: str | None = None) -> Client:
        client = cls(*await asyncio.open_connection("127.0.0.1", port))
        if name is not None:
            await client.call("CLIENT", "SETNAME", name)
        return client

    async def replies(self, data: bytes, count: int) -> list[Any]:
        """Send `data`, then read `count` replies; an error reply raises."""
        self._writer.write(data)
        got: list[Any] = []
        while len(got) < count:
            while (reply := self._parser.gets()) is not False:
                if isinstance(reply, hiredis.ReplyError):
                    raise RuntimeError(f"the gateway answered {reply}")
                got.append(reply)
            if len(got) < count:
                chunk = await self._reader.read(1 << 16)
                if not chunk:
                    raise ConnectionError("the gateway closed the connection")
                self._parser.feed(chunk)
        return got

    async def call(self, *args: bytes | str | int) -> Any:
        return (await self.replies(encode(*args), 1))[0]

    async def close(self) -> None:
        self._writer.close()
        await self._writer.wait_closed()


@dataclass
class Figures:
    produce: float  # records/s
    consume: float  # records delivered/s, all groups
    rss: float  # bytes
    setup: float  # seconds: warm-up and joins
    threads: float = 0.0  # the gateway's, at the end
    files: float = 0.0  # the gateway's open files, at the end
    children_cpu: float = 0.0  # seconds of CPU its child processes used, all of the shape


def threads_and_files(pid: int) -> tuple[int, int]:
    """The process's thread count and open file descriptors."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1]), len(list(Path(f"/proc/{pid}/fd").iterdir()))
    raise RuntimeError(f"no Threads for process {pid}")


def children_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by the live children of `pid`."""
    ticks = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                fields = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
            except FileNotFoundError:
                continue
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def topic_names(count: int) -> list[str]:
    return [f"growth-{i:04d}" for i in range(count)]


async def produce(port: int, topics: Sequence[str], records: int) -> float:
    """Records/s of pipelined RPUSHX round-robin over `topics`, until DUMP answers 0."""
    targets = [f"topics:{topic}".encode() for topic in topics]
    chunks = [
        b"".join(encode(b"RPUSHX", targets[i % len(targets)], VALUE) for i in range(first, end))
        for first in range(0, records, PIPELINE)
        for end in [min(first + PIPELINE, records)]
    ]
    client = await Client.connect(port)
    start = time.perf_counter()
    for chunk, first in zip(chunks, range(0, records, PIPELINE), strict=True):
        await client.replies(chunk, min(PIPELINE, records - first))
    left = await client.call("DUMP", "120000")
    elapsed = time.perf_counter() - start
    await client.close()
    if left != 0:
        raise RuntimeError(f"{left} records not durable after DUMP")
    return records / elapsed


async def consume(client: Client, key: bytes, count: int, window: int) -> None:
    """`count` records with `window` BLPOPs in flight; raises if one waits in vain."""
    got = 0
    while got < count:
        batch = min(window, count - got)
        for reply in await client.replies(encode(b"BLPOP", key, WAIT) * batch, batch):
            if reply is None:
                raise RuntimeError(f"a BLPOP waited {WAIT} s for nothing after {got} records")
            got += 1


async def shape(
    port: int, topics: int, groups: int, records: int, deliveries: int, window: int
) -> tuple[float, float, float]:
    """(produce records/s, consume records/s, set-up seconds) of one shape."""
    names = topic_names(topics)
    key = ("topics:" + ",".join(names)).encode()
    started = time.perf_counter()
    warm = await Client.connect(port)
    await warm.replies(
        b"".join(encode(b"RPUSHX", f"topics:{t}", b"warm-up") for t in names), topics
    )
    if await warm.call("DUMP", "120000") != 0:
        raise RuntimeError("warm-up records not durable")
    await warm.close()
    consumers = [await Client.connect(port, f"growth-{g}:c") for g in range(groups)]
    await asyncio.gather(*(consume(c, key, topics, window) for c in consumers))
    setup = time.perf_counter() - started
    produced = await produce(port, names, records)
    each = min(records, max(1, deliveries // groups))
    start = time.perf_counter()
    await asyncio.gather(*(consume(c, key, each, window) for c in consumers))
    consumed = each * groups / (time.perf_counter() - start)
    for client in consumers:
        await client.close()
    return produced, consumed, setup


@contextmanager
def gateway(engine: str, workdir: Path, topics: int, partitions: int) -> Iterator[tuple[int, int]]:
    """A fresh `rafka` on `engine` with `topics` topics of `partitions` partitions; (port,
    pid). What it logged last is printed when the block fails."""
    document: dict[str, Any] = {"gateway": {"max_clients": 1000}}
    if engine == "dafka":
        document["dafka"] = {"partitions": partitions}
    broker = None
    if engine == "kafka":
        broker = TansuBroker()
        broker.start()
        document.update(kafka_document(broker.bootstrap))
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        new = [NewTopic(name, partitions, 1) for name in topic_names(topics)]
        for future in admin.create_topics(new, operation_timeout=60).values():
            future.result(120)
    try:
        child, port = start_rafka(workdir, document, "--engine", engine)
        try:
            yield port, child.pid
        except BaseException:
            print("  the gateway's last lines:", *child.stderr_lines[-15:], sep="\n    ")
            raise
        finally:
            code = child.stop(60)
            if code != 0:
                print(f"  rafka exited with {code}: {child.stderr_lines[-5:]}", flush=True)
    finally:
        if broker is not None:
            broker.stop()


def measure(engine: str, topics: int, groups: int, args: argparse.Namespace) -> Figures | None:
    """The medians of --runs runs of one shape; None (and what went wrong, printed) when a
    run failed."""
    try:
        return median_of_runs(engine, topics, groups, args)
    except Exception as error:
        print(f"  {topics} topics, {groups} groups: failed: {error!r}", flush=True)
        return None


def median_of_runs(engine: str, topics: int, groups: int, args: argparse.Namespace) -> Figures:
    runs: list[Figures] = []
    for _ in range(args.runs):
        with (
            tempfile.TemporaryDirectory(prefix="rafka-bench-growth-") as tmp,
            gateway(engine, Path(tmp), topics, args.partitions) as (port, pid),
        ):
            work = shape(port, topics, groups, args.records, args.deliveries, args.window)
            try:
                produced, consumed, setup = asyncio.run(asyncio.wait_for(work, args.bound))
            except TimeoutError:
                raise RuntimeError(f"not done within --bound {args.bound:g} s") from None
            threads, files = threads_and_files(pid)
            runs.append(
                Figures(
                    produced,
                    consumed,
                    float(rss_bytes(pid)),
                    setup,
                    threads,
                    files,
                    children_cpu(pid),
                )
            )
    return Figures(
        *(statistics.median(getattr(f, name) for f in runs) for name in Figures.__annotations__)
    )


def print_row(label: str, figures: Figures, reference: Figures | None) -> None:
    """The figures, with their ratios to the reference (none when the 1-topic, 1-group
    shape failed)."""

    def ratio(mine: float, theirs: float | None) -> str:
        return f"{mine / theirs:5.2f}" if theirs else "    -"

    produce = ratio(figures.produce, reference.produce if reference else None)
    consume = ratio(figures.consume, reference.consume if reference else None)
    rss = ratio(figures.rss, reference.rss if reference else None)
    print(
        f"  {label:<20} {figures.produce:>9,.0f}/s {produce}   "
        f"{figures.consume:>9,.0f}/s {consume}   "
        f"{figures.rss / 2**20:>7,.1f} MiB {rss}   {figures.setup:6.1f} s   "
        f"{figures.threads:>7,.0f} {figures.files:>7,.0f} {figures.children_cpu:>8.1f} s",
        flush=True,
    )


def parse_shapes(text: str) -> tuple[tuple[int, int], ...]:
    """`1x1,100x1` -> ((1, 1), (100, 1))."""
    try:
        shapes = tuple(
            (int(topics), int(groups))
            for topics, groups in (item.split("x") for item in text.split(","))
        )
    except ValueError:
        raise argparse.ArgumentTypeError(f"not TOPICSxGROUPS,...: {text!r}") from None
    if not shapes or any(t < 1 or g < 1 for t, g in shapes):
        raise argparse.ArgumentTypeError(f"topics and groups are at least 1: {text!r}")
    return shapes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("dafka", "kafka", "both"), default="both")
    parser.add_argument("--records", type=int, default=20_000, help="records produced")
    parser.add_argument(
        "--deliveries", type=int, default=20_000, help="records consumed, all groups together"
    )
    parser.add_argument("--window", type=int, default=100, help="BLPOPs in flight per group")
    parser.add_argument("--runs", type=int, default=1, help="runs per figure (the median)")
    parser.add_argument(
        "--partitions", type=int, default=1, help="per topic (Dafka's default is 4)"
    )
    parser.add_argument(
        "--bound", type=float, default=120.0, help="seconds one shape may take (then: failed)"
    )
    parser.add_argument(
        "--shapes",
        type=parse_shapes,
        default=SHAPES,
        help="TOPICSxGROUPS,... (default: 1x1,100x1,1000x1,1x10,1x100); ratios are to the "
        "first one",
    )
    args = parser.parse_args()
    limit = raise_open_files(OPEN_FILES)
    if limit < OPEN_FILES:
        print(f"open files limited to {limit} (ulimit -Hn): 1,000 topics may not fit")
    engines = ("dafka", "kafka") if args.engine == "both" else (args.engine,)
    for engine in engines:
        print(
            f"\n{engine} engine, {args.partitions} partition(s) per topic: {args.records:,} "
            f"records produced, {args.deliveries:,} consumed (median of {args.runs}); "
            "ratio to 1 topic / 1 group",
            flush=True,
        )
        print(
            f"  {'shape':<20} {'produce':>11} {'ratio':>5}   {'consume':>11} {'ratio':>5}   "
            f"{'RSS':>11} {'ratio':>5}   {'set-up':>8}   {'threads':>7} {'files':>7} "
            f"{'children':>10}",
            flush=True,
        )
        reference: Figures | None = None
        for topics, groups in args.shapes:
            figures = measure(engine, topics, groups, args)
            if figures is None:
                continue
            if (topics, groups) == args.shapes[0]:
                reference = figures
            label = f"{topics} topic{'s' * (topics > 1)}, {groups} group{'s' * (groups > 1)}"
            print_row(label, figures, reference)
    return 0


if __name__ == "__main__":
    sys.exit(main())
