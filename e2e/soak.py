"""A soak run of a real `rafka` process: many idle connections, active producers and
consumers, random disconnects and one gateway restart, then the checks.

    python -m e2e.soak                                  # `make soak`: 1,000 active, 10,000 idle
    python -m e2e.soak --engine kafka --duration 60     # on a local Tansu broker
    python -m e2e.soak --active 100 --idle 1000 --duration 10   # what `make test` runs

Producers (RPUSHX of a batch, then DUMP) remember the records a DUMP confirmed (0);
consumers (CLIENT SETNAME <group>:<name>, BLPOP, RPUSH acks) remember every delivery.
Halfway, the gateway is stopped (SIGTERM, or kill -9 with --kill) and started again on the
same port and configuration (Dafka: the same data directory); every connection reconnects.
After the run, producers stop and consumers drain. The summary says what was produced,
confirmed, consumed, delivered twice, lost (confirmed and never consumed), how many
connections dropped, and the gateway's resident memory (VmRSS): before any connection,
with the idle ones (per connection), and its peak. Exit status 1 when a check fails.

Everything is bounded: the run, the drain, every connect and reply (timeouts), every
reconnect loop (the run's deadline). Only 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from pathlib import Path

import hiredis

from e2e.helpers import DafkaDeployment, Deployment, KafkaDeployment
from tests.support.processes import vm_rss_kib
from tests.support.rafka_process import RafkaProcess
from tests.support.resp import command
from tests.support.tansu import TansuBroker

HOST = "127.0.0.1"
REPLY_TIMEOUT = 30.0  # seconds: a reply slower than this is a failure of the run
CONNECT_TIMEOUT = 10.0
CONNECTING_AT_ONCE = 200  # the gateway's listen backlog is about 100
FD_MARGIN = 512  # descriptors besides the connections (the broker, pipes, files)


class Closed(Exception):
    """The connection went away (the gateway restarted, or we dropped it)."""


class NoConnection(Exception):
    """The gateway accepted no connection (answering PING) until the deadline."""


class Link:
    """One RESP2 connection on raw asyncio streams (hiredis parses the replies)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.parser = hiredis.Reader()

    @classmethod
    async def open(cls, port: int) -> Link:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(HOST, port), CONNECT_TIMEOUT
        )
        return cls(reader, writer)

    async def call(self, *args: bytes | str | int, timeout: float = REPLY_TIMEOUT) -> object:
        try:
            self.writer.write(command(*args))
            while (reply := self.parser.gets()) is False:
                data = await asyncio.wait_for(self.reader.read(65536), timeout)
                if not data:
                    raise Closed
                self.parser.feed(data)
        except (ConnectionError, OSError) as error:
            raise Closed from error
        return reply

    async def wait_closed(self) -> None:
        """Returns when the server closes the connection (it never sends on its own)."""
        try:
            while await self.reader.read(4096):
                pass
        except (ConnectionError, OSError):
            pass

    def close(self) -> None:
        self.writer.transport.abort()  # no FIN handshake: as abrupt as a crashed client


@dataclass
class Options:
    engine: str = "dafka"
    active: int = 1000
    idle: int = 10_000
    consumers: int = 32
    topics: int = 4
    partitions: int = 4
    batch: int = 5
    rate: float = 1500.0  # records per second, all producers together (a sustainable load)
    duration: float = 180.0
    drain: float = 120.0
    disconnect_rate: float = 0.002  # a producer's chance, per batch, to drop its connection
    consumer_disconnect_rate: float = 0.002  # a consumer's, per record (before its ack)
    kill: bool = False
    max_rss_mib: float = 2048.0
    seed: int = 1
    gateway_log: str = ""  # a file for the gateways' stderr, if any


