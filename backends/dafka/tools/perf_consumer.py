"""dafka-perf-consumer: receive COUNT records of `$STORE_PERF` and print the throughput
(spec §9; run alongside dafka-perf-store; same output lines as the C tool).

Not in C: `--latency` reads the publish time that `dafka-perf-store --timestamp` puts at
the start of every record and, after the usual lines, prints the produce-to-deliver latency
percentiles over all COUNT records (both clocks are Linux's system-wide CLOCK_MONOTONIC).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from backends.dafka.consumer import Consumer
from backends.dafka.tools import configure_logging, interrupt_on_sigterm, load_config, parser, run
from backends.dafka.tools.perf_store import STAMP, TOPIC, report

PROG = "dafka-perf-consumer"
PERCENTILES = (50, 90, 99, 99.9)


def percentile(ordered: Sequence[int], pct: float) -> int:
    """Nearest-rank percentile of an ascending, non-empty sequence."""
    rank = max(1, -(-len(ordered) * pct // 100))  # ceil(n * pct / 100)
    return ordered[int(rank) - 1]


def report_latency(latencies_ns: list[int]) -> None:
    ordered = sorted(latencies_ns)
    for pct in PERCENTILES:
        print(f"latency p{pct:g}: {percentile(ordered, pct) / 1000:.0f} [us]")
    print(f"latency max: {ordered[-1] / 1000:.0f} [us]", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    def body() -> int:
        p = parser(PROG, "Measure how fast a consumer receives the records of dafka-perf-store.")
        p.add_argument("count", type=int)
        p.add_argument("size", type=int)
        p.add_argument(
            "--latency",
            action="store_true",
            help="also print produce-to-deliver latency (needs dafka-perf-store --timestamp)",
        )
        args = p.parse_args(argv)
        if args.count < 1 or args.size < 0:
            p.error("count must be >= 1 and size >= 0")
        configure_logging(args.verbose)
        interrupt_on_sigterm()
        config = load_config(args, "beacon", ["beacon/verbose", "consumer/verbose"])
        consumer = Consumer(config)
        latencies: list[int] = []
        note = latencies.append
        unpack = STAMP.unpack_from
        clock = time.monotonic_ns
        try:
            consumer.subscribe(TOPIC)
            while (record := consumer.get(timeout=1.0)) is None:
                pass
            if args.latency:
                if len(record.content) < STAMP.size or unpack(record.content)[0] == 0:
                    raise ValueError("records carry no timestamp: run dafka-perf-store --timestamp")
                note(clock() - unpack(record.content)[0])
            print("Received first", flush=True)
            started = time.perf_counter()
            left = args.count - 1
            get = consumer.get
            while left > 0:
                record = get(timeout=1.0)
                if record is not None:
                    left -= 1
                    if args.latency:
                        note(clock() - unpack(record.content)[0])
            elapsed = time.perf_counter() - started
        finally:
            consumer.close()
        report(args.count, args.size, elapsed)
        if args.latency:
            report_latency(latencies)
        return 0

    return run(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
