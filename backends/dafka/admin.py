"""Topic administration on Dafka (`rafka-topics`): the `Admin` of `backends/base.py`.

Where it connects: a joined network, the network of a gateway running on the data
directory, or the directory's own tower and stores (`admin_network.py`).

What it does there, as a Dafka node of its own (an observer for the heads, a reader for
records, a producer for the catalog):
- topics: every topic a store holds or the catalog created, minus those deleted;
- create/delete: one entry of the topic catalog (`catalog.py`), written to partition 0
  of `__rafka_topics` (a stable address, resumed at the stores' head + 1), acknowledged
  by a store, then held by every store the tower knows (ours apply it as they store it:
  a deletion's records are gone from each of them then), then read back: if another
  rafka-topics wrote the same offset at the same time, the loser says so;
- describe: next offset = the partition's head + 1; first = the record a FETCH from 0
  gets (the oldest one the stores keep); groups from `__rafka_offsets`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import queue
import time
import unicodedata
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

import structlog

from backends.base import (
    Admin,
    AdminError,
    EngineOptions,
    GroupOffsets,
    TopicDescription,
    TopicExistsError,
    TopicPartitionOffsets,
    UnknownTopicError,
)
from backends.dafka.admin_network import join
from backends.dafka.beacon import TowerUnreachable
from backends.dafka.catalog import (
    CONFIG_KEYS,
    TOPICS_TOPIC,
    Catalog,
    TopicEntry,
    created,
    deleted,
    is_gone,
)
from backends.dafka.config import Config, ConfigError
from backends.dafka.engine import Network
from backends.dafka.observer import NotSettled, Observer
from backends.dafka.offsets import OFFSETS_TOPIC, CommitLog
from backends.dafka.partitions import PartitionMap, own_address
from backends.dafka.producer import Producer as DafkaProducer
from backends.dafka.producer import check_topic
from backends.dafka.producing import INTERNAL_PREFIX
from backends.dafka.reader import Event, Reader
from backends.dafka.settings import MAX_TOPIC_PARTITIONS, DafkaSettings

log = structlog.get_logger(__name__)

CATALOG_PARTITION = 0  # rafka-topics writes the catalog's partition 0
# How long a partition may take to answer a FETCH from 0 before it counts as empty
# (the stores keep a partition's head record: only a store that lost it stays silent).
FIRST_WAIT = 2.0
# How long a store that answered nothing yet gets before it counts as holding nothing.
SILENT_STORE_WAIT = 1.0
ASK_INTERVAL = 0.02  # seconds between two questions to the stores while waiting for them


def check_name(name: str) -> None:
    try:
        check_topic(name)
    except ValueError as error:
        raise AdminError(str(error)) from None


def check_new_name(name: str) -> None:
    """A topic a gateway can address: `topics:<topic>[:<key>]` and `BLPOP topics:<t1,t2>`
    leave no room for `:` or `,`; whitespace and control characters would break
    one-name-a-line listings."""
    check_name(name)
    # Control characters are category Cc; not str.isprintable(), which also refuses
    # format characters (U+200D of emoji sequences) and code points newer than Python's
    # Unicode tables, names a gateway addresses.
    if any(c in ":," or c.isspace() or unicodedata.category(c) == "Cc" for c in name):
        raise AdminError(
            f"invalid topic name {name!r}: a gateway cannot address a topic whose name "
            "holds ':', ',', whitespace or control characters"
        )


def check_config(config: Mapping[str, str]) -> None:
    for key, value in config.items():
        if key not in CONFIG_KEYS:
            raise AdminError(
                f"topic setting {key} is not supported on Dafka (supported: "
                f"{', '.join(CONFIG_KEYS)})"
            )
        try:
            number = int(value)
        except ValueError:
            number = -2
        if number < -1:
            raise AdminError(f"{key} must be an integer >= -1 (-1: forever), got {value!r}")


def _groups(
    topic: str, next_of: Mapping[int, int], deletion: TopicEntry | None, commits: CommitLog
) -> tuple[GroupOffsets, ...]:
    """The groups' committed offsets on `topic` and their lag. Commits made before the
    topic's latest deletion belong to the deleted topic: dropped from `commits` (only
    `topic`'s entries: the log can serve the other topics after)."""
    if deletion is not None:
        commits.forget(topic, deletion.unix_ms)
    rows = [
        GroupOffsets(group, partition, offset, max(0, next_of.get(partition, 0) - offset))
        for group, name, partition, offset in commits.all()
        if name == topic
    ]
    return tuple(sorted(rows, key=lambda row: (row.group, row.partition)))


