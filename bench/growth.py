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
4. the gateway's RSS (VmRSS of the `rafka` process, every group still joined; on Dafka,
   the embedded tower and stores are processes of their own and not counted), its threads
   and open files, and the CPU seconds its child processes (Dafka: the embedded tower and
   stores) used, and its own CPU (all its threads) per record produced and per record
   consumed: on a shared machine the rates move with everyone else's load, the CPU a
   record costs much less;
5. batch consume: as many records as one group read are produced again (not timed), and
   every group reads as many more with BLMPOP COUNT --window, BATCHES_IN_FLIGHT calls in
   flight: records delivered per second, all groups together. A BLPOP carries the
   group's whole topic list (12 KB over 1,000 topics) for one record; a BLMPOP carries
   it for up to COUNT (docs/gateway.md, "What scale costs"). The BLMPOP figures are
   printed over the direct consume rate too.
Each shape is then run again without the gateway, by a process of its own: on Kafka a
direct confluent-kafka client configured as the gateway's engine (bench/growth_direct.py,
on a fresh broker); on Dafka the engine's Python interface driven directly, as the
gateway calls it (bench/growth_engine.py, on a fresh data directory: its own tower and
stores). The gateway's figures are printed over the direct ones: a ratio that falls along
the curve is the gateway's own cost, one that holds is the engine's (on Kafka, the
broker's and librdkafka's).
Each figure is printed next to the 1-topic, 1-group figure of the same engine in the same
run, with the ratio (issue 11's aim: within 20%, i.e. a ratio of 0.8 or more for the
rates, at most 1.2 for RSS).

