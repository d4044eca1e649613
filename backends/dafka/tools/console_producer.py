"""dafka-console-producer: publish one record per line of stdin (spec §7)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from backends.dafka.producer import Producer
from backends.dafka.tools import (
    configure_logging,
    interrupt_on_sigterm,
    load_config,
    parser,
    run,
)

PROG = "dafka-console-producer"


def main(argv: Sequence[str] | None = None) -> int:
    def body() -> int:
        p = parser(PROG, "Publish each line of stdin as one record of TOPIC.")
        p.add_argument("topic")
        args = p.parse_args(argv)
        configure_logging(args.verbose)
        interrupt_on_sigterm()
        config = load_config(args, "beacon", ["beacon/verbose", "producer/verbose"])
        producer = Producer(config, args.topic)
        try:
            for line in sys.stdin.buffer:
                producer.publish(line.rstrip(b"\r\n"))
        finally:
            # At end of input, wait until a store acknowledged every record (unless
            # producer/terminate_unacked = 1): C lingers forever, we at most
            # producer/close_timeout ms. Ctrl-C gives up.
            left = producer.close()
        if left:
            print(
                f"{PROG}: error: {left} records were not acknowledged by a store within "
                f"producer/close_timeout = {config.get('producer/close_timeout')} ms",
                file=sys.stderr,
            )
            return 1
        return 0

    return run(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
