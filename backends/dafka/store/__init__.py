"""The store (spec §5): a writer actor and a reader actor over one RocksDB `Storage`.

`Store` (here) reads the settings, opens the DB, restores the catalog's retention
overrides from the catalog it holds, and runs the two actors and a third thread for
retention:

| module | what |
|---|---|
| `writer.py` | stores records, FETCHes gaps, ACKs producers, applies the topic catalog (§5.3) |
| `reader.py` | answers FETCH, GET_HEADS and CONSUMER_HELLO; greets consumers (§5.4) |
| `retention.py` | which records may go: settings, per-topic settings, catalog overrides |
| `actor.py` | what the writer and the reader share of the store |

Retention (`store/retention/ms|bytes`, per-topic `store/topics/<topic>/retention/ms|bytes`,
-1 = forever) runs in the third thread every `store/retention/check_interval` ms.
"""

from __future__ import annotations

import threading
import uuid

import structlog
import zmq

from backends.dafka.catalog import TOPICS_TOPIC, Catalog
from backends.dafka.config import Config, ConfigError
from backends.dafka.head_push import HeadPush
from backends.dafka.storage import Storage
from backends.dafka.store.actor import StoreParts
from backends.dafka.store.reader import Reader
from backends.dafka.store.retention import RetentionPolicy, wall_ms
from backends.dafka.store.writer import Writer

log = structlog.get_logger(__name__)


class Store:
    """A Dafka store: writer (uuid = `address`) and reader (`reader_address`) threads."""

    def __init__(self, config: Config, context: zmq.Context | None = None) -> None:
        self._context = context or zmq.Context.instance()
        self.address = uuid.uuid4().hex.upper()
        self.reader_address = uuid.uuid4().hex.upper()
        self.verbose = config.get_bool("store/verbose")
        # Every setting is read before anything is opened: a bad value must not leave the
        # DB locked or the actors running.
        self.retention = RetentionPolicy(config)
        interval = max(1, config.get_int("store/retention/check_interval", 300_000))
        if interval / 1000 > threading.TIMEOUT_MAX:  # the retention thread waits that long
            raise ConfigError(
                f"config store/retention/check_interval = {interval} is more than "
                f"{int(threading.TIMEOUT_MAX * 1000)} ms"
            )
        self.push = HeadPush(
            config.get_int("store/push_heads/interval"), config.get_int("store/push_heads/duration")
        )
        self.storage = Storage(config.get("store/db"), sync=config.get_int("store/sync", 1) != 0)
        self.catalog = Catalog()
        try:
            self._load_catalog()
        except BaseException:
            self.storage.close()
            raise
        self._closed = False
        self._lock = threading.Lock()
        self._stop_retention = threading.Event()
        self._retention_thread: threading.Thread | None = None
        parts = StoreParts(
            config,
            self._context,
            self.storage,
            self.catalog,
            self.retention,
            self.push,
            self.verbose,
            self.address,
            self.reader_address,
        )
        try:
            self._writer = Writer(parts)
            try:
                self._reader = Reader(parts)
            except BaseException:
                self._writer.close()
                raise
        except BaseException:
            self.storage.close()
            self._closed = True
            raise
        # Always: the catalog may give a topic a retention at any time.
        self._retention_thread = threading.Thread(
            target=self._retain,
            args=(self.retention, interval / 1000),
            name="dafka-store-retention",
            daemon=True,
        )
        self._retention_thread.start()

    @property
    def writer_port(self) -> int:
        return self._writer.port

    @property
    def reader_port(self) -> int:
        return self._reader.port

    def close(self) -> None:
        """Stop and join the threads, then close the DB (exactly once)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop_retention.set()
        if self._retention_thread is not None:
            self._retention_thread.join()
        self._writer.close()
        self._reader.close()
        self.storage.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _load_catalog(self) -> None:
        """The retention overrides of the catalog this store holds (deletions were
        applied when they were stored)."""
        subject = TOPICS_TOPIC.encode()
        for partition, _ in self.storage.heads(subject):
            for _, content in self.storage.records(subject, partition):
                self.catalog.apply(content)
        for entry in self.catalog.entries():
            self.retention.apply_entry(entry)

    def _retain(self, policy: RetentionPolicy, interval: float) -> None:
        while not self._stop_retention.wait(interval):
            if not policy.active:
                continue
            try:
                deleted = self.storage.apply_retention(policy, wall_ms())
            except Exception:
                log.exception("dafka store retention failed; retrying next interval")
                continue
            if deleted and self.verbose:
                log.info("dafka store retention", deleted=deleted)
