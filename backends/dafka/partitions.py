"""Integer partitions over Dafka's producer-address partitions.

In Dafka a partition is the address (a uuid) of the producer that writes it. Rafka clients
need small integers that mean the same partition on every gateway and across restarts, so:

- A gateway's own partitions have deterministic addresses: `RAFKA_MARK` (8 hex digits),
  then 16 hex digits of the topic's SHA-1, then the partition number (8 hex digits). Any
  gateway turns number -> address and address -> number without asking anyone.
- A partition written by someone else (console producer, C programs: random uuids) gets
  `FOREIGN_BASE + crc32(address) mod 2**30`: stable, the same on every gateway, and in a
  range a gateway's own numbers never reach. Two foreign addresses of one topic can share
  a number (about 1 in 2,000 for 1,000 foreign partitions of one topic); the mapper logs
  it and keeps the first one it saw.

Key -> partition number uses librdkafka's partitioners, so one key picks the same number
on both engines: `consistent_random` (librdkafka's default: CRC32 of the key) and
`murmur2_random` (the Java client's default).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import time
import uuid
import zlib
from collections.abc import Callable

import structlog

log = structlog.get_logger(__name__)

RAFKA_MARK = "5AFCA000"
FOREIGN_BASE = 1 << 30
MAX_PARTITIONS = 1 << 20  # a gateway's own numbers stay far below FOREIGN_BASE
PARTITIONERS = ("consistent_random", "murmur2_random", "consistent", "murmur2")


def topic_digest(topic: str) -> str:
    return hashlib.sha1(topic.encode()).hexdigest().upper()[:16]


def own_address(topic: str, number: int) -> str:
    """The Dafka address of a gateway partition `number` of `topic`."""
    if not 0 <= number < MAX_PARTITIONS:
        raise ValueError(f"partition number out of range: {number}")
    return f"{RAFKA_MARK}{topic_digest(topic)}{number:08X}"


def publisher_address() -> str:
    """A new address for the node that writes a gateway's partitions (its beacon's):
    marked as a gateway's, so that the other gateways' writers do not connect to it."""
    return RAFKA_MARK + uuid.uuid4().hex.upper()[:24]


def is_own_address(address: str) -> bool:
    """A gateway partition's address, or the address of a gateway's node that writes them
    (any gateway's): such a node publishes records and heads, and never sends another
    producer an ACK or a FETCH."""
    return len(address) == 32 and address.startswith(RAFKA_MARK)


def foreign_number(address: str) -> int:
    return FOREIGN_BASE + (zlib.crc32(address.encode()) & (FOREIGN_BASE - 1))


class PartitionMap:
    """address <-> number for every partition seen, per topic (event loop thread only)."""

    def __init__(self) -> None:
        self._by_number: dict[tuple[str, int], str] = {}
        self._digests: dict[str, str] = {}

    def number(self, topic: str, address: str) -> int:
        digest = self._digests.get(topic)
        if digest is None:
            digest = self._digests[topic] = topic_digest(topic)
        if address.startswith(RAFKA_MARK) and address[8:24] == digest:
            number = int(address[24:], 16)
        else:
            number = foreign_number(address)
        known = self._by_number.setdefault((topic, number), address)
        if known != address:
            log.error(
                "two foreign partitions share a number; the second is not consumable",
                topic=topic,
                number=number,
                kept=known,
                refused=address,
            )
            return -1
        return number

    def address(self, topic: str, number: int) -> str | None:
        """The address of a partition number, if it is a gateway number or seen before."""
        known = self._by_number.get((topic, number))
        if known is not None:
            return known
        if 0 <= number < MAX_PARTITIONS:
            return own_address(topic, number)
        return None


# --- key partitioners (librdkafka's) -----------------------------------------------------


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (Java client, librdkafka's murmur2 partitioner), as unsigned 32 bit."""
    length = len(data)
    seed = 0x9747B28C
    m = 0x5BD1E995
    h = (seed ^ length) & 0xFFFFFFFF
    full = length - length % 4
    for i in range(0, full, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    rest = length % 4
    if rest == 3:
        h ^= data[full + 2] << 16
    if rest >= 2:
        h ^= data[full + 1] << 8
    if rest >= 1:
        h ^= data[full]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


Partitioner = Callable[[bytes | None, int], int]


STICKY_SECONDS = 0.01  # librdkafka's sticky.partitioning.linger.ms default, 10 ms


def make_partitioner(
    name: str, clock: Callable[[], float] = time.monotonic, sticky: float = STICKY_SECONDS
) -> Partitioner:
    """A function (key, partition count) -> partition number, as librdkafka's `name`.

    Keyless records are sticky, as librdkafka's (and Kafka's) since 2.x: they all go to
    one partition for `sticky` seconds, then to the next one, round-robin. A burst of
    records then wakes one partition writer, not all of them in turn.
    """
    if name not in PARTITIONERS:
        raise ValueError(f"unknown partitioner {name!r} (known: {', '.join(PARTITIONERS)})")
    spread = itertools.count()
    use_murmur = name.startswith("murmur2")
    current = 0
    until = -math.inf

    def partition(key: bytes | None, count: int) -> int:
        nonlocal current, until
        if key is None:
            now = clock()
            if now >= until:
                current = next(spread)
                until = now + sticky
            return current % count
        if use_murmur:
            return (murmur2(key) & 0x7FFFFFFF) % count
        return zlib.crc32(key) % count

    return partition
