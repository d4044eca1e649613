"""dafka-perf-consumer: receive COUNT records of `$STORE_PERF` and print the throughput
(spec §9; run alongside dafka-perf-store; same output lines as the C tool)."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from backends.dafka.consumer import Consumer
from backends.dafka.tools import configure_logging, interrupt_on_sigterm, load_config, parser, run
from backends.dafka.tools.perf_store import TOPIC, report

PROG = "dafka-perf-consumer"


def main(argv: Sequence[str] | None = None) -> int:
    def body() -> int:
        p = parser(PROG, "Measure how fast a consumer receives the records of dafka-perf-store.")
        p.add_argument("count", type=int)
        p.add_argument("size", type=int)
        args = p.parse_args(argv)
        if args.count < 1 or args.size < 0:
            p.error("count must be >= 1 and size >= 0")
        configure_logging(args.verbose)
        interrupt_on_sigterm()
        config = load_config(args, "beacon", ["beacon/verbose", "consumer/verbose"])
        consumer = Consumer(config)
        try:
            consumer.subscribe(TOPIC)
            while consumer.get(timeout=1.0) is None:
                pass
            print("Received first", flush=True)
            started = time.perf_counter()
            left = args.count - 1
            get = consumer.get
            while left > 0:
                if get(timeout=1.0) is not None:
                    left -= 1
            elapsed = time.perf_counter() - started
        finally:
            consumer.close()
        report(args.count, args.size, elapsed)
        return 0

    return run(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
