"""dafka-stored: a Dafka store (writer + reader over one RocksDB, spec §5)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from backends.dafka.config import Config
from backends.dafka.scheduling import SETTING as BATCH_SETTING
from backends.dafka.scheduling import run_as_batch
from backends.dafka.store import Store
from backends.dafka.tools import serve

PROG = "dafka-stored"


def _listening(store: Store, config: Config) -> str:
    return f"store {store.address} reader {store.reader_address} db {config.get('store/db')}"


def _store(config: Config) -> Store:
    if config.get_bool(BATCH_SETTING):
        # This thread first: the store's threads, ZeroMQ's among them, take its policy.
        run_as_batch()
    return Store(config)


def main(argv: Sequence[str] | None = None) -> int:
    return serve(
        PROG,
        "Store every Dafka record and serve it to consumers.",
        argv,
        "beacon",
        ["beacon/verbose", "store/verbose"],
        _store,
        _listening,
    )


if __name__ == "__main__":
    sys.exit(main())