@dataclass
class Summary:
    engine: str = ""
    active: int = 0
    idle: int = 0
    produced: int = 0
    confirmed: int = 0
    unconfirmed: int = 0  # produced, DUMP did not answer 0 (or the connection went)
    consumed: int = 0  # distinct values
    deliveries: int = 0
    duplicates: int = 0
    lost: int = 0  # confirmed, never consumed
    lost_examples: list[str] = field(default_factory=list)
    lost_by_topic: dict[str, int] = field(default_factory=dict)
    random_disconnects: int = 0
    connect_failures: int = 0  # connections not reopened within their deadline
    reconnects: int = 0
    restart_seconds: float = 0.0  # from the stop to the new gateway answering PING
    idle_held: int = 0  # idle connections answering PING at the end
    errors: dict[str, int] = field(default_factory=dict)
    rss_start_kib: int = 0
    rss_idle_kib: int = 0
    idle_kib_per_connection: float = 0.0
    rss_peak_kib: int = 0
    seconds: float = 0.0
    drain_seconds: float = 0.0

    def failures(self, options: Options) -> list[str]:
        found = []
        if self.lost:
            found.append(f"{self.lost} DUMP-confirmed records never consumed")
        if self.confirmed == 0:
            found.append("no record was confirmed")
        if self.connect_failures:
            found.append(f"{self.connect_failures} connections could not be reopened")
        if self.idle_held < self.idle:
            found.append(f"only {self.idle_held} of {self.idle} idle connections held")
        if self.rss_peak_kib > options.max_rss_mib * 1024:
            found.append(f"gateway RSS peaked at {self.rss_peak_kib} KiB")
        return found


class Run:
    def __init__(self, options: Options, server: RafkaProcess, topics: list[str]) -> None:
        self.options, self.server, self.topics = options, server, topics
        self.random = random.Random(options.seed)
        self.summary = Summary(engine=options.engine, active=options.active, idle=options.idle)
        self.confirmed: set[bytes] = set()
        self.delivered: Counter[bytes] = Counter()
        self.errors: Counter[str] = Counter()
        self.producing = True
        self.stop_at = 0.0  # producers and consumers stop at this monotonic time
        self.logs: list[str] = []  # the stderr of each gateway stopped
        self.gate = asyncio.Semaphore(CONNECTING_AT_ONCE)
        self.opened = 0
        self.settled = 0  # idle connections opened, or given up
        self.all_idle_open = asyncio.Event()
        self.idle_started = asyncio.Event()

    @property
    def port(self) -> int:
        return self.server.port

    async def connect(self, deadline: float) -> Link:
        """A new connection, retried (the gateway may be restarting) until `deadline`."""
        pause = 0.05
        while True:
            link: Link | None = None
            try:
                async with self.gate:  # the gateway's listen backlog is about 100
                    link = await Link.open(self.port)
                    if await link.call("PING", timeout=CONNECT_TIMEOUT) == b"PONG":
                        return link
            except (OSError, TimeoutError, Closed):
                pass
            if link is not None:
                link.close()  # never leave a half-open attempt counting against max_clients
            if time.monotonic() + pause > deadline:
                self.summary.connect_failures += 1
                raise NoConnection
            await asyncio.sleep(pause + self.random.random() * pause)  # back off, spread
            pause = min(pause * 2, 1.0)

    def error(self, reply: object) -> bool:
        if isinstance(reply, hiredis.ReplyError):
            self.errors[str(reply)] += 1
            return True
        return False

    def maybe_drop(self, link: Link, rate: float) -> bool:
        if self.producing and self.random.random() < rate:
            self.summary.random_disconnects += 1
            link.close()
            return True
        return False

    # --- the connections -----------------------------------------------------------------

    async def hold_idle(self) -> Link | None:
        """Open an idle connection and keep it until the run stops: when the gateway drops
        it (the restart), open another."""
        try:
            link = await self.connect(time.monotonic() + 60)
        except NoConnection:
            self.settle()
            return None
        self.opened += 1
        self.settle()
        await self.idle_started.wait()
        deadline = self.stop_at
        try:
            while (left := deadline - time.monotonic()) > 0:
                try:
                    await asyncio.wait_for(link.wait_closed(), left)
                except TimeoutError:
                    break
                self.summary.reconnects += 1
                link = await self.connect(deadline + 60)
        except NoConnection:
            return None
        return link

    def settle(self) -> None:
        self.settled += 1
        if self.settled == self.options.idle:
            self.all_idle_open.set()

    async def producer(self, number: int) -> None:
        topic = self.topics[number % len(self.topics)]
        producers = max(1, self.options.active - self.options.consumers)
        interval = self.options.batch * producers / self.options.rate
        try:
            await self.produce(number, topic, interval)
        except NoConnection:
            return

    async def produce(self, number: int, topic: str, interval: float) -> None:
        sequence = 0
        link = await self.connect(self.stop_at)
        while (left := self.stop_at - time.monotonic()) > 0:
            # Paced (each producer about one batch per interval, spread): an active client.
            await asyncio.sleep(min(left, interval * self.random.uniform(0.5, 1.5)))
            values = [f"{number}-{sequence}-{i}".encode() for i in range(self.options.batch)]
            sequence += 1
            try:
                reply = await link.call("RPUSHX", f"topics:{topic}", *values)
                if self.error(reply):
                    continue  # paced: the next try waits its interval
                self.summary.produced += len(values)
                if self.maybe_drop(link, self.options.disconnect_rate):
                    raise Closed  # before DUMP: these records are not confirmed
                outstanding = await link.call("DUMP", "10000")
                if outstanding == 0:
                    self.confirmed.update(values)
                else:
                    self.error(outstanding)
                    self.summary.unconfirmed += len(values)
            except Closed:
                self.summary.reconnects += 1
                link = await self.connect(self.stop_at + 60)
        link.close()

    async def consumer(self, number: int, until: asyncio.Event) -> None:
        with suppress(NoConnection):
            await self.consume(number, until)

    async def consume(self, number: int, until: asyncio.Event) -> None:
        topic = self.topics[number % len(self.topics)]
        group = f"soak{number % len(self.topics)}"
        link = await self.consumer_link(group, number)
        while not until.is_set():
            try:
                reply = await link.call("BLPOP", f"topics:{topic}", "1")
                if reply is None:
                    continue
                if self.error(reply):  # e.g. `CONS Server shutdown`: answered at once
                    await asyncio.sleep(0.1)
                    continue
                assert isinstance(reply, list), reply
                fields = dict(zip(reply[::2], reply[1::2], strict=True))
                self.delivered[fields[b"value"]] += 1
                ack = f"{topic}:{int(fields[b'partition'])}:{int(fields[b'offset'])}"
                if self.maybe_drop(link, self.options.consumer_disconnect_rate):
                    raise Closed  # before the ack: the group hands the record out again
                self.error(await link.call("RPUSH", "acks", ack))
            except Closed:
                self.summary.reconnects += 1
                link = await self.consumer_link(group, number)
        link.close()

    async def consumer_link(self, group: str, number: int) -> Link:
        deadline = self.stop_at + self.options.drain + 60
        while True:
            link = await self.connect(deadline)
            try:
                if not self.error(await link.call("CLIENT", "SETNAME", f"{group}:c{number}")):
                    return link
            except Closed:
                pass
            link.close()
            if time.monotonic() > deadline:
                raise TimeoutError(f"consumer {number} could not rejoin its group")
            await asyncio.sleep(0.1)  # the name is still held by our previous connection

    # --- the gateway ---------------------------------------------------------------------

    def rss(self) -> int:
        if self.server.child is None:
            return 0  # between the stop and the start
        try:
            kib = vm_rss_kib(self.server.child.pid)
        except (FileNotFoundError, ProcessLookupError, ValueError):
            return 0  # between the stop and the start
        self.summary.rss_peak_kib = max(self.summary.rss_peak_kib, kib)
        return kib

    async def sample_rss(self, until: asyncio.Event) -> None:
        while not until.is_set():
            self.rss()
            with suppress(TimeoutError):
                await asyncio.wait_for(until.wait(), 0.5)

    async def restart(self) -> None:
        old = self.server
        started = time.monotonic()
        if self.options.kill:
            old.kill()
        else:
            await asyncio.to_thread(old.terminate, 60)
        self.server = RafkaProcess(old.config_path, old.port)
        await asyncio.to_thread(self.server.start)
        self.summary.restart_seconds = round(time.monotonic() - started, 2)
        self.logs.append(old.stderr())


