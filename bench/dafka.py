"""Dafka engine benchmark with the real programs, as separate processes on 127.0.0.1.

(a) Store-acknowledged throughput: dafka-towerd + dafka-stored (fresh DB), then
    `dafka-perf-store COUNT SIZE` alone (publish + store + ACK, spec §9), then again with
    `dafka-perf-consumer COUNT SIZE` alongside (delivered throughput).
(b) Produce-to-deliver latency: `dafka-perf-store --rate R --timestamp` (every record starts
    with its publish time, time.monotonic_ns(), system wide on Linux) and
    `dafka-perf-consumer --latency` in another process, which prints percentiles.
(c) The C original's figure next to ours (spec §9).

Prints figures; never passes or fails anything. Usage: `make bench-dafka`, or
`.venv/bin/python bench/dafka.py [--count N] [--size B] [--runs K] [--rate R] [--seconds S]
[--sync 0|1]`.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backends.process import ProcessError, describe_exit, spawn
from tests.support.rafka_process import CHILD_ENV

BIN = Path(sys.executable).parent
C_REFERENCE = (
    "C original (zeromq/dafka PR #53, 2020, author's laptop): about 500,000 msg/s "
    "store-acknowledged (dafka_perf_store); no latency figure published. "
    "The C programs were not built or measured here."
)
PROCESS_TIMEOUT = 180.0  # seconds any one program may run before it is given up on


class Program:
    """One Dafka program (dies with the benchmark); all its output lines are kept."""

    def __init__(self, *args: str) -> None:
        self.args = args
        self.child = spawn([str(BIN / args[0]), *args[1:]], env=CHILD_ENV, keep_lines=None)

    @property
    def command(self) -> str:
        return shlex.join(self.args)

    def wait_stderr(self, pattern: str, timeout: float) -> re.Match[str]:
        try:
            return self.child.wait_line(pattern, timeout, stream="stderr")
        except ProcessError as error:
            raise RuntimeError(f"{self.command}: {error}") from None

    def finish(self, timeout: float = PROCESS_TIMEOUT) -> list[str]:
        """Wait for the exit; the stdout lines, or an error naming what went wrong."""
        try:
            code = self.child.wait(timeout)
        except ProcessError:
            self.stop()
            raise RuntimeError(f"{self.command}: still running after {timeout:.0f} s") from None
        if code != 0:
            errors = self.child.stderr_lines[-5:]
            raise RuntimeError(f"{self.command}: {describe_exit(code)}: {' | '.join(errors)}")
        return self.child.stdout_lines

    def stop(self) -> None:
        self.child.stop(15)


def msg_per_s(lines: list[str]) -> int:
    for line in lines:
        if match := re.fullmatch(r"mean throughput: (\d+) \[msg/s\]", line):
            return int(match.group(1))
    raise RuntimeError(f"no throughput line in {lines}")


def latency_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("latency ")]


class Mesh:
    """A tower and one store on loopback, and the config file the other programs use."""

    def __init__(self, workdir: Path, sync: int) -> None:
        self.tower = Program(
            "dafka-towerd", "--pub", "tcp://127.0.0.1:*", "--sub", "tcp://127.0.0.1:*"
        )
        self.store: Program | None = None
        match = self.tower.wait_stderr(r"listening sub=(\S+) pub=(\S+)", 15)
        self.config = workdir / "dafka.cfg"
        self.config.write_text(
            "beacon\n"
            "    address = 127.0.0.1\n"
            f"    sub_address = {match.group(1)}\n"
            f"    pub_address = {match.group(2)}\n"
            "    interval = 100\n"
            "store\n"
            f"    db = {workdir / 'storedb'}\n"
            f"    sync = {sync}\n"
        )
        self.store = Program("dafka-stored", "-c", str(self.config))
        self.store.wait_stderr(r"dafka-stored: store [0-9A-F]{32}", 30)

    def tool(self, name: str, *args: str) -> Program:
        return Program(name, "-c", str(self.config), *args)

    def close(self) -> None:
        if self.store is not None:
            self.store.stop()
        self.tower.stop()


def store_acked(mesh: Mesh, count: int, size: int, runs: int) -> list[int]:
    figures = []
    for run in range(1, runs + 1):
        producer = mesh.tool("dafka-perf-store", str(count), str(size))
        figure = msg_per_s(producer.finish())
        print(f"  run {run}: `{producer.command}` -> {figure:,} msg/s", flush=True)
        figures.append(figure)
    return figures


def alongside(mesh: Mesh, count: int, size: int) -> tuple[int, int]:
    # The consumer (offset latest) joins during perf-store's one-second start delay.
    consumer = mesh.tool("dafka-perf-consumer", str(count), str(size))
    try:
        producer = mesh.tool("dafka-perf-store", str(count), str(size))
        acked = msg_per_s(producer.finish())
        delivered = msg_per_s(consumer.finish(60))
    finally:
        consumer.stop()  # nothing to do unless something failed
    print(f"  `{producer.command}` -> {acked:,} msg/s store-acknowledged", flush=True)
    print(f"  `{consumer.command}` -> {delivered:,} msg/s delivered", flush=True)
    return acked, delivered


def latency(mesh: Mesh, size: int, rate: int, seconds: float) -> list[str]:
    count = max(1, int(rate * seconds))
    consumer = mesh.tool("dafka-perf-consumer", "--latency", str(count), str(size))
    try:
        producer = mesh.tool(
            "dafka-perf-store", "--rate", str(rate), "--timestamp", str(count), str(size)
        )
        sent = msg_per_s(producer.finish())
        lines = latency_lines(consumer.finish(60))
    finally:
        consumer.stop()  # nothing to do unless something failed
    print(f"  `{producer.command}` (achieved {sent:,} msg/s incl. final ACK wait)")
    print(f"  `{consumer.command}`:")
    for line in lines:
        print(f"    {line}")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--count", type=int, default=200_000, help="records per throughput run")
    p.add_argument("--size", type=int, default=100, help="record size in bytes")
    p.add_argument("--runs", type=int, default=3, help="dafka-perf-store runs alone")
    p.add_argument("--rate", type=int, default=20_000, help="records/s of the latency run")
    p.add_argument("--seconds", type=float, default=5.0, help="length of the latency run")
    p.add_argument("--sync", type=int, choices=(0, 1), default=1, help="store/sync (default 1)")
    args = p.parse_args()

    print(
        f"Dafka benchmark: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
        f"store/sync = {args.sync} ({'fsync before ACK' if args.sync else 'no fsync, as C'})",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="dafka-bench-") as tmp:
        mesh = Mesh(Path(tmp), args.sync)
        try:
            print(f"(a) store-acknowledged throughput, {args.count:,} x {args.size} B records")
            figures = store_acked(mesh, args.count, args.size, args.runs)
            print("    with dafka-perf-consumer alongside:")
            acked, delivered = alongside(mesh, args.count, args.size)
            print(f"(b) produce-to-deliver latency, {args.size} B records at {args.rate:,}/s")
            lines = latency(mesh, max(args.size, 8), args.rate, args.seconds)
        finally:
            mesh.close()

    best, median = max(figures), sorted(figures)[len(figures) // 2]
    print("\nSummary")
    print(f"  store-acknowledged (perf-store alone): median {median:,} msg/s, best {best:,}")
    print(f"  store-acknowledged with a consumer alongside: {acked:,} msg/s")
    print(f"  delivered to dafka-perf-consumer: {delivered:,} msg/s")
    print(f"  latency at {args.rate:,}/s: " + ", ".join(line[len("latency ") :] for line in lines))
    print(f"(c) {C_REFERENCE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
