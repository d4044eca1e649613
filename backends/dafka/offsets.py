"""Committed offsets, kept on the Dafka network as records of an internal topic.

Why a topic: the stores already keep records durably (fsync before ACK), replicate them
between each other and serve them after any restart; a commit that is a record survives a
gateway's crash, its host's loss and one store's loss like the data it describes, and C
peers ignore it (they never subscribe to it). The gateway writes commits to its own
partition of `__rafka_offsets` (number = `dafka.node`), one record per commit round:
a JSON list of `[group, topic, partition, next_offset, unix_ms]`. At start it reads every
partition of the topic up to the heads the stores report and keeps, per
(group, topic, partition), the entry with the latest time.

Growth: one record per commit round with acks (at most one per `dafka.commit_interval`)
plus a snapshot of every offset at start; give the topic a retention on the stores
(the embedded store keeps it 7 days) so that it stays small: a snapshot is written at
every start and every `dafka.snapshot_interval`, well inside the retention.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator

import structlog

from backends.base import ConsumerCreationError
from backends.dafka.config import Config
from backends.dafka.consumer import Consumer as DafkaConsumer

log = structlog.get_logger(__name__)

OFFSETS_TOPIC = "__rafka_offsets"

Entry = tuple[str, str, int, int]  # group, topic, partition, next offset


class CommitLog:
    def __init__(self) -> None:
        # (group, topic) -> partition -> (next offset, unix ms): a join looks up its topics
        # without walking every group's entries (200,000 of them held the loop 15 s).
        self._offsets: dict[tuple[str, str], dict[int, tuple[int, int]]] = {}

    def committed(self, group: str, topic: str) -> dict[int, int]:
        return {p: o for p, (o, _) in self._offsets.get((group, topic), {}).items()}

    def _rows(self) -> Iterator[tuple[str, str, int, int, int]]:
        for (group, topic), parts in self._offsets.items():
            for partition, (offset, when) in parts.items():
                yield group, topic, partition, offset, when

    def all(self) -> list[Entry]:
        return [(g, t, p, o) for g, t, p, o, _ in self._rows()]

    def encode(self, entries: Iterable[Entry]) -> bytes:
        """One commit record; applies the entries here too."""
        now = int(time.time() * 1000)
        rows = []
        for group, topic, partition, offset in entries:
            self._offsets.setdefault((group, topic), {})[partition] = (offset, now)
            rows.append([group, topic, partition, offset, now])
        return json.dumps(rows, separators=(",", ":")).encode()

    def snapshot(self) -> tuple[bytes, int]:
        """One record of every entry, each with the time it was committed: this gateway
        also holds the entries of other gateways' groups that it read at start and does
        not follow since, and stamped now they overrode those gateways' later commits at
        their next load (a group rewound to where it was at this gateway's start); and
        how many entries it holds."""
        rows = [list(row) for row in self._rows()]
        return json.dumps(rows, separators=(",", ":")).encode(), len(rows)

    def apply(self, content: bytes) -> None:
        try:
            rows = json.loads(content)
            for group, topic, partition, offset, when in rows:
                parts = self._offsets.setdefault((str(group), str(topic)), {})
                known = parts.get(int(partition))
                if known is None or int(when) >= known[1]:
                    parts[int(partition)] = (int(offset), int(when))
        except (ValueError, TypeError) as error:
            log.error("unreadable commit record skipped", error=str(error))

    def forget(self, topic: str, before_ms: int) -> int:
        """Drop the entries of `topic` committed before `before_ms` (the topic was deleted
        then, as Kafka drops a deleted topic's offsets); returns how many."""
        dropped = 0
        for key, parts in list(self._offsets.items()):
            if key[1] != topic:
                continue
            for partition in [p for p, (_, when) in parts.items() if when < before_ms]:
                del parts[partition]
                dropped += 1
            if not parts:
                del self._offsets[key]
        return dropped

    def load(self, config: Config, heads: dict[str, int], timeout: float) -> None:
        """Blocking: read every partition of the offsets topic up to `heads`."""
        read_partitions(config, OFFSETS_TOPIC, heads, timeout, self.apply, "committed offsets")
        log.info("committed offsets loaded", entries=sum(map(len, self._offsets.values())))


def read_partitions(
    config: Config,
    topic: str,
    heads: dict[str, int],
    timeout: float,
    apply: Callable[[bytes], object],
    what: str,
) -> None:
    """Blocking: `apply` the content of every record of `topic`'s partitions (address ->
    head) up to their heads, in order per partition; raise ConsumerCreationError naming
    `what` if that takes longer than `timeout` seconds."""
    if not heads:
        return
    earliest = Config(dict(config.items()) | {"consumer/offset/reset": "earliest"})
    consumer = DafkaConsumer(earliest)
    try:
        consumer.subscribe(topic)
        left = dict(heads)
        deadline = time.monotonic() + timeout
        while left:
            remaining = deadline - time.monotonic()
            record = consumer.get(max(0.0, remaining)) if remaining > 0 else None
            if record is None:
                raise ConsumerCreationError(
                    f"{what} not read within {timeout:g} s "
                    f"({len(left)} partition(s) of {topic} incomplete)"
                )
            apply(record.content)
            head = left.get(record.partition)
            if head is not None and record.sequence >= head:
                del left[record.partition]
    finally:
        consumer.close()
