"""dafka-perf-store: publish COUNT records of SIZE bytes on `$STORE_PERF` and time until a
store has acknowledged all of them (spec §9; same output lines as the C tool)."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from backends.dafka.producer import Producer
from backends.dafka.tools import configure_logging, interrupt_on_sigterm, load_config, parser, run

PROG = "dafka-perf-store"
TOPIC = "$STORE_PERF"
START_DELAY = 1.0  # C: "give everyone time to connect"


def report(count: int, size: int, elapsed: float) -> None:
    """The four lines of the C perf tools (libzmq perf style)."""
    elapsed_us = max(1, int(elapsed * 1_000_000))
    throughput = count / elapsed_us * 1_000_000
    megabits = throughput * size * 8 / 1_000_000
    print(f"message size: {size} [B]")
    print(f"message count: {count}")
    print(f"mean throughput: {int(throughput)} [msg/s]")
    print(f"mean throughput: {megabits:.3f} [Mb/s]", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    def body() -> int:
        p = parser(PROG, "Measure publish + store + ACK throughput (needs a tower and a store).")
        p.add_argument("count", type=int)
        p.add_argument("size", type=int)
        args = p.parse_args(argv)
        if args.count < 1 or args.size < 0:
            p.error("count must be >= 1 and size >= 0")
        configure_logging(args.verbose)
        interrupt_on_sigterm()
        config = load_config(args, "beacon", ["beacon/verbose", "producer/verbose"])
        producer = Producer(config, TOPIC)
        try:
            time.sleep(START_DELAY)
            content = bytes(args.size)
            started = time.perf_counter()
            publish = producer.publish
            for _ in range(args.count):
                publish(content)
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