async def soak(options: Options, server: RafkaProcess, topics: list[str]) -> Summary:
    run = Run(options, server, topics)
    summary = run.summary
    began = time.monotonic()
    summary.rss_start_kib = run.rss()
    holders = [asyncio.create_task(run.hold_idle()) for _ in range(options.idle)]
    if options.idle:
        await asyncio.wait_for(run.all_idle_open.wait(), 60 + CONNECT_TIMEOUT * 2)
    summary.rss_idle_kib = run.rss()
    if options.idle:
        per = (summary.rss_idle_kib - summary.rss_start_kib) / options.idle
        summary.idle_kib_per_connection = round(per, 2)

    run.stop_at = time.monotonic() + options.duration
    consuming_done, sampling_done = asyncio.Event(), asyncio.Event()
    consumers = min(options.consumers, options.active)
    tasks = [asyncio.create_task(run.consumer(n, consuming_done)) for n in range(consumers)]
    producers = [asyncio.create_task(run.producer(n)) for n in range(options.active - consumers)]
    run.idle_started.set()
    sampler = asyncio.create_task(run.sample_rss(sampling_done))
    await asyncio.sleep(options.duration / 2)  # the run's timeline: restart halfway
    await run.restart()
    await asyncio.gather(*producers)
    run.producing = False  # no more random disconnects: let the consumers catch up

    drain_started = time.monotonic()
    drain_deadline = drain_started + options.drain
    while time.monotonic() < drain_deadline and not run.confirmed <= run.delivered.keys():
        await asyncio.sleep(0.2)  # polling the consumers' progress, bounded by the drain
    summary.drain_seconds = round(time.monotonic() - drain_started, 1)
    consuming_done.set()
    await asyncio.gather(*tasks)

    held = await asyncio.gather(*holders)
    answers = await asyncio.gather(*(ping(link) for link in held))
    summary.idle_held = sum(answers)
    for link in held:
        if link is not None:
            link.close()
    sampling_done.set()
    await sampler
    run.rss()

    summary.confirmed = len(run.confirmed)
    summary.consumed = len(run.delivered)
    summary.deliveries = sum(run.delivered.values())
    summary.duplicates = summary.deliveries - summary.consumed
    summary.unconfirmed = summary.produced - summary.confirmed
    lost = run.confirmed - run.delivered.keys()
    summary.lost = len(lost)
    summary.lost_examples = sorted(value.decode() for value in lost)[:5]
    by_topic = Counter(topics[int(value.split(b"-")[0]) % len(topics)] for value in lost)
    summary.lost_by_topic = dict(by_topic)
    summary.errors = dict(run.errors.most_common(10))
    summary.seconds = round(time.monotonic() - began, 1)
    if options.gateway_log:
        logs = [*run.logs, run.server.stderr()]
        Path(options.gateway_log).write_text("\n--- restart ---\n".join(logs))
    return summary


