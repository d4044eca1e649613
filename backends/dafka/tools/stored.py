"""dafka-stored: a Dafka store (writer + reader over one RocksDB, spec §5)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from backends.dafka.store import Store
from backends.dafka.tools import configure_logging, load_config, parser, run, wait_for_signal

PROG = "dafka-stored"


def main(argv: Sequence[str] | None = None) -> int:
    def body() -> int:
        args = parser(PROG, "Store every Dafka record and serve it to consumers.").parse_args(argv)
        configure_logging(args.verbose)
        config = load_config(args, "beacon", ["beacon/verbose", "store/verbose"])
        with Store(config) as store:
            print(
                f"{PROG}: store {store.address} reader {store.reader_address} "
                f"db {config.get('store/db')}",
                file=sys.stderr,
                flush=True,
            )
            wait_for_signal()
        return 0

    return run(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