class DafkaAdmin(Admin):
    def __init__(self, settings: DafkaSettings, options: EngineOptions) -> None:
        self._settings = settings
        self._data_dir = Path(options.data_dir).absolute()
        self._timeout = options.metadata_timeout
        self._network: Network | None = None
        self._started_network = False
        self._observer: Observer | None = None
        self._reader: Reader | None = None
        self._events: queue.SimpleQueue[list[Event]] = queue.SimpleQueue()
        self._reads = itertools.count()
        self._catalog = Catalog()
        self._deletions: dict[str, TopicEntry] = {}  # the latest deletion of each topic
        self._store_config: Config | None = None  # what the stores were given, if known
        self._joined_at = 0.0
        self._closed = False

    # --- connection ------------------------------------------------------------------------

    async def _connect(self) -> tuple[Network, Observer, Reader]:
        if self._closed:
            raise AdminError("the admin is closed")
        if self._network is None:
            joined = await join(self._settings, self._data_dir, self._timeout)
            self._network = joined.network
            self._started_network = joined.started
            self._store_config = joined.store_config
        network = self._network
        try:
            if self._observer is None or self._reader is None:
                # Together: each finds the stores through the tower (a beacon interval).
                made = await asyncio.gather(
                    asyncio.to_thread(Observer, network.config, settle=0.1),
                    asyncio.to_thread(Reader, network.config, self._events.put),
                    return_exceptions=True,
                )
                self._joined_at = time.monotonic()
                for actor in made:
                    if isinstance(actor, Observer):
                        self._observer = actor
                    elif isinstance(actor, Reader):
                        self._reader = actor
                errors = [error for error in made if isinstance(error, BaseException)]
                if errors:
                    raise errors[0]
            assert self._observer is not None and self._reader is not None
            await asyncio.to_thread(self._observer.wait_settled, network.stores, self._timeout)
        except (NotSettled, TowerUnreachable, OSError, ValueError) as error:
            # ValueError: an address ZeroMQ cannot use (beacon.attach names it).
            raise AdminError(f"cannot reach {network.where()}: {error}") from None
        return network, self._observer, self._reader

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        reader, self._reader = self._reader, None
        observer, self._observer = self._observer, None
        if reader is not None:
            await asyncio.to_thread(reader.close)
        if observer is not None:
            await asyncio.to_thread(observer.close)
        network, self._network = self._network, None
        if network is not None and self._started_network:
            await network.stop()

    # --- reading what the network holds ----------------------------------------------

    async def _refresh(self) -> tuple[Network, Observer, Reader]:
        """Every head afresh, and the whole catalog up to the stores' heads."""
        network, observer, reader = await self._connect()
        try:
            await asyncio.to_thread(self._settle, observer, network.stores)
        except NotSettled as error:
            raise AdminError(f"cannot reach {network.where()}: {error}") from None
        catalog = Catalog()
        deletions: dict[str, TopicEntry] = {}

        def apply(content: bytes) -> None:
            entry = catalog.apply(content)
            if entry is not None and entry.deleted:
                deletions[entry.topic] = entry

        records = await self._read_to_heads(TOPICS_TOPIC, "the topic catalog")
        for content in records:
            apply(content)
        self._catalog, self._deletions = catalog, deletions
        return network, observer, reader

    def _settle(self, observer: Observer, stores: int) -> None:
        """Blocking: every head afresh. "Settled" means no answer came for a moment; on a
        busy machine a store may take longer than that to answer at all, so wait (a
        bounded while: an empty store never answers) until every store greeted did."""
        observer.refresh(stores, self._timeout)
        deadline = time.monotonic() + min(SILENT_STORE_WAIT, self._timeout)
        while observer.answered() < observer.stores and time.monotonic() < deadline:
            time.sleep(0.02)
        observer.wait_settled(stores, self._timeout)

    def _stored_heads(self, topic: str) -> dict[str, int]:
        observer = self._observer
        assert observer is not None
        return {
            address: head
            for address in observer.heads(topic)
            if (head := observer.stored_head(topic, address)) is not None
        }

    async def _read_to_heads(self, topic: str, what: str) -> list[bytes]:
        """The content of every record the stores keep of `topic`, up to their heads
        (in order per partition)."""
        heads = self._stored_heads(topic)
        plan = {address: (0, head) for address, head in heads.items()}
        got = await asyncio.to_thread(self._read, topic, plan, False, self._timeout)
        missing = [address for address, head in heads.items() if got[address][-1:] == []]
        if missing or any(got[a][-1][0] < heads[a] for a in heads):
            raise AdminError(
                f"{what} not read within {self._timeout:g} s "
                f"({topic}: {len(heads)} partition(s) at the stores' heads {heads})"
            )
        return [content for address in heads for _, content in got[address]]

    def _read(
        self,
        topic: str,
        plan: Mapping[str, tuple[int, int]],
        first_only: bool,
        timeout: float,
    ) -> dict[str, list[tuple[int, bytes]]]:
        """Blocking: records of `topic` per partition address, from `start` (0: the
        oldest kept) through `last` for each (address: (start, last)) of `plan`; with
        `first_only`, only the first record each partition answers. Returns what came
        within `timeout` seconds."""
        reader = self._reader
        assert reader is not None
        got: dict[str, list[tuple[int, bytes]]] = {address: [] for address in plan}
        if not plan:
            return got
        read = next(self._reads)
        left = dict(plan)
        reader.subscribe(topic)
        for address, (start, last) in plan.items():
            credit = 1 if first_only else max(1, last - start + 1)
            reader.start((read, address), topic, address, start, credit, read)
        deadline = time.monotonic() + timeout
        try:
            while left:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    events = self._events.get(timeout=remaining)
                except queue.Empty:
                    break
                for event in events:
                    if event[0] != "record" or event[4] != read:
                        continue
                    _, (_, address), seq, content, _ = event
                    if address not in left:
                        continue
                    got[address].append((seq, content))
                    if first_only or seq >= left[address][1]:
                        del left[address]
        finally:
            for address in plan:
                reader.drop((read, address))
        return got

    def _exists(self, topic: str, heads: Mapping[str, int]) -> bool:
        entry = self._catalog.get(topic)
        if entry is not None and not entry.deleted:
            return True
        return bool(heads) and not (entry is not None and is_gone(entry, heads))

    # --- the Admin interface ---------------------------------------------------------

    async def list_topics(self) -> list[str]:
        _, observer, _ = await self._refresh()
        known = observer.topics() | {e.topic for e in self._catalog.entries() if not e.deleted}
        return sorted(topic for topic in known if self._exists(topic, observer.heads(topic)))

    async def create_topic(self, name: str, partitions: int, config: Mapping[str, str]) -> None:
        check_new_name(name)
        if name.startswith(INTERNAL_PREFIX):
            raise AdminError(f"topic names starting with {INTERNAL_PREFIX} are Rafka's own")
        if not 1 <= partitions <= MAX_TOPIC_PARTITIONS:
            raise AdminError(f"partitions must be 1..{MAX_TOPIC_PARTITIONS}, got {partitions}")
        check_config(config)
        _, observer, _ = await self._refresh()
        if self._exists(name, observer.heads(name)):
            raise TopicExistsError(f"Topic '{name}' already exists.")
        await self._write(created(name, partitions, config))

    async def delete_topic(self, name: str) -> None:
        check_name(name)
        if name.startswith(INTERNAL_PREFIX):
            raise AdminError(f"topic {name} is Rafka's own and cannot be deleted")
        _, observer, _ = await self._refresh()
        heads = observer.heads(name)
        if not self._exists(name, heads):
            raise UnknownTopicError(f"Topic '{name}' does not exist.")
        await self._write(deleted(name, heads))

    async def describe(self, topic: str) -> TopicDescription:
        check_name(topic)
        _, observer, _ = await self._refresh()
        described = await self._describe(topic, observer, await self._commits())
        if described is None:
            raise UnknownTopicError(f"Topic '{topic}' does not exist.")
        return described

    async def describe_many(self, topics: Sequence[str]) -> list[TopicDescription]:
        """One refresh of the heads and the catalog, one read of the commits, for all."""
        for topic in topics:
            check_name(topic)
        _, observer, _ = await self._refresh()
        commits = await self._commits()
        described: list[TopicDescription] = []
        for topic in topics:
            description = await self._describe(topic, observer, commits)
            if description is not None:
                described.append(description)
        return described

    async def _describe(
        self, topic: str, observer: Observer, commits: CommitLog
    ) -> TopicDescription | None:
        """The description of `topic` after a refresh; None when it does not exist."""
        heads = observer.heads(topic)
        if not self._exists(topic, heads):
            return None
        entry = self._catalog.get(topic)
        deletion = self._deletions.get(topic)
        numbers = PartitionMap()
        partitions: dict[int, tuple[str | None, int]] = {}
        for address, head in heads.items():
            number = numbers.number(topic, address)
            if number >= 0:
                partitions[number] = (address, head)
        if entry is not None and not entry.deleted:
            for number in range(entry.partitions):
                partitions.setdefault(number, (None, -1))
        # Partitions that may keep records: not empty, nor emptied by a deletion since.
        probe = {
            where: (0, head)
            for where, head in partitions.values()
            if where is not None
            and head >= 0
            and not (deletion is not None and head <= deletion.heads.get(where, -1))
        }
        firsts = await asyncio.to_thread(
            self._read, topic, probe, True, min(FIRST_WAIT, self._timeout)
        )
        offsets: list[TopicPartitionOffsets] = []
        next_of: dict[int, int] = {}
        for number in sorted(partitions):
            where, head = partitions[number]
            answered = firsts.get(where, []) if where is not None else []
            first = answered[0][0] if answered else head + 1
            offsets.append(TopicPartitionOffsets(number, min(first, head + 1), head + 1))
            next_of[number] = head + 1
        groups = _groups(topic, next_of, deletion, commits)
        return TopicDescription(topic, tuple(offsets), self._topic_config(topic, entry), groups)

    async def _commits(self) -> CommitLog:
        """Every group's committed offsets, as the stores hold them now."""
        commits = CommitLog()
        for content in await self._read_to_heads(OFFSETS_TOPIC, "committed offsets"):
            commits.apply(content)
        return commits

    def _topic_config(self, topic: str, entry: TopicEntry | None) -> Mapping[str, str]:
        """The catalog's settings of the topic, over the stores' own (when known: the
        stores of a data directory), as Kafka names them; -1 keeps forever."""
        config: dict[str, str] = {}
        stores = self._store_config
        if stores is not None:
            for key, leaf in (("retention.ms", "ms"), ("retention.bytes", "bytes")):
                value = stores.get(f"store/retention/{leaf}", "-1")
                with contextlib.suppress(ConfigError):  # a name no config path can hold
                    value = stores.get(f"store/topics/{topic}/retention/{leaf}", value)
                config[key] = value
        if entry is not None and not entry.deleted:
            config.update(entry.config)
        return MappingProxyType(config)

    # --- writing the catalog ---------------------------------------------------------

    async def _write(self, entry: TopicEntry) -> None:
        network, observer, _ = await self._connect()
        address = own_address(TOPICS_TOPIC, CATALOG_PARTITION)
        stored = observer.stored_head(TOPICS_TOPIC, address)
        published = observer.heads(TOPICS_TOPIC).get(address, -1)
        first = max(-1 if stored is None else stored, published) + 1
        content = entry.encode()

        def publish() -> tuple[int, int]:
            producer = DafkaProducer(
                network.config, TOPICS_TOPIC, address=address, first_sequence=first
            )
            try:
                sequence = producer.publish(content)
            finally:
                left = producer.close(self._timeout)
            return sequence, left

        try:
            sequence, left = await asyncio.to_thread(publish)
        except (TowerUnreachable, OSError, RuntimeError) as error:
            raise AdminError(f"cannot write to {network.where()}: {error}") from None
        if left:
            raise AdminError(
                f"no Dafka store acknowledged the change within {self._timeout:g} s "
                f"({network.where()}); it is applied if a store gets it later"
            )
        observer.note_stored(TOPICS_TOPIC, address, sequence)
        await self._held_by_every_store(address, sequence, network)
        back = await asyncio.to_thread(
            self._read, TOPICS_TOPIC, {address: (sequence, sequence)}, True, self._timeout
        )
        if back[address] != [(sequence, content)]:
            raise AdminError(
                "another rafka-topics changed the topic catalog at the same time and this "
                "change was not kept; run the command again"
            )
        log.info(
            "topic catalog entry written", topic=entry.topic, deleted=entry.deleted, offset=sequence
        )

    async def _held_by_every_store(self, address: str, sequence: int, network: Network) -> None:
        """Wait until every store the tower knows holds the entry (ours have applied it
        then: the deletion of a topic's records, a retention)."""
        observer = self._observer
        assert observer is not None
        deadline = time.monotonic() + self._timeout
        # Every store announces itself once per beacon interval: after one (and the
        # settling of its answers), the observer has met every store the tower knows.
        interval = network.config.get_int("beacon/interval", 1000) / 1000
        met_all = self._joined_at + interval + 0.2
        while time.monotonic() < met_all or observer.held_by_all(TOPICS_TOPIC, address) < sequence:
            if time.monotonic() >= deadline:
                raise AdminError(
                    f"the change is stored, but not every store of {network.where()} holds "
                    f"it after {self._timeout:g} s; the others apply it when they catch up"
                )
            observer.ask({TOPICS_TOPIC})
            await asyncio.sleep(ASK_INTERVAL)