async def ping(link: Link | None) -> bool:
    if link is None:
        return False
    try:
        return await link.call("PING") == b"PONG"
    except (Closed, TimeoutError):
        return False


def raise_fd_limit(needed: int) -> int:
    """Raise this process's soft limit on descriptors to the hard one (the gateway, our
    child, inherits it); fail clearly when even the hard limit is too low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise SystemExit(
            f"the soak needs {needed} file descriptors per process and the hard limit is "
            f"{hard} (ulimit -Hn): raise it, or pass fewer --idle/--active connections"
        )
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def run_soak(options: Options, workdir: Path) -> Summary:
    """Start the deployment and the gateway, soak, stop everything; the summary."""
    raise_fd_limit(options.active + options.idle + FD_MARGIN)
    with ExitStack() as stack:
        deployment: Deployment
        if options.engine == "kafka":
            broker = stack.enter_context(TansuBroker())
            deployment = KafkaDeployment(broker)
        else:
            deployment = DafkaDeployment()
        config = deployment.write_config(workdir / "rafka.json")
        document = json.loads(config.read_text())
        document.setdefault("gateway", {})["max_clients"] = options.active + options.idle + 100
        config.write_text(json.dumps(document, indent=2))
        topics = [deployment.new_topic(options.partitions) for _ in range(options.topics)]
        server = RafkaProcess(config)
        server.start()
        run: list[RafkaProcess] = [server]
        stack.callback(lambda: run[-1].kill())
        summary = asyncio.run(soak(options, server, topics))
        return summary


def parse(argv: list[str]) -> Options:
    defaults = Options()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["dafka", "kafka"], default=defaults.engine)
    for name in ("active", "idle", "consumers", "topics", "partitions", "batch", "seed"):
        parser.add_argument(f"--{name}", type=int, default=getattr(defaults, name))
    floats = ("rate", "duration", "drain", "disconnect_rate", "consumer_disconnect_rate")
    for name in (*floats, "max_rss_mib"):
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=float, default=getattr(defaults, name))
    parser.add_argument("--kill", action="store_true", help="restart with kill -9, not SIGTERM")
    parser.add_argument("--gateway-log", default="", help="write the gateways' stderr there")
    args = parser.parse_args(argv)
    return Options(**vars(args))


def main(argv: list[str] | None = None) -> int:
    options = parse(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix="rafka-soak-") as workdir:
        summary = run_soak(options, Path(workdir))
    print(json.dumps(summary.__dict__, indent=2))
    failures = summary.failures(options)
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
