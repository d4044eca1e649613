"""dafka-perf-store: publish COUNT records of SIZE bytes on `$STORE_PERF` and time until a
store has acknowledged all of them (spec §9; same output lines as the C tool).

Not in C: `--rate N` paces publishing at N records/s, and `--timestamp` starts every
record with its publish time (`time.monotonic_ns()`, 8 bytes big-endian; CLOCK_MONOTONIC is
system wide on Linux), for `dafka-perf-consumer --latency`.
"""

from __future__ import annotations

import struct
import sys
import time
from collections.abc import Callable, Sequence

from backends.dafka.producer import Producer
from backends.dafka.tools import configure_logging, interrupt_on_sigterm, load_config, parser, run

PROG = "dafka-perf-store"
TOPIC = "$STORE_PERF"
START_DELAY = 1.0  # C: "give everyone time to connect"
STAMP = struct.Struct(">Q")  # the publish time that starts a --timestamp record
PACE_STEP = 0.0005  # seconds a paced publisher sleeps when it is ahead of its rate


def report(count: int, size: int, elapsed: float) -> None:
    """The four lines of the C perf tools (libzmq perf style)."""
    elapsed_us = max(1, int(elapsed * 1_000_000))
    throughput = count / elapsed_us * 1_000_000
    megabits = throughput * size * 8 / 1_000_000
    print(f"message size: {size} [B]")
    print(f"message count: {count}")
    print(f"mean throughput: {int(throughput)} [msg/s]")
    print(f"mean throughput: {megabits:.3f} [Mb/s]", flush=True)


def publish_all(
    publish: Callable[[bytes], object], count: int, size: int, rate: float, timestamp: bool
) -> None:
    """Publish `count` records, at most `rate` per second when rate > 0."""
    content = bytes(size)
    if not timestamp and rate <= 0:
        for _ in range(count):  # the C tool's loop: nothing but publish
            publish(content)
        return
    padding = bytes(max(0, size - STAMP.size))
    pack = STAMP.pack
    clock = time.monotonic_ns
    started = clock()
    sent = 0
    while sent < count:
        due = count if rate <= 0 else min(count, int((clock() - started) * rate / 1e9) + 1)
        if due <= sent:
            time.sleep(PACE_STEP)  # pacing, not synchronisation: ahead of the rate
            continue
        while sent < due:
            publish(pack(clock()) + padding if timestamp else content)
            sent += 1


def main(argv: Sequence[str] | None = None) -> int:
    def body() -> int:
        p = parser(PROG, "Measure publish + store + ACK throughput (needs a tower and a store).")
        p.add_argument("count", type=int)
        p.add_argument("size", type=int)
        p.add_argument(
            "--rate",
            type=float,
            default=0,
            help="records per second (default: as fast as possible)",
        )
        p.add_argument(
            "--timestamp",
            action="store_true",
            help="start each record with its publish time, for dafka-perf-consumer --latency",
        )
        args = p.parse_args(argv)
        if args.count < 1 or args.size < 0:
            p.error("count must be >= 1 and size >= 0")
        if args.timestamp and args.size < STAMP.size:
            p.error(f"--timestamp needs size >= {STAMP.size}")
        if args.rate < 0:
            p.error("--rate must be >= 0")
        configure_logging(args.verbose)
        interrupt_on_sigterm()
        config = load_config(args, "beacon", ["beacon/verbose", "producer/verbose"])
        producer = Producer(config, TOPIC)
        try:
            time.sleep(START_DELAY)
            started = time.perf_counter()
            publish_all(producer.publish, args.count, args.size, args.rate, args.timestamp)
            print("Done publishing", flush=True)
            # Done when a store acknowledged the last record (C waits for ACK count-1).
            while producer.unacked_count() > 0:
                time.sleep(0.001)
            elapsed = time.perf_counter() - started
        finally:
            producer.close(timeout=0)
        report(args.count, args.size, elapsed)
        return 0

    return run(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