Prints the curve; never passes or fails anything. Usage: `make bench-growth`, or
`.venv/bin/python bench/growth.py [--engine dafka|kafka|both] [--records N] ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hiredis
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backends.process import ProcessError
from tests.support.child_process import run_to_end
from tests.support.connections import raise_open_files, rss_bytes
from tests.support.kafka import kafka_document
from tests.support.processes import children_cpu, process_cpu, threads_and_files
from tests.support.rafka_process import start_rafka
from tests.support.resp import command
from tests.support.tansu import TansuBroker

VALUE = b"x" * 100
# Open files the gateway may need: on Kafka a few per broker connection; on Dafka no more
# with 1,000 topics than with one (docs/dafka-engine.md). Raised in case.
OPEN_FILES = 100_000
PIPELINE = 1000  # RPUSHX per pipeline
WAIT = 30  # BLPOP timeout (s): a group that waits this long for a record has a problem
# BLMPOP calls a group keeps in flight: one would leave the gateway idle for each round
# trip, as one BLPOP at a time does.
BATCHES_IN_FLIGHT = 4
SHAPES = ((1, 1), (100, 1), (1000, 1), (1, 10), (1, 100))  # (topics, groups)


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
        return (await self.replies(command(*args), 1))[0]

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
    # CPU microseconds the gateway (all its threads) spent per record produced, consumed:
    # what the rates cost, which other people's load on a shared machine moves much less.
    produce_cpu: float = 0.0
    consume_cpu: float = 0.0
    # Records delivered/s with BLMPOP, all groups (the gateway's only: 0 for the references).
    batch_consume: float = 0.0


def topic_names(count: int) -> list[str]:
    return [f"growth-{i:04d}" for i in range(count)]


async def produce(port: int, topics: Sequence[str], records: int) -> float:
    """Records/s of pipelined RPUSHX round-robin over `topics`, until DUMP answers 0."""
    targets = [f"topics:{topic}".encode() for topic in topics]
    chunks = [
        b"".join(command(b"RPUSHX", targets[i % len(targets)], VALUE) for i in range(first, end))
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
        for reply in await client.replies(command(b"BLPOP", key, WAIT) * batch, batch):
            if reply is None:
                raise RuntimeError(f"a BLPOP waited {WAIT} s for nothing after {got} records")
            got += 1


async def consume_batches(client: Client, key: bytes, count: int, per_call: int) -> None:
    """`count` records with BLMPOP COUNT `per_call`, BATCHES_IN_FLIGHT calls in flight,
    never asking for more than are left (a call for records that never come would wait
    WAIT seconds); raises if one waits in vain."""
    got = 0
    while got < count:
        left = count - got
        asks: list[int] = []
        while left > 0 and len(asks) < BATCHES_IN_FLIGHT:
            asks.append(min(per_call, left))
            left -= asks[-1]
        calls = b"".join(command(b"BLMPOP", WAIT, 1, key, b"LEFT", b"COUNT", ask) for ask in asks)
        for reply in await client.replies(calls, len(asks)):
            if reply is None:
                raise RuntimeError(f"a BLMPOP waited {WAIT} s for nothing after {got} records")
            got += len(reply[1])


async def shape(
    port: int, pid: int, topics: int, groups: int, records: int, deliveries: int, window: int
) -> Figures:
    """The figures of one shape; the RSS is read while every group is still joined."""
    names = topic_names(topics)
    key = ("topics:" + ",".join(names)).encode()
    started = time.perf_counter()
    warm = await Client.connect(port)
    await warm.replies(
        b"".join(command(b"RPUSHX", f"topics:{t}", b"warm-up") for t in names), topics
    )
    if await warm.call("DUMP", "120000") != 0:
        raise RuntimeError("warm-up records not durable")
    await warm.close()
    consumers = [await Client.connect(port, f"growth-{g}:c") for g in range(groups)]
    await asyncio.gather(*(consume(c, key, topics, window) for c in consumers))
    setup = time.perf_counter() - started
    cpu = process_cpu(pid)
    produced = await produce(port, names, records)
    produce_cpu = (process_cpu(pid) - cpu) * 1e6 / records
    each = min(records, max(1, deliveries // groups))
    cpu = process_cpu(pid)
    start = time.perf_counter()
    await asyncio.gather(*(consume(c, key, each, window) for c in consumers))
    consumed = each * groups / (time.perf_counter() - start)
    consume_cpu = (process_cpu(pid) - cpu) * 1e6 / (each * groups)
    rss = float(rss_bytes(pid))
    threads, files = threads_and_files(pid)
    await produce(port, names, each)
    start = time.perf_counter()
    await asyncio.gather(*(consume_batches(c, key, each, window) for c in consumers))
    batch_consumed = each * groups / (time.perf_counter() - start)
    for client in consumers:
        await client.close()
    return Figures(
        produced,
        consumed,
        rss,
        setup,
        threads,
        files,
        children_cpu(pid),
        produce_cpu,
        consume_cpu,
        batch_consumed,
    )


@contextmanager
def kafka_broker(topics: int, partitions: int) -> Iterator[str]:
    """A fresh Tansu broker with `topics` topics of `partitions` partitions, all created
    before anything is timed; its bootstrap address."""
    broker = TansuBroker()
    broker.start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 3})
        new = [NewTopic(name, partitions, 1) for name in topic_names(topics)]
        for future in admin.create_topics(new, operation_timeout=60).values():
            future.result(120)
        yield broker.bootstrap
    finally:
        broker.stop()


def kafka_sections(bootstrap: str, extra: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The gateway's Kafka sections: the tests' document with --kafka-document over it."""
    document: dict[str, Any] = kafka_document(bootstrap)
    for name, section in extra.items():
        document.setdefault(name, {}).update(section)
    return document


def dafka_document(args: argparse.Namespace) -> dict[str, Any]:
    """The gateway's configuration on Dafka (the direct engine's too)."""
    dafka = {"partitions": args.partitions, **args.dafka_settings}
    return {"gateway": {"max_clients": 1000}, "dafka": dafka}


@contextmanager
def gateway(
    engine: str, workdir: Path, topics: int, args: argparse.Namespace
) -> Iterator[tuple[int, int]]:
    """A fresh `rafka` on `engine` with `topics` topics of --partitions partitions;
    (port, pid). What it logged last is printed when the block fails."""
    document: dict[str, Any] = {"gateway": {"max_clients": 1000}}
    with ExitStack() as stack:
        if engine == "dafka":
            document = dafka_document(args)
        else:
            bootstrap = stack.enter_context(kafka_broker(topics, args.partitions))
            document.update(kafka_sections(bootstrap, args.kafka_document))
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


def direct(engine: str, topics: int, groups: int, args: argparse.Namespace) -> Figures:
    """One run of the engine's reference in the same shape, a process of its own: on
    Kafka bench/growth_direct.py (a direct confluent-kafka client configured as the
    gateway's engine) on a fresh broker; on Dafka bench/growth_engine.py (the engine's
    interface without the gateway) on a fresh data directory."""
    shape = [
        *("--groups", str(groups), "--topics", ",".join(topic_names(topics))),
        *("--records", str(args.records), "--deliveries", str(args.deliveries)),
    ]
    with ExitStack() as stack:
        if engine == "dafka":
            name = "growth_engine.py"
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="rafka-bench-growth-"))
            where = ["--data-dir", str(Path(tmp) / "data")]
            document = dafka_document(args)
        else:
            name = "growth_direct.py"
            where = ["--bootstrap", stack.enter_context(kafka_broker(topics, args.partitions))]
            document = args.kafka_document
        command = [
            sys.executable,
            str(Path(__file__).with_name(name)),
            *where,
            *shape,
            *("--document", json.dumps(document)),
        ]
        # Through backends.process: it dies with this bench, even a SIGKILLed one.
        try:
            done = run_to_end(command, args.bound, check=False, name=name)
        except ProcessError:
            raise RuntimeError(f"{name} not done within --bound {args.bound:g} s") from None
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed: {done.stderr_lines[-3:]}")
    # growth_direct.py reports the first four figures; growth_engine.py all of them.
    return Figures(**json.loads(done.stdout_lines[-1]))


def measure(engine: str, topics: int, groups: int, args: argparse.Namespace) -> Figures | None:
    """The medians of --runs runs of one shape; None (and what went wrong, printed) when a
    run failed."""
    try:
        return median_of_runs(engine, topics, groups, args)
    except Exception as error:
        print(f"  {topics} topics, {groups} groups: failed: {error!r}", flush=True)
        return None


def measure_direct(
    engine: str, topics: int, groups: int, args: argparse.Namespace
) -> Figures | None:
    """As measure(), for the engine's reference (see direct())."""
    try:
        return median([direct(engine, topics, groups, args) for _ in range(args.runs)])
    except Exception as error:
        print(f"  {DIRECT_LABEL[engine]:<20} failed: {error!r}", flush=True)
        return None


def median_of_runs(engine: str, topics: int, groups: int, args: argparse.Namespace) -> Figures:
    runs: list[Figures] = []
    for _ in range(args.runs):
        with (
            tempfile.TemporaryDirectory(prefix="rafka-bench-growth-") as tmp,
            gateway(engine, Path(tmp), topics, args) as (port, pid),
        ):
            work = shape(port, pid, topics, groups, args.records, args.deliveries, args.window)
            try:
                runs.append(asyncio.run(asyncio.wait_for(work, args.bound)))
            except TimeoutError:
                raise RuntimeError(f"not done within --bound {args.bound:g} s") from None
    return median(runs)


def median(runs: Sequence[Figures]) -> Figures:
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
    batch = (
        f"{figures.batch_consume:>9,.0f}/s "
        f"{ratio(figures.batch_consume, reference.batch_consume if reference else None)}"
        if figures.batch_consume
        else f"{'':>11} {'':>5}"
    )
    rss = ratio(figures.rss, reference.rss if reference else None)
    ref_produce_cpu = 1 / reference.produce_cpu if reference and reference.produce_cpu else None
    ref_consume_cpu = 1 / reference.consume_cpu if reference and reference.consume_cpu else None
    # The direct Kafka client (bench/growth_direct.py) does not report threads, files,
    # children nor CPU. The CPU ratios are the reference's CPU per record over this one's: like the
    # rates' ratios, 0.8 or more is within 20%.
    cpu = (
        f"   {figures.produce_cpu:>7.1f} us {ratio(1 / figures.produce_cpu, ref_produce_cpu)}"
        f"  {figures.consume_cpu:>7.1f} us {ratio(1 / figures.consume_cpu, ref_consume_cpu)}"
        if figures.produce_cpu and figures.consume_cpu
        else ""
    )
    process = (
        f"   {figures.threads:>7,.0f} {figures.files:>7,.0f} {figures.children_cpu:>8.1f} s{cpu}"
        if figures.threads
        else ""
    )
    print(
        f"  {label:<20} {figures.produce:>9,.0f}/s {produce}   "
        f"{figures.consume:>9,.0f}/s {consume}   {batch}   "
        f"{figures.rss / 2**20:>7,.1f} MiB {rss}   {figures.setup:6.1f} s{process}",
        flush=True,
    )


# --records and --deliveries by default. On Kafka, 20,000 records took a direct client
# 0.05 s to produce (mostly the last flush) and the gateway 0.2 s: too short a clock.
DEFAULT_COUNTS = {"dafka": (20_000, 20_000), "kafka": (100_000, 50_000)}


def engine_args(engine: str, options: argparse.Namespace) -> argparse.Namespace:
    """The options for `engine`, its defaults filled in."""
    records, deliveries = DEFAULT_COUNTS[engine]
    args = argparse.Namespace(**vars(options))
    args.records = records if options.records is None else options.records
    args.deliveries = deliveries if options.deliveries is None else options.deliveries
    return args


def shapes_argument(text: str) -> list[tuple[int, int]]:
    """`1x1,1x100` -> [(1, 1), (1, 100)]."""
    try:
        shapes = [tuple(int(n) for n in part.split("x")) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not TOPICSxGROUPS,...: {text!r}") from None
    if any(len(shape) != 2 or min(shape) < 1 for shape in shapes):
        raise argparse.ArgumentTypeError(f"not TOPICSxGROUPS,...: {text!r}")
    return [(topics, groups) for topics, groups in shapes]


def print_versus(gateway: Figures, reference: Figures) -> None:
    """The gateway's figures divided by the direct ones in the same shape: a ratio that
    falls along the curve is the gateway's own cost growing; one that holds means the
    engine's. CPU per record as the rates' ratios (the direct one over the gateway's:
    0.8 means the gateway spends a quarter more), when both report it."""
    cpu = (
        f"   {'':>8} {'':>8} {'':>8}     "
        f"{'':>10} {reference.produce_cpu / gateway.produce_cpu:5.2f}  "
        f"{'':>10} {reference.consume_cpu / gateway.consume_cpu:5.2f}"
        if reference.produce_cpu and gateway.produce_cpu and gateway.consume_cpu
        else ""
    )
    print(
        f"    {'gateway / direct':<18} {'':>11} {gateway.produce / reference.produce:5.2f}   "
        f"{'':>11} {gateway.consume / reference.consume:5.2f}   "
        f"{'':>11} {gateway.batch_consume / reference.consume:5.2f}   "
        f"{'':>11} {gateway.rss / reference.rss:5.2f}{cpu}",
        flush=True,
    )


# How each engine's reference is labelled, and what it is.
DIRECT_LABEL = {"kafka": "direct client", "dafka": "direct engine"}
DIRECT_WHAT = {
    "kafka": "a direct confluent-kafka client (bench/growth_direct.py)",
    "dafka": "the engine's interface without the gateway (bench/growth_engine.py)",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("dafka", "kafka", "both"), default="both")
    parser.add_argument(
        "--records", type=int, help="records produced (default: dafka 20,000, kafka 100,000)"
    )
    parser.add_argument(
        "--deliveries",
        type=int,
        help="records consumed, all groups together (default: dafka 20,000, kafka 50,000)",
    )
    parser.add_argument(
        "--window",
        type=int,
        default=100,
        help="BLPOPs in flight per group, and the COUNT of each BLMPOP",
    )
    parser.add_argument("--runs", type=int, default=1, help="runs per figure (the median)")
    parser.add_argument(
        "--partitions", type=int, default=1, help="per topic (Dafka's default is 4)"
    )
    parser.add_argument(
        "--bound", type=float, default=120.0, help="seconds one shape may take (then: failed)"
    )
    parser.add_argument(
        "--kafka-document",
        type=json.loads,
        default={},
        metavar="JSON",
        help="Kafka engine: sections over the tests' Kafka configuration, for the gateway "
        'and the direct client alike, e.g. \'{"consumer": {"queued.min.messages": 1000}}\'',
    )
    parser.add_argument(
        "--dafka-settings",
        type=json.loads,
        default={},
        metavar="JSON",
        help="Dafka engine: settings of the `dafka` section, for the gateway and the engine "
        "driven directly alike, e.g. '{\"group_buffer\": 50000}'",
    )
    parser.add_argument(
        "--shapes",
        type=shapes_argument,
        default=SHAPES,
        help="TOPICSxGROUPS,... (default: 1x1,100x1,1000x1,1x10,1x100; the first is the "
        "reference of the ratios)",
    )
    parser.add_argument(
        "--no-direct",
        action="store_true",
        help="skip the references without the gateway (a direct Kafka client; the Dafka "
        "engine driven directly)",
    )
    options = parser.parse_args()
    limit = raise_open_files(OPEN_FILES)
    if limit < OPEN_FILES:
        print(f"open files limited to {limit} (ulimit -Hn): 1,000 topics may not fit")
    engines = ("dafka", "kafka") if options.engine == "both" else (options.engine,)
    for engine in engines:
        args = engine_args(engine, options)
        print(
            f"\n{engine} engine, {args.partitions} partition(s) per topic: {args.records:,} "
            f"records produced, {args.deliveries:,} consumed (median of {args.runs}); "
            "ratio to 1 topic / 1 group",
            flush=True,
        )
        print(
            f"  {'shape':<20} {'produce':>11} {'ratio':>5}   {'consume':>11} {'ratio':>5}   "
            f"{'BLMPOP':>11} {'ratio':>5}   "
            f"{'RSS':>11} {'ratio':>5}   {'set-up':>8}   {'threads':>7} {'files':>7} "
            f"{'children':>10}   {'CPU/produced':>16}  {'CPU/consumed':>16}",
            flush=True,
        )
        if not args.no_direct:
            print(
                f"  each shape: the gateway, then {DIRECT_WHAT[engine]} in the same shape "
                "and run, then the gateway's figures over the direct ones",
                flush=True,
            )
        reference: Figures | None = None
        direct_reference: Figures | None = None
        for topics, groups in args.shapes:
            figures = measure(engine, topics, groups, args)
            first = (topics, groups) == args.shapes[0]
            if figures is not None:
                if first:
                    reference = figures
                label = f"{topics} topic{'s' * (topics > 1)}, {groups} group{'s' * (groups > 1)}"
                print_row(label, figures, reference)
            if args.no_direct:
                continue
            theirs = measure_direct(engine, topics, groups, args)
            if theirs is None:
                continue
            if first:
                direct_reference = theirs
            print_row(f"  {DIRECT_LABEL[engine]}", theirs, direct_reference)
            if figures is not None:
                print_versus(figures, theirs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
