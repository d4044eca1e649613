"""Topic administration on Kafka (`rafka-topics`): the `Admin` of `backends/base.py`, on
librdkafka's AdminClient with the engine's producer properties (and a consumer with its
consumer properties for offsets). Every librdkafka call runs on a worker thread.

Next offsets: a partition's high watermark is not enough everywhere. Tansu reports the
base offset of the partition's last record batch + 1 (10 records produced in one batch
read as high watermark 1), in ListOffsets as in the fetch's watermarks. So the admin reads
the partition from high watermark - 1 to its end (`enable.partition.eof`): the next offset
is the last record's + 1. On Apache Kafka that is one record per partition.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import (
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

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
from backends.kafka import topic_names
from backends.kafka.settings import KafkaSettings
from backends.kafka.texts import creation_error_text

MAX_PARTITIONS = 2**31 - 1
# librdkafka's own log lines would repeat on stderr what the errors say.
_quiet = logging.getLogger("rafka.kafka.admin.librdkafka")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False
_POLL = 0.02  # seconds per consumer poll while reading partitions' ends (consume() waits it out)


def _code(error: BaseException) -> int | None:
    inner = error.args[0] if isinstance(error, KafkaException) and error.args else None
    return inner.code() if isinstance(inner, KafkaError) else None


def _text(error: BaseException) -> str:
    inner = error.args[0] if isinstance(error, KafkaException) and error.args else None
    return str(inner.str()) if isinstance(inner, KafkaError) else str(error)


class KafkaAdmin(Admin):
    def __init__(self, settings: KafkaSettings, options: EngineOptions) -> None:
        self._producer_config: dict[str, str | int | float | bool] = dict(settings.producer)
        self._consumer_config: dict[str, str | int | float | bool] = dict(settings.consumer)
        self._timeout = options.metadata_timeout
        self._client: AdminClient | None = None
        self._closed = False

    @property
    def _brokers(self) -> str:
        return str(self._producer_config.get("bootstrap.servers", "(no bootstrap.servers)"))

    def _admin(self) -> AdminClient:
        if self._closed:
            raise AdminError("the admin is closed")
        if self._client is None:
            if "bootstrap.servers" not in self._producer_config:
                raise AdminError("no Kafka brokers configured (bootstrap.servers)")
            try:
                self._client = AdminClient(self._producer_config, logger=_quiet)
            except (KafkaException, ValueError, TypeError) as error:
                raise AdminError(
                    f"cannot make a Kafka admin client: {creation_error_text(error)}"
                ) from None
        return self._client

    def _unreachable(self, error: BaseException) -> AdminError:
        return AdminError(f"cannot reach the Kafka cluster at {self._brokers}: {_text(error)}")

    def _topics(self) -> dict[str, Any]:
        """Blocking: the cluster's topics (name -> TopicMetadata). Never asks for one
        topic by name: that may create it on a broker that auto-creates topics."""
        try:
            metadata = self._admin().list_topics(timeout=self._timeout)
        except KafkaException as error:
            raise self._unreachable(error) from None
        return dict(metadata.topics)

    async def list_topics(self) -> list[str]:
        return sorted(await asyncio.to_thread(self._topics))

    async def create_topic(self, name: str, partitions: int, config: Mapping[str, str]) -> None:
        _check_name(name)
        if not 1 <= partitions <= MAX_PARTITIONS:  # Kafka's partition count is an int32
            raise AdminError(f"partitions must be 1 to {MAX_PARTITIONS}, got {partitions}")
        await asyncio.to_thread(self._create, name, partitions, dict(config))

    def _create(self, name: str, partitions: int, config: dict[str, str]) -> None:
        self._topics()  # reachable? (a clear error rather than a request timeout)
        topic = NewTopic(name, num_partitions=partitions, config=config)
        future = self._admin().create_topics(
            [topic], operation_timeout=self._timeout, request_timeout=self._timeout
        )[name]
        try:
            future.result(self._timeout + 1)
        except KafkaException as error:
            if _code(error) == KafkaError.TOPIC_ALREADY_EXISTS:
                raise TopicExistsError(f"Topic '{name}' already exists.") from None
            raise AdminError(f"cannot create topic {name}: {_text(error)}") from None
        except TimeoutError:
            raise AdminError(f"cannot create topic {name}: {self._silent()}") from None
        self._wait_metadata(name, lambda t: t is not None and len(t.partitions) == partitions)

    async def delete_topic(self, name: str) -> None:
        _check_name(name)
        await asyncio.to_thread(self._delete, name)

    def _delete(self, name: str) -> None:
        if name not in self._topics():
            raise UnknownTopicError(f"Topic '{name}' does not exist.")
        future = self._admin().delete_topics(
            [name], operation_timeout=self._timeout, request_timeout=self._timeout
        )[name]
        try:
            future.result(self._timeout + 1)
        except KafkaException as error:
            if _code(error) == KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise UnknownTopicError(f"Topic '{name}' does not exist.") from None
            raise AdminError(f"cannot delete topic {name}: {_text(error)}") from None
        except TimeoutError:
            raise AdminError(f"cannot delete topic {name}: {self._silent()}") from None
        self._wait_metadata(name, lambda t: t is None)

    def _silent(self) -> str:
        return f"the cluster at {self._brokers} did not answer within {self._timeout:g} s"

    def _wait_metadata(self, name: str, done: Any) -> None:
        """Until the cluster's metadata shows the change (bounded: a slow cluster still
        applies it, so it is not an error)."""
        deadline = time.monotonic() + self._timeout
        while not done(self._topics().get(name)) and time.monotonic() < deadline:
            time.sleep(0.05)

    async def describe(self, topic: str) -> TopicDescription:
        _check_name(topic)
        return await asyncio.to_thread(self._describe, topic)

    def _describe(self, topic: str) -> TopicDescription:
        described = self._describe_many([topic])
        if not described:
            raise UnknownTopicError(f"Topic '{topic}' does not exist.")
        return described[0]

    async def describe_many(self, topics: Sequence[str]) -> list[TopicDescription]:
        """One topic listing and one offsets request per group for all of `topics`."""
        for topic in topics:
            _check_name(topic)
        return await asyncio.to_thread(self._describe_many, list(topics))

    def _describe_many(self, topics: list[str]) -> list[TopicDescription]:
        metadata = self._topics()
        present = [topic for topic in topics if topic in metadata]
        offsets = {t: self._offsets(t, sorted(metadata[t].partitions)) for t in present}
        next_of = {topic: {o.partition: o.next for o in offsets[topic]} for topic in present}
        groups = self._groups(next_of)
        return [
            TopicDescription(topic, tuple(offsets[topic]), self._config(topic), groups[topic])
            for topic in present
        ]

    def _offsets(self, topic: str, numbers: list[int]) -> list[TopicPartitionOffsets]:
        config = {
            **self._consumer_config,
            "group.id": "rafka-topics",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "latest",
            # The end of a partition is a fetch that finds nothing: do not let the broker
            # hold it (500 ms by default) before it answers.
            "fetch.wait.max.ms": 10,
        }
        try:
            consumer = RdConsumer(config, logger=_quiet)
        except (KafkaException, ValueError, TypeError) as error:
            raise AdminError(
                f"cannot make a Kafka consumer: {creation_error_text(error)}"
            ) from None
        try:
            marks: dict[int, tuple[int, int]] = {}
            for number in numbers:
                try:
                    low, high = consumer.get_watermark_offsets(
                        TopicPartition(topic, number), timeout=self._timeout, cached=False
                    )
                except KafkaException as error:
                    raise self._unreachable(error) from None
                marks[number] = (low, high)
            ends = self._ends(consumer, topic, marks)
        finally:
            consumer.close()
        return [
            TopicPartitionOffsets(number, low, max(high, ends.get(number, high)))
            for number, (low, high) in sorted(marks.items())
        ]

    def _ends(
        self, consumer: RdConsumer, topic: str, marks: Mapping[int, tuple[int, int]]
    ) -> dict[int, int]:
        """The next offset of each non-empty partition: its last record's + 1, read from
        high watermark - 1 to the partition's end (see the module docstring)."""
        start = {n: high - 1 for n, (low, high) in marks.items() if high > low}
        if not start:
            return {}
        consumer.assign([TopicPartition(topic, n, offset) for n, offset in start.items()])
        ends: dict[int, int] = {}
        left = set(start)
        deadline = time.monotonic() + self._timeout
        while left and time.monotonic() < deadline:
            for message in consumer.consume(10_000, _POLL):
                number, offset, error = message.partition(), message.offset(), message.error()
                if number is None:
                    continue
                if error is None and offset is not None:
                    ends[number] = max(ends.get(number, 0), offset + 1)
                elif error is not None and error.code() == KafkaError._PARTITION_EOF:
                    left.discard(number)
        if left:
            raise AdminError(
                f"the end of {len(left)} partition(s) of {topic} not read within "
                f"{self._timeout:g} s from {self._brokers}"
            )
        return ends

    def _config(self, topic: str) -> Mapping[str, str]:
        resource = ConfigResource(ResourceType.TOPIC, topic)
        try:
            future = self._admin().describe_configs([resource], request_timeout=self._timeout)
            entries = future[resource].result(self._timeout + 1)
        except (KafkaException, TimeoutError):
            # A broker without DescribeConfigs, or not answering it: settings unknown.
            return MappingProxyType({})
        return MappingProxyType(
            {
                key: str(entry.value)
                for key, entry in entries.items()
                if key.startswith("retention.") and entry.value is not None
            }
        )

    def _groups(
        self, next_of: Mapping[str, Mapping[int, int]]
    ) -> dict[str, tuple[GroupOffsets, ...]]:
        """Per topic (of `next_of`: topic -> partition -> next offset), every group's
        committed offsets and lag: one listing of the groups, one request per group."""
        rows: dict[str, list[GroupOffsets]] = {topic: [] for topic in next_of}
        partitions = [
            TopicPartition(topic, number)
            for topic, ends in next_of.items()
            for number in sorted(ends)
        ]
        if not partitions:
            return {topic: () for topic in next_of}
        admin = self._admin()
        try:
            listed = admin.list_consumer_groups(request_timeout=self._timeout).result()
        except KafkaException as error:
            raise AdminError(f"cannot list the consumer groups: {_text(error)}") from None
        if listed.errors:  # per broker, not raised: a description without them would lie
            raise AdminError(f"cannot list the consumer groups: {_text(listed.errors[0])}")
        for group in sorted(g.group_id for g in listed.valid):
            request = ConsumerGroupTopicPartitions(group, partitions)
            try:
                result = admin.list_consumer_group_offsets(
                    [request], request_timeout=self._timeout
                )[group].result()
            except KafkaException as error:
                raise AdminError(
                    f"cannot read the offsets of group {group}: {_text(error)}"
                ) from None
            for committed in result.topic_partitions or ():
                if committed.offset >= 0 and committed.error is None:
                    ends = next_of.get(committed.topic, {})
                    lag = max(0, ends.get(committed.partition, 0) - committed.offset)
                    rows.setdefault(committed.topic, []).append(
                        GroupOffsets(group, committed.partition, committed.offset, lag)
                    )
        return {topic: tuple(rows[topic]) for topic in next_of}

    async def close(self) -> None:
        self._closed = True
        self._client = None  # librdkafka's admin client has no close: dropped here


def _check_name(name: str) -> None:
    if not topic_names.is_legal(name):
        raise AdminError(
            f"invalid topic name {name!r}: Kafka allows 1 to 249 characters of "
            "a-z, A-Z, 0-9, '.', '_' and '-'"
        )
