"""The Dafka engine behind the gateway (`backends/base.py` on the Python Dafka actors).

What it adds to Dafka, and where:
- integer partitions and key partitioning: `partitions.py`;
- partition writers with stable addresses, DUMP as a durability barrier: `producing.py`;
- consumer groups, rebalancing, redelivery: `groups.py`;
- durable committed offsets, as records of an internal topic: `offsets.py`;
- topics created and deleted with rafka-topics, as records of another one: `catalog.py`
  (read at start and followed: a created topic's partition count wins over the settings);
- what the network holds (heads, topics): `observer.py`.
The network is either embedded (a tower and stores as child processes, `embedded.py`) or
joined (tower endpoints given; the gateway starts nothing).

Over ~500 lines on purpose: what is left here is the one object the helpers above meet
through (`engine_view.py`): life cycle, routing of produce/consume/reads to them and the
commit schedule. Each part is short and calls out; splitting the hub would scatter the
state they share (writers, groups, the reader's inbox) over modules that all need it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import structlog
import zmq

from backends.base import (
    ConsumerCreationError,
    Engine,
    EngineError,
    EngineOptions,
    MetadataError,
    PartitionOffsets,
    ProduceError,
    ProducerCreationError,
    ReadError,
    Record,
    Stats,
    UnknownPartitionError,
)
from backends.dafka.beacon import TowerUnreachable
from backends.dafka.catalog import TOPICS_TOPIC, Catalog, TopicEntry, is_gone
from backends.dafka.config import Config as DafkaConfig
from backends.dafka.embedded import EmbeddedNetwork, EmbeddedNetworkError
from backends.dafka.envelope import unwrap
from backends.dafka.groups import Group, Member
from backends.dafka.node import allow_sockets
from backends.dafka.observer import NotSettled, Observer
from backends.dafka.off_loop import off_loop
from backends.dafka.offsets import OFFSETS_TOPIC, CommitLog
from backends.dafka.partitions import PartitionMap, is_own_address, make_partitioner
from backends.dafka.producer import check_topic
from backends.dafka.producing import (
    ASK_INTERVAL,
    INTERNAL_PREFIX,
    INVALID_TOPIC,
    Handover,
    PartitionWriter,
    ProducerHandle,
    WriterNode,
)
from backends.dafka.publisher import Publisher
from backends.dafka.reader import Event, Reader
from backends.dafka.scheduling import SETTING as BATCH_SETTING
from backends.dafka.scheduling import io_threads_as_batch
from backends.dafka.settings import RESETS, DafkaSettings

log = structlog.get_logger("rafka.dafka.engine")

STOPPED = "Engine stopped"
FETCH_QUIET = 0.05  # seconds between two looks at a read's records
FETCH_SETTLE = 0.2  # a read that got records and no more for this long is complete
# (topic, key) pairs whose writer is kept across loop passes at most (then forgotten
# all at once): keys are the clients' and unbounded.
_FIXED_WRITERS_MAX = 4096
_FIXED_KEY_MAX = 1024  # bytes: longer keys are not kept (4,096 of 32 MB each)


@dataclass(frozen=True)
class ReadKey:
    """The reader cursor of one read by offset (groups' cursors are tuples)."""

    number: int
    count: int


# The embedded stores keep commits a week; a snapshot of every offset is written far more
# often (at start and every dafka.snapshot_interval), so no live offset is ever lost.
OFFSETS_RETENTION = f"store/topics/{OFFSETS_TOPIC}/retention/ms"
OFFSETS_RETENTION_MS = 7 * 24 * 3600 * 1000
# The gateway's Dafka threads, and its embedded stores, give way to its event loop.
GATEWAY_DEFAULTS = {BATCH_SETTING: "1"}


class Network:
    """Where the engine's Dafka actors find their peers (embedded or joined)."""

    config: DafkaConfig
    stores: int

    def where(self) -> str:
        return ""

    def disk_paths(self) -> tuple[str, ...]:
        """The directories the network's stores keep records in on this machine."""
        return ()

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class JoinedNetwork(Network):
    def __init__(self, settings: DafkaSettings) -> None:
        values: dict[str, str] = {
            "beacon/sub_address": settings.tower_sub_address or "tcp://127.0.0.1:5556",
            "beacon/pub_address": settings.tower_pub_address or "tcp://127.0.0.1:5557",
            "beacon/ready_timeout": str(int(settings.start_timeout * 1000)),
        }
        self.config = DafkaConfig({**values, **GATEWAY_DEFAULTS, **settings.settings})
        self.stores = settings.min_stores

    def where(self) -> str:
        sub, pub = self.config.get("beacon/sub_address"), self.config.get("beacon/pub_address")
        return f"Dafka network of the towers {sub} / {pub}"


class EmbeddedMode(Network):
    """A tower and `dafka.stores` stores as child processes over `dafka.data_dir`."""

    def __init__(self, settings: DafkaSettings, data_dir: str, stop_timeout: float) -> None:
        store_settings = {OFFSETS_RETENTION: str(OFFSETS_RETENTION_MS), **GATEWAY_DEFAULTS}
        actor_settings: dict[str, str] = dict(GATEWAY_DEFAULTS)
        for path, value in settings.settings.items():
            # curve/: every node of the network, tower included; threads/: ours and the stores.
            if path.startswith(("curve/", "threads/")):
                store_settings[path] = actor_settings[path] = value
                continue
            target = store_settings if path.startswith("store/") else actor_settings
            target[path] = value
        self._actor_settings = actor_settings
        self._stop_timeout = stop_timeout
        self._network = EmbeddedNetwork(
            data_dir,
            stores=settings.stores,
            store_settings=store_settings,
            ready_timeout=settings.start_timeout,
        )
        self.stores = settings.stores

    async def start(self) -> None:
        try:
            await self._network.start_async()
        except EmbeddedNetworkError as error:
            raise EngineError(str(error)) from None
        config = self._network.config
        # Our own stores repeat a lost ACK: no need to hold a new writer's first records
        # until its subscriptions settle (that is for C stores, which ACK only once).
        config.set("producer/subscribe_settle", "0")
        for path, value in self._actor_settings.items():
            config.set(path, value)
        self.config = config

    async def stop(self) -> None:
        await self._network.stop_async(self._stop_timeout)

    def disk_paths(self) -> tuple[str, ...]:
        return (str(self._network.data_dir),)

    def where(self) -> str:
        count = f"{self.stores} store" + ("s" if self.stores > 1 else "")
        return f"embedded Dafka network ({count}), data directory {self._network.data_dir}"


def network_for(settings: DafkaSettings, data_dir: str, stop_timeout: float = 10.0) -> Network:
    if settings.joined:
        return JoinedNetwork(settings)
    try:
        return EmbeddedMode(settings, data_dir, stop_timeout)
    except ValueError as error:  # a store setting the embedded network sets itself
        raise EngineError(str(error)) from None


class DafkaEngine(Engine):
    def __init__(
        self,
        stats: Stats,
        settings: DafkaSettings,
        options: EngineOptions | None = None,
        *,
        network: Network | None = None,
    ) -> None:
        super().__init__(stats)
        options = options or EngineOptions()
        self.settings = settings
        self.consume_batch = options.consume_batch
        self._stop_flush_timeout = options.stop_flush_timeout
        self._metadata_timeout = options.metadata_timeout
        self._network = network or network_for(settings, options.data_dir)
        self.partition_map = PartitionMap()
        self._partitioner = make_partitioner(settings.partitioner)
        self.offsets = CommitLog()
        self.catalog = Catalog()
        self._catalog_cursors: set[str] = set()  # catalog partitions followed
        self.stopped = False
        self._started = False
        self._observer: Observer | None = None
        self._writers: dict[tuple[str, int], PartitionWriter] = {}
        # The writers looked up in the loop pass under way (`writer_this_pass`).
        self._writers_now: dict[tuple[str, bytes | None], PartitionWriter] = {}
        # (topic, key) -> writer, across passes, where the partition cannot change (see
        # writer_this_pass); cleared by any catalog change.
        self._writers_fixed: dict[tuple[str, bytes | None], PartitionWriter] = {}
        self._writers_pass = -1
        self._writer_node = WriterNode(
            lambda: self.dafka_config, self._not_a_writer_peer, self._actor_stopped_thread
        )
        self.handover = Handover(
            self.progress, stats, self.send_took, self._note_stored, self.published
        )
        self._by_address: dict[tuple[str, str], PartitionWriter] = {}
        # Topics checked for produce, with their partition count (until the catalog says
        # otherwise): a pass over 1,000 topics looks each one up once per record.
        self._produce_counts: dict[str, int] = {}
        self._groups: dict[str, Group] = {}
        self._reader: Reader | None = None
        self._readers_of: dict[str, set[Group]] = {}  # topic -> groups reading it
        self._inbox: list[Event] = []
        self._took: list[tuple[Hashable, int, int, int]] = []  # for the reader, once a pass
        self._inbox_lock = threading.Lock()
        self._reads: dict[ReadKey, list[tuple[int, bytes]]] = {}
        self._read_numbers = itertools.count()
        self._members: set[Member] = set()
        self._progress: asyncio.Future[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        # Asking the stores for every head after a writers' actor stopped (refresh_heads).
        self._heads_refresh: asyncio.Task[None] | None = None
        self._stopping: asyncio.Task[None] | None = None  # stop()'s one run
        # How long the stores' answers to one request may take to arrive in full.
        self.settle = 0.1

    # --- life cycle ----------------------------------------------------------------------

    @property
    def dafka_config(self) -> DafkaConfig:
        return self._network.config

    @property
    def reader(self) -> Reader:
        if self._reader is None:
            raise EngineError("Dafka engine not started")
        return self._reader

    @property
    def observer(self) -> Observer:
        if self._observer is None:
            raise EngineError("Dafka engine not started")
        return self._observer

    def consumer_config(self) -> DafkaConfig:
        config = self.dafka_config.copy()
        config.set("consumer/offset/reset", "earliest")
        return config

    async def start(self) -> None:
        settings = self.settings
        self._loop = asyncio.get_running_loop()
        allow_sockets()  # before any socket of this process's context
        await self._network.start()
        if self.dafka_config.get_bool(BATCH_SETTING):
            io_threads_as_batch(zmq.Context.instance())  # before the actors' first socket
        try:
            observer, self._reader = await asyncio.gather(
                off_loop(
                    Observer, self.dafka_config, settle=self.settle, on_head=self._head_thread
                ),
                off_loop(
                    Reader,
                    self.dafka_config,
                    self._sink_thread,
                    ignore_peers=self._writer_node.made,
                ),
            )
            self._observer = observer
            await off_loop(observer.wait_settled, self._network.stores, settings.start_timeout)
            catalog_heads = self._stored_heads(TOPICS_TOPIC)
            await off_loop(
                self.catalog.load, self.dafka_config, catalog_heads, settings.start_timeout
            )
            await off_loop(
                self.offsets.load,
                self.dafka_config,
                self._stored_heads(OFFSETS_TOPIC),
                settings.start_timeout,
            )
            for entry in self.catalog.entries():
                if entry.deleted:
                    self.offsets.forget(entry.topic, entry.unix_ms)
        except (NotSettled, TowerUnreachable, EngineError, OSError, ValueError) as error:
            await self._stop_started()
            raise EngineError(f"cannot join the Dafka network: {error}") from None
        except BaseException:
            await self._stop_started()
            raise
        self._started = True
        self._follow_catalog(catalog_heads)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._commit_every(settings.commit_interval)))
        self._tasks.append(loop.create_task(self._snapshot_every(settings.snapshot_interval)))
        log.info(
            "Dafka engine started",
            mode="joined" if settings.joined else "embedded",
            stores=observer.stores,
            committed_offsets=len(self.offsets.all()),
            topics_created=sum(not entry.deleted for entry in self.catalog.entries()),
        )

    def _stored_heads(self, topic: str) -> dict[str, int]:
        observer = self.observer
        return {
            address: stored
            for address in observer.heads(topic)
            if (stored := observer.stored_head(topic, address)) is not None
        }

    async def stop(self) -> None:
        """Stop once; a later call waits for the same run. The gateway bounds its
        shutdown: past the bound it cancels the stop it waits for and calls stop() again
        with a grace of its own, which must finish the run (the embedded tower and
        stores are stopped at its end), not return at once."""
        if self._stopping is None:
            self.stopped = True  # at once: nothing may start while the run is scheduled
            self._stopping = asyncio.get_running_loop().create_task(self._stop())
        await asyncio.shield(self._stopping)

    async def _stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._heads_refresh is not None:
            await asyncio.wait([self._heads_refresh])  # bounded by the metadata timeout
        await asyncio.gather(*(member.close() for member in list(self._members)))
        with contextlib.suppress(EngineError):
            await self.commit_now()
        await self._commits_durable()
        await self._stop_started()

    async def _commits_durable(self) -> None:
        """A periodic commit cancelled above may still be on its way to the stores, its
        acks no longer pending: give it a commit's bound, not the stop flush's, or the
        next start would deliver those records again."""
        writer = self._writers.get((OFFSETS_TOPIC, self.settings.node))
        if writer is not None and writer.failed is None:
            await self.wait_durable(writer, writer.submitted, self.settings.start_timeout)

    async def _stop_started(self) -> None:
        writers = list(self._writers.values())
        self._writers.clear()
        self._by_address.clear()
        timeout = self._stop_flush_timeout
        for writer in writers:
            with contextlib.suppress(Exception):
                await writer.ready
            writer.publish_pending()
        left = await asyncio.to_thread(self._writer_node.close, timeout)
        if left:
            log.warning("records not acknowledged by any store at stop", records=left)
        for group in list(self._groups.values()):
            await group.close()
        if self._reader is not None:
            await asyncio.to_thread(self._reader.close)
        if self._observer is not None:
            await asyncio.to_thread(self._observer.close)
        await self._network.stop()

    # --- producing -----------------------------------------------------------------------

    def producer(self, session_id: str) -> ProducerHandle:
        if self.stopped or not self._started:
            raise ProducerCreationError(STOPPED)
        return ProducerHandle(self, session_id)

    def partition_count(self, topic: str) -> int:
        """The count of a topic created with rafka-topics, else the settings'."""
        return self.catalog.partitions(topic) or self.settings.partition_count(topic)

    def writer_for(self, topic: str, key: bytes | None) -> PartitionWriter:
        """The writer of the partition a record of `topic` with `key` goes to; raises
        ProduceError for a topic that cannot be written (checked once per topic)."""
        count = self._produce_counts.get(topic)
        if count is None:
            try:
                check_topic(topic)
            except ValueError:
                raise ProduceError(INVALID_TOPIC) from None
            if topic.startswith(INTERNAL_PREFIX):
                raise ProduceError(INVALID_TOPIC)  # commits must not be forged
            count = self._produce_counts[topic] = self.partition_count(topic)
        number = self.settings.node * count
        if count > 1:
            number += self._partitioner(key, count)
        return self.writer(topic, number)

    def writer_this_pass(self, topic: str, key: bytes | None) -> PartitionWriter:
        """`writer_for`, looked up once per loop pass (`Handover.pass_number`) for each
        (topic, key), whichever session asks: its checks, partition count and partitioner
        were a fifth of the loop's time at redis-benchmark -P 16, and 50 clients over 100
        topics change topic at nearly every record. Within a pass the partitioner would
        choose the same (keyed: always; keyless: sticky for 10 ms, for every session);
        keyed records and one-partition topics keep their writer from pass to pass."""
        target = (topic, key)
        writer = self._writers_fixed.get(target)
        if writer is not None and writer.failed is None:
            return writer
        this_pass = self.handover.pass_number()
        if this_pass != self._writers_pass:
            self._writers_now.clear()
            self._writers_pass = this_pass
        writer = self._writers_now.get(target)
        if writer is None or writer.failed is not None:
            writer = self._writers_now[target] = self.writer_for(topic, key)
            # Keyed, or of a one-partition topic: the same writer in every pass until the
            # catalog changes the topic's count. A pipeline over 1,000 topics meets each
            # topic once or twice a pass: looked up anew, that was 17% of the loop.
            if self._produce_counts.get(topic) == 1 if key is None else len(key) <= _FIXED_KEY_MAX:
                if len(self._writers_fixed) >= _FIXED_WRITERS_MAX:
                    self._writers_fixed.clear()
                self._writers_fixed[target] = writer
        return writer

    def publisher(self) -> Publisher:
        """The actor all partition writers share (blocking the first time: any thread)."""
        return self._writer_node.get()

    def _not_a_writer_peer(self, address: str) -> bool:
        """Nodes the writers' actor does not connect to (its beacon's thread): other
        gateways' writers, this gateway's observer and its reader (which does not connect
        to the actor: its FETCHes are for the stores). None sends ACK or FETCH to it, and
        connected, every node's XPUB keeps and reports the actor's two subscriptions per
        partition (4,000 partitions: ~13 MiB in the observer's alone)."""
        observer, reader = self._observer, self._reader
        return (
            is_own_address(address)
            or (observer is not None and address == observer.address)
            or (reader is not None and address == reader.address)
        )

    def fail_stranded_writers(self) -> bool:
        """The writers whose actor died (a bug in its thread) fail now; whether any did.
        Called when the clients' queue is full: their records not acknowledged never will
        be, and a writer fails only at its next record, which a full queue never lets
        come (queue_max_messages counts every partition's). Cheap while the actors live:
        there is one, or a few after one died."""
        dead = self._writer_node.newly_stopped()
        if not dead:
            return False
        for writer in list(self._writers.values()):
            writer.fail_if_on(dead)
        return True

    def refresh_heads(self) -> None:
        """A writers' actor stopped: records it sent may be stored with their ACKs lost,
        so the stores' heads known here may be behind. Ask the stores for every head again,
        once for all the writers failing now: a writer opened before the answers came
        would write at offsets the stores hold and take their ACKs for its own records'
        (DUMP confirmed records that no store held)."""
        if self.stopped:
            return  # no writer opens any more
        if self._heads_refresh is None or self._heads_refresh.done():
            self._heads_refresh = self._loop.create_task(self._refresh_heads())

    def heads_refreshing(self) -> asyncio.Task[None] | None:
        """The refresh of `refresh_heads` while it runs: new writers open after it."""
        task = self._heads_refresh
        return None if task is None or task.done() else task

    async def _refresh_heads(self) -> None:
        try:
            await asyncio.to_thread(
                self.observer.refresh, self._network.stores, self._metadata_timeout
            )
        except NotSettled as error:
            log.warning("heads not refreshed after the writers' actor stopped", error=str(error))
        except Exception:  # the observer closed meanwhile, ...: the writers open as they can
            log.exception("heads not refreshed after the writers' actor stopped")

    def _actor_stopped_thread(self) -> None:
        """On a writers' actor's thread as it ends: its writers fail now, on the loop, so
        that a DUMP waiting for their records returns (they failed only at their next
        record, and the DUMP waited its whole timeout)."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: the engine stopped
            self._loop.call_soon_threadsafe(self.fail_stranded_writers)

    def running_publisher(self) -> Publisher | None:
        """That actor if it runs now, without waiting (loop thread)."""
        return self._writer_node.running()

    def writer(self, topic: str, number: int) -> PartitionWriter:
        writer = self._writers.get((topic, number))
        if writer is None or (writer.failed is not None and writer.replaceable):  # try again
            writer = self._writers[(topic, number)] = PartitionWriter(self, topic, number)
            self._by_address[(topic, writer.address)] = writer
        return writer

    def _note_stored(self, heads: list[tuple[str, str, int]]) -> None:
        """The stores hold this gateway's partitions up to these heads: the observer's
        tables, and the reader's (which does not hear this gateway's writers) for the
        topics a group reads here and the catalog: waking the reader for the others cost
        a pipe send and a GIL hand-off per delivery of ACKs (-P 1: 51,800 -> 42,800
        RPUSHX/s)."""
        self.observer.note_stored_many(heads)
        readers_of = self._readers_of
        read = [head for head in heads if head[0] in readers_of or head[0] == TOPICS_TOPIC]
        if read:
            self.reader.stored_heads(read)

    def _head_thread(self, topic: str, address: str, head: int) -> None:
        if self.settings.acks == "all" and (topic, address) in self._by_address:
            self._loop.call_soon_threadsafe(self.progress)

    def progress(self) -> None:
        """Something was acknowledged (or failed): wake every flush waiting."""
        waiter, self._progress = self._progress, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait_progress(self, timeout: float) -> None:
        if self._progress is None:
            self._progress = asyncio.get_running_loop().create_future()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await asyncio.shield(self._progress)

    # --- consuming -----------------------------------------------------------------------

    async def consumer(
        self,
        group: str,
        name: str,
        topics: Sequence[str],
        settings: Mapping[str, object],
    ) -> Member:
        if self.stopped or not self._started:
            raise ConsumerCreationError(STOPPED)
        reset = self._reset(settings)
        # Every topic checked before the group is touched: a join that fails half-way
        # would leave the group holding (and subscribed to) the topics before the bad one.
        for topic in topics:
            try:
                check_topic(topic)
            except ValueError as error:
                raise ConsumerCreationError(str(error)) from None
        # `latest`: after the heads the stores answer now. Known before the join, they
        # tell the partitions that exist from those found later (which start at their
        # beginning); else the join guesses for a settling time, and a partition whose
        # first records came meanwhile lost them.
        heads_known = reset == "latest" and await self._heads_answered(set(topics))
        state = self._groups.get(group)
        if state is None:
            state = self._groups[group] = Group(self, group)
        member = Member(self, state, name, topics, reset)
        try:
            await state.join(member, heads_known)
        except Exception as error:
            if not state.members:
                await state.close()  # a group made for this member only: nothing kept
            raise ConsumerCreationError(str(error)) from None
        if self.stopped:
            await member.close()
            raise ConsumerCreationError(STOPPED)
        self._members.add(member)
        member.on_closed = self._members.discard
        return member

    def _reset(self, settings: Mapping[str, object]) -> str:
        """`auto.offset.reset` of a client's settings. Dafka has no use for librdkafka's
        other properties: they are accepted (a Rafka client may send them) and logged,
        but only values: nested objects, lists and null are refused, as on Kafka."""
        for key, value in settings.items():
            if not isinstance(value, str | bool):
                raise ConsumerCreationError(f"{key}: must be a string, a number or a boolean")
        ignored = sorted(k for k in settings if k != "auto.offset.reset")
        if ignored:
            log.info("consumer settings without effect on the Dafka engine", settings=ignored)
        raw = settings.get("auto.offset.reset", self.settings.auto_offset_reset)
        reset = RESETS.get(str(raw))
        if reset is None:
            known = ", ".join(sorted(RESETS))
            raise ConsumerCreationError(
                f'Invalid value "{raw}" for configuration property "auto.offset.reset" '
                f"(one of {known})"
            )
        return reset

    def subscribe(self, group: Group, topic: str) -> None:
        groups = self._readers_of.setdefault(topic, set())
        if not groups and topic != TOPICS_TOPIC:  # the catalog is always subscribed
            self.reader.subscribe(topic)
        groups.add(group)

    def unsubscribe(self, group: Group, topic: str) -> None:
        groups = self._readers_of.get(topic)
        if groups is None:
            return
        groups.discard(group)
        if not groups:
            del self._readers_of[topic]
            if topic != TOPICS_TOPIC:
                self.reader.unsubscribe(topic)

    def writer_failed(self, topic: str, address: str) -> None:
        """This gateway's writer of `address` failed: what it handed over may never reach
        a store, and the writer that replaces it writes new records at those offsets. The
        groups reading `topic` here restart the partition where the stores hold it. (The
        reader never connects to the writers' actor: no copy of a lost record can reach
        it and pass for the replacement's record at its offset.)"""
        for group in self._readers_of.get(topic, ()):
            group.writer_failed(topic, address)

    def published(self, handed: list[tuple[str, str, int, list[bytes]]]) -> None:
        """For each (topic, address, first, contents): this gateway's writer of `address`
        handed `contents` (sequences `first`, ...) to its publisher: the groups reading
        `topic` here take them at once, in process (loop thread)."""
        readers_of = self._readers_of
        if not readers_of:
            return
        for topic, address, first, contents in handed:
            groups = readers_of.get(topic)
            if groups:
                for group in groups:
                    group.on_published(topic, address, first, contents)

    def took(self, cursor: Hashable, end: int, count: int, generation: int) -> None:
        """A group took `count` records up to `end` (exclusive) of `cursor`'s partition
        in process: the reader hears of all the takes of a hand-over at once, at its end
        (`Reader.took`; `send_took`), one command instead of one per partition (1,000
        topics: one per record). A writer handing its records over alone (at its start,
        at stop) has them sent at the next loop pass."""
        if not self._took:
            self._loop.call_soon(self.send_took)
        self._took.append((cursor, end, count, generation))

    def send_took(self) -> None:
        """The takes noted since the last call, to the reader. Right after the records
        were handed to the writers' actor, so that the reader hears of them before their
        heads (`stored_heads`, from their ACKs) and does not fetch them from the stores."""
        took, self._took = self._took, []
        if took and self._reader is not None:
            self._reader.took(took)

    def committable(self, topic: str, address: str, offset: int) -> int:
        """`offset` as a group may commit it: for a partition this gateway writes, not
        past the first record no store has acknowledged yet (its offset would be written
        again by the next run if this one crashed now)."""
        if (topic, address) not in self._by_address:
            return offset
        head = self.observer.stored_head(topic, address)
        return min(offset, (-1 if head is None else head) + 1)

    def _sink_thread(self, events: list[Event]) -> None:
        with self._inbox_lock:
            first = not self._inbox
            self._inbox.extend(events)
        if first:
            self._loop.call_soon_threadsafe(self._drain_inbox)

    def _drain_inbox(self) -> None:
        with self._inbox_lock:
            events, self._inbox = self._inbox, []
        groups = self._groups
        for event in events:
            if event[0] == "record" and isinstance(event[1], ReadKey):
                self._reads[event[1]].append((event[2], event[3]))
                if len(self._reads[event[1]]) >= event[1].count:
                    self.progress()
            elif event[0] == "record":
                _, (name, topic, address), seq, content, generation = event
                if name is None:
                    self._on_catalog_record(address, content)
                    continue
                group = groups.get(name)
                if group is not None:
                    group.on_record(topic, address, seq, content, generation)
            else:
                _, topic, address, head = event
                if topic == TOPICS_TOPIC:
                    self._follow_catalog_partition(address, 0)
                for group in list(self._readers_of.get(topic, ())):
                    group.on_head(topic, address, head)

    # --- the topic catalog (rafka-topics) -------------------------------------------------

    def _follow_catalog(self, loaded: dict[str, int]) -> None:
        """Follow the catalog from where the start-up read stopped (new partitions of it
        from their beginning, when the reader finds them)."""
        self.reader.subscribe(TOPICS_TOPIC)
        for address, head in loaded.items():
            self._follow_catalog_partition(address, head + 1)

    def _follow_catalog_partition(self, address: str, start: int) -> None:
        if address in self._catalog_cursors:
            return
        self._catalog_cursors.add(address)
        self.reader.start((None, TOPICS_TOPIC, address), TOPICS_TOPIC, address, start, 1000, 0)

    def _on_catalog_record(self, address: str, content: bytes) -> None:
        self.reader.grant((None, TOPICS_TOPIC, address), 1)
        entry = self.catalog.apply(content)
        if entry is None:
            return
        self._produce_counts.pop(entry.topic, None)  # created or deleted: counted again
        self._writers_fixed.clear()
        if entry.deleted:
            forgotten = self.offsets.forget(entry.topic, entry.unix_ms)
            for group in list(self._groups.values()):
                group.topic_deleted(entry.topic)
            log.info("topic deleted (rafka-topics)", topic=entry.topic, offsets_forgotten=forgotten)
        else:
            log.info(
                "topic created (rafka-topics)",
                topic=entry.topic,
                partitions=entry.partitions,
                config=dict(entry.config),
            )

    def topic_gone(self, topic: str, entry: TopicEntry | None = None) -> bool:
        """Deleted with rafka-topics, and nothing written to it since."""
        entry = entry or self.catalog.get(topic)
        return entry is not None and is_gone(entry, self.observer.heads(topic))

    # --- reads by offset (LLEN, LRANGE) --------------------------------------------------

    def _read_address(self, topic: str, partition: int) -> str:
        """The address of a partition that exists: of a topic created, configured
        (`topic_partitions`) or holding records, in the node-0 or this node's block of
        numbers, or any partition the stores know. Raises UnknownPartitionError."""
        if self.stopped or not self._started:
            raise ReadError(STOPPED)
        heads = self.observer.heads(topic)
        entry = self.catalog.get(topic)
        known = (
            bool(heads)
            or (entry is not None and not entry.deleted)
            or self.settings.configured_count(topic) is not None
            or any(t == topic for t, _ in self._writers)
        )
        address = self.partition_map.address(topic, partition) if known else None
        count = self.partition_count(topic)
        block = self.settings.node * count
        if address is not None and (
            address in heads or 0 <= partition < count or block <= partition < block + count
        ):
            return address
        raise UnknownPartitionError(f"{topic}:{partition}")

    async def partition_offsets(self, topic: str, partition: int) -> PartitionOffsets:
        address = self._read_address(topic, partition)
        await self._fresh_heads(topic)
        head = self.observer.stored_head(topic, address)
        if head is None:
            return PartitionOffsets(0, 0)
        return PartitionOffsets(await self._first_held(topic, address, head), head + 1)

    async def _first_held(self, topic: str, address: str, head: int) -> int:
        """The oldest offset the stores keep: 0, unless retention or a deletion took
        records; then our stores answer a FETCH of 0 with their oldest record, which the
        reader jumps to. Past `head` when the topic was deleted through it."""
        if head <= self.catalog.dropped_through(topic, address):
            return head + 1  # a deletion dropped every record of it, its head's too
        oldest = await self._fetch(topic, address, 0, 1, head, jump=True)
        if not oldest:
            # Retention never takes a partition's head record, nor does a deletion once
            # records came after it, so a store holding the partition answers: nothing
            # within the bound is stores that did not answer, not a partition with
            # nothing held (a read by offset skipped it all).
            raise self._unanswered(topic)
        return oldest[0][0]

    def _unanswered(self, topic: str) -> ReadError:
        return ReadError(f"no store answered a read of {topic} within {self._metadata_timeout:g} s")

    async def read(
        self, topic: str, partition: int, start: int, stop: int, limit: int
    ) -> list[Record]:
        address = self._read_address(topic, partition)
        await self._fresh_heads(topic)
        head = self.observer.stored_head(topic, address)
        last = -1 if head is None else min(stop, head)
        if start > last:
            return []
        start = max(start, await self._first_held(topic, address, last))
        if start > last:
            return []
        number = self.partition_map.number(topic, address)
        records: list[Record] = []
        answered = await self._fetch(topic, address, start, last - start + 1, last)
        if not answered:  # held from `start` (above), so some store holds records there
            raise self._unanswered(topic)
        for seq, content in answered:
            if len(records) == limit:
                break
            key, value = unwrap(content)
            records.append(Record(topic, number, seq, key, value, None))
        return records

    async def _fresh_heads(self, topic: str) -> None:
        try:
            await self._ask_heads({topic})
        except NotSettled as error:
            raise ReadError(str(error)) from None

    async def _heads_answered(self, topics: set[str]) -> bool:
        try:
            await self._ask_heads(topics)
        except NotSettled:
            return False
        return True

    async def _ask_heads(self, topics: set[str]) -> None:
        """Ask every store for the heads of `topics` and wait until they answered (else
        NotSettled after metadata_timeout)."""
        self.observer.ask(topics)
        await asyncio.to_thread(
            self.observer.wait_settled, self._network.stores, self._metadata_timeout
        )

    async def _fetch(
        self, topic: str, address: str, start: int, count: int, head: int, jump: bool = False
    ) -> list[tuple[int, bytes]]:
        """Up to `count` records of a partition from `start` (with `jump`: from the first
        record the stores answer with, retention having taken the ones before), fetched
        through the reader; in offset order."""
        key = ReadKey(next(self._read_numbers), count)
        self._reads[key] = []
        self.reader.start(key, topic, address, start, count, 0, head=head, jump=jump)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._metadata_timeout
        got = self._reads[key]
        seen, quiet_since = 0, loop.time()
        try:
            # Until all came; or, once some came, until no more come for a while (the
            # stores answer a FETCH in one burst; retention may have taken the rest).
            while len(got) < count:
                now = loop.time()
                if len(got) != seen:
                    seen, quiet_since = len(got), now
                elif seen and now - quiet_since >= FETCH_SETTLE:
                    break
                if now >= deadline:
                    break
                await self.wait_progress(min(deadline - now, FETCH_QUIET))
        finally:
            self.reader.drop(key)
            del self._reads[key]
        if not got and count:
            log.info("read by offset got nothing", topic=topic, start=start, count=count)
        return sorted(got)

    def forget_group(self, group: Group) -> None:
        if self._groups.get(group.name) is group:
            del self._groups[group.name]

    # --- commits ---------------------------------------------------------------------------

    async def commit_now(
        self, stored_wait: float = 0.0, group: Group | None = None, member: Member | None = None
    ) -> None:
        """Write every ack not yet committed as one record and wait until a store has it.
        With `stored_wait`: then, for up to that long, commit again as stores acknowledge
        the records of `member`'s acks in `group` held back (`committable`), until none is."""
        await self._commit_pending()
        if stored_wait <= 0 or group is None or member is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + stored_wait
        while group.commits_held_back(member):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            await self.wait_progress(remaining)  # woken by every ACK
            await self._commit_pending()

    @property
    def close_commit_wait(self) -> float:
        """How long a member that leaves waits for the stores to hold what it acked, so
        that its last acks are committed (the stop flush's bound)."""
        return self._stop_flush_timeout

    async def _commit_pending(self) -> None:
        entries = [
            (group.name, topic, partition, offset)
            for group in list(self._groups.values())
            for topic, partition, offset in group.pending_commits()
        ]
        if entries:
            await self._write_commits(entries)

    async def _write_commits(self, entries: list[tuple[str, str, int, int]]) -> None:
        await self._write_commit_record(self.offsets.encode(entries), len(entries))

    async def _write_commit_record(self, record: bytes, entries: int) -> None:
        writer = self.writer(OFFSETS_TOPIC, self.settings.node)
        try:
            position = writer.submit([record])
        except EngineError as error:
            self.stats.incr(Stats.COMMIT_ERRORS, entries)
            log.warning("offset commit failed", error=str(error))
            return
        if await self.wait_durable(writer, position, self.settings.start_timeout):
            self.stats.incr(Stats.COMMITTED, entries)
        else:
            self.stats.incr(Stats.COMMIT_ERRORS, entries)
            log.warning("offset commit not acknowledged by the stores in time", entries=entries)

    async def wait_durable(self, writer: PartitionWriter, position: int, timeout: float) -> bool:
        """Wait until `writer`'s records below `position` are durable (as `acks` says)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while writer.durable() < position and writer.failed is None:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            if self.settings.acks == "all":
                # The stores do not say when they have a record: ask them.
                self.observer.ask({writer.topic})
                remaining = min(remaining, ASK_INTERVAL)
            await self.wait_progress(remaining)
        return writer.durable() >= position

    async def _commit_every(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.commit_now()
            except Exception:
                log.exception("periodic commit failed")

    async def _snapshot_every(self, interval: float) -> None:
        while True:
            record, entries = self.offsets.snapshot()
            if entries:
                await self._write_commit_record(record, entries)
            await asyncio.sleep(interval)

    def where(self) -> str:
        return self._network.where()

    def disk_paths(self) -> tuple[str, ...]:
        return self._network.disk_paths()

    # --- metadata --------------------------------------------------------------------------

    async def topics(self) -> list[str]:
        """Every topic a store or a live producer knows or rafka-topics created, the
        internal ones too (as Kafka's listing shows __consumer_offsets), but not those
        deleted with rafka-topics (unless written to again)."""
        if not self._started or self.stopped:
            raise MetadataError(STOPPED)
        try:
            await asyncio.to_thread(
                self.observer.refresh, self._network.stores, self._metadata_timeout
            )
        except NotSettled as error:
            raise MetadataError(str(error)) from None
        known = self.observer.topics() | {entry.topic for entry in self.catalog.entries()}
        return sorted(topic for topic in known if not self.topic_gone(topic))
