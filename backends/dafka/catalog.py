"""The topic catalog: topics created and deleted with `rafka-topics`, kept on the Dafka
network as records of the internal topic `__rafka_topics`.

Topics are implicit in Dafka (a record creates its topic) and partition counts are a
gateway setting. The catalog makes `rafka-topics --create --partitions N` mean something
for every gateway, and carries what the stores need to apply (retention, deletion):

    {"topic": "orders", "partitions": 3, "config": {"retention.ms": "86400000"},
     "deleted": false, "unix_ms": 1718000000000}
    {"topic": "orders", "partitions": 0, "config": {}, "deleted": true,
     "unix_ms": 1718000100000, "heads": {"5AFCA000...": 41}}

One JSON object per record. Per topic the entry with the latest `unix_ms` wins (the later
one on a tie). `heads` of a deletion are the partition heads the deleting tool saw:
a partition whose head grows beyond it holds records written after the deletion.

Who reads it:
- `rafka-topics` writes it (a partition with a stable address, number 0, resumed at the
  stores' head + 1, as a gateway's partitions are) and reads it back up to the heads the
  stores report.
- Every gateway reads it at start and follows it while running: its partition count for
  a topic is the catalog's when the topic was created (over `dafka.partitions` and
  `dafka.topic_partitions`); a deletion forgets the topic's committed offsets.
- Our stores apply each entry when they store it (`store/writer.py`): `retention.ms` /
  `retention.bytes` override the store's retention for the topic; a deletion drops the
  topic's records up to its heads. C stores keep the records and ignore the catalog.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import structlog

from backends.dafka.config import Config
from backends.dafka.offsets import read_partitions

log = structlog.get_logger(__name__)

TOPICS_TOPIC = "__rafka_topics"
CONFIG_KEYS = ("retention.ms", "retention.bytes")


def _empty() -> Mapping[str, str]:
    return MappingProxyType({})


def _no_heads() -> Mapping[str, int]:
    return MappingProxyType({})


@dataclass(frozen=True)
class TopicEntry:
    topic: str
    partitions: int
    config: Mapping[str, str] = field(default_factory=_empty)
    deleted: bool = False
    unix_ms: int = 0
    heads: Mapping[str, int] = field(default_factory=_no_heads)

    def encode(self) -> bytes:
        document: dict[str, object] = {
            "topic": self.topic,
            "partitions": self.partitions,
            "config": dict(self.config),
            "deleted": self.deleted,
            "unix_ms": self.unix_ms,
        }
        if self.heads:
            document["heads"] = dict(self.heads)
        return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()

    @staticmethod
    def decode(content: bytes) -> TopicEntry:
        """An entry from a record's content; ValueError when it is not one."""
        try:
            document = json.loads(content)
        except (ValueError, UnicodeDecodeError) as error:
            raise ValueError(f"not JSON: {error}") from None
        if not isinstance(document, dict):
            raise ValueError("not a JSON object")
        topic = document.get("topic")
        partitions = document.get("partitions", 0)
        config = document.get("config", {})
        deleted = document.get("deleted", False)
        unix_ms = document.get("unix_ms", 0)
        heads = document.get("heads", {})
        if not isinstance(topic, str) or not topic:
            raise ValueError("no topic")
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 0:
            raise ValueError(f"bad partitions {partitions!r}")
        if not isinstance(config, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in config.items()
        ):
            raise ValueError(f"bad config {config!r}")
        if not isinstance(deleted, bool):
            raise ValueError(f"bad deleted {deleted!r}")
        if isinstance(unix_ms, bool) or not isinstance(unix_ms, int):
            raise ValueError(f"bad unix_ms {unix_ms!r}")
        if not isinstance(heads, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
            for k, v in heads.items()
        ):
            raise ValueError(f"bad heads {heads!r}")
        return TopicEntry(
            topic,
            partitions,
            MappingProxyType(dict(config)),
            deleted,
            unix_ms,
            MappingProxyType(dict(heads)),
        )


def created(topic: str, partitions: int, config: Mapping[str, str]) -> TopicEntry:
    return TopicEntry(topic, partitions, MappingProxyType(dict(config)), False, _now_ms())


def deleted(topic: str, heads: Mapping[str, int]) -> TopicEntry:
    return TopicEntry(topic, 0, _empty(), True, _now_ms(), MappingProxyType(dict(heads)))


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def retention_values(config: Mapping[str, str]) -> tuple[int | None, int | None]:
    """(retention.ms, retention.bytes) of an entry's config, None where unset or bad."""
    values: list[int | None] = []
    for key in CONFIG_KEYS:
        text = config.get(key)
        try:
            values.append(None if text is None else int(text))
        except ValueError:
            values.append(None)
    return values[0], values[1]


def is_gone(entry: TopicEntry, heads: Mapping[str, int]) -> bool:
    """Whether a topic is deleted: its latest entry is a deletion and no partition of
    `heads` (address -> head, as the network reports them now) went past the heads the
    deletion saw (a record written since brings the topic back, as on Kafka)."""
    return entry.deleted and all(
        head <= entry.heads.get(address, -1) for address, head in heads.items()
    )


class Catalog:
    """The latest entry of every topic, as applied so far (one thread at a time)."""

    def __init__(self) -> None:
        self._entries: dict[str, TopicEntry] = {}
        # topic -> partition address -> the highest head a deletion dropped records to:
        # kept when the topic is created again (those records stay gone).
        self._dropped: dict[str, dict[str, int]] = {}

    def apply(self, content: bytes, *, again: bool = False) -> TopicEntry | None:
        """Apply one record; return its entry when it is now the topic's latest (None:
        unreadable, logged, older than what is known, or the latest already unless
        `again`: a store applies a record again when the write that held it failed)."""
        try:
            entry = TopicEntry.decode(content)
        except ValueError as error:
            log.error("unreadable topic catalog record skipped", error=str(error))
            return None
        if entry.deleted:  # whether or not it is the latest: its records went
            dropped = self._dropped.setdefault(entry.topic, {})
            for address, head in entry.heads.items():
                dropped[address] = max(head, dropped.get(address, -1))
        known = self._entries.get(entry.topic)
        if known is not None and (known.unix_ms > entry.unix_ms or (known == entry and not again)):
            return None  # older, or read again (a partition of the catalog found late)
        self._entries[entry.topic] = entry
        return entry

    def get(self, topic: str) -> TopicEntry | None:
        return self._entries.get(topic)

    def dropped_through(self, topic: str, address: str) -> int:
        """The offset up to which a deletion of `topic` dropped the partition's records
        (-1: none)."""
        return self._dropped.get(topic, {}).get(address, -1)

    def partitions(self, topic: str) -> int | None:
        """The partition count of a topic created (and not deleted since), else None."""
        entry = self._entries.get(topic)
        if entry is None or entry.deleted:
            return None
        return entry.partitions

    def entries(self) -> list[TopicEntry]:
        return list(self._entries.values())

    def load(self, config: Config, heads: dict[str, int], timeout: float) -> None:
        """Blocking: read every partition of the catalog up to `heads` (address -> head)."""
        read_partitions(config, TOPICS_TOPIC, heads, timeout, self.apply, "the topic catalog")
