"""dafka-console-consumer: print `subject address content` for every record of a topic."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from backends.dafka.consumer import Consumer
from backends.dafka.tools import (
    configure_logging,
    interrupt_on_sigterm,
    load_config,
    parser,
    run,
)

PROG = "dafka-console-consumer"
START_DELAY = 1.0  # C waits a second so that the mesh (and the stores) are connected


def main(argv: Sequence[str] | None = None) -> int:
    def body() -> int:
        p = parser(PROG, "Print every record of TOPIC as `subject address content`.")
        p.add_argument("topic")
        p.add_argument(
            "--from-beginning", action="store_true", help="start at the earliest records"
        )
        args = p.parse_args(argv)
        configure_logging(args.verbose)
        interrupt_on_sigterm()
        config = load_config(args, "beacon", ["beacon/verbose", "consumer/verbose"])
        if args.from_beginning:
            config.set("consumer/offset/reset", "earliest")
        consumer = Consumer(config)
        out = sys.stdout.buffer
        try:
            time.sleep(START_DELAY)
            consumer.subscribe(args.topic)
            while True:
                record = consumer.get(timeout=0.5)
                while record is not None:
                    out.write(
                        b"%s %s %s\n"
                        % (record.subject.encode(), record.partition.encode(), record.content)
                    )
                    record = consumer.get(timeout=0)
                out.flush()  # once per batch, not per record
        except KeyboardInterrupt:
            return 0
        finally:
            out.flush()
            consumer.close()

    return run(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
