"""What the store's writer and reader share: the parts of the store they use, and the
actor base that hands those to them."""

from __future__ import annotations

from dataclasses import dataclass

import zmq

from backends.dafka.catalog import Catalog
from backends.dafka.config import Config
from backends.dafka.head_push import HeadPush
from backends.dafka.node import Actor
from backends.dafka.storage import Storage
from backends.dafka.store.retention import RetentionPolicy


@dataclass(frozen=True, slots=True)
class StoreParts:
    """One store's settings, DB and shared state, as its `Store` made them."""

    config: Config
    context: zmq.Context
    storage: Storage
    catalog: Catalog
    retention: RetentionPolicy
    push: HeadPush
    verbose: bool
    address: str  # the writer's uuid
    reader_address: str


class StoreActor(Actor):
    """The writer or the reader. Subclasses set their own state first: the thread starts
    in this constructor."""

    def __init__(self, store: StoreParts, uuid_: str) -> None:
        self.store = store
        self.uuid = uuid_
        self.config = store.config
        self.storage = store.storage
        self.verbose = store.verbose
        self.hwm = self.config.get_int("store/high_watermark", 1_000_000)
        super().__init__(store.config, store.context, address=uuid_)

    def close(self) -> None:
        self._shut_down()
