"""The Kafka engine: Apache Kafka (or a compatible broker) through librdkafka.

Configuration arrives as `KafkaSettings` (Rafka's `general` section merged under
`consumer` and `producer`, `go.*` keys stripped, every value a string).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import structlog
from confluent_kafka import KafkaException

from backends.base import (
    ConsumerCreationError,
    Engine,
    EngineOptions,
    MetadataClientError,
    MetadataError,
    PartitionOffsets,
    ProducerCreationError,
    Record,
    Stats,
)
from backends.kafka.consumer import MAX_BATCH, KafkaConsumer
from backends.kafka.producer import ProducerHandle, SharedProducer
from backends.kafka.reads import KafkaReads
from backends.kafka.settings import (
    KafkaSettings,
    consumer_config,
    consumer_overrides,
    consumer_properties,
)
from backends.kafka.texts import error_text

log = structlog.get_logger("rafka.kafka.engine")

STOPPED = "Engine stopped"


class KafkaEngine(Engine):
    """One shared producer for every session, one librdkafka consumer per session."""

    def __init__(self, stats: Stats, settings: KafkaSettings, options: EngineOptions) -> None:
        """`options.consume_batch`: records a consumer fetches from librdkafka at once
        (1..1e6, confluent-kafka's limit)."""
        super().__init__(stats)
        batch = options.consume_batch
        if not 1 <= batch <= MAX_BATCH:
            raise ValueError(f"consume_batch must be 1..{MAX_BATCH}, not {batch}")
        self._configured = settings.consumer
        self._consumer_config = consumer_properties(settings)
        self._producer_config = dict(settings.producer)
        self._metadata_timeout = options.metadata_timeout
        self._stop_flush_timeout = options.stop_flush_timeout
        self._consume_batch = batch
        self._producer: SharedProducer | None = None
        self._consumers: set[KafkaConsumer] = set()
        self._reads = KafkaReads(self._consumer_config, options.metadata_timeout)
        self._stopped = False

    async def start(self) -> None:
        """Nothing to connect yet: librdkafka clients are created on first use."""

    async def stop(self) -> None:
        """Close consumers the gateway left open, then flush and close the producer."""
        self._stopped = True
        # Concurrently: each close waits for its own group to be left.
        await asyncio.gather(*(consumer.close() for consumer in list(self._consumers)))
        await self._reads.close()
        shared, self._producer = self._producer, None
        if shared is not None:
            await shared.close(self._stop_flush_timeout)

    def _shared_producer(self) -> SharedProducer:
        if self._stopped:
            raise ProducerCreationError(STOPPED)
        if self._producer is None:
            # Raises ProducerCreationError; the next call simply tries again.
            self._producer = SharedProducer(self._producer_config, self.stats)
        return self._producer

    def producer(self, session_id: str) -> ProducerHandle:
        return ProducerHandle(self._shared_producer(), self.stats, session_id)

    async def consumer(
        self,
        group: str,
        name: str,
        topics: Sequence[str],
        settings: Mapping[str, object],
    ) -> KafkaConsumer:
        if self._stopped:
            raise ConsumerCreationError(STOPPED)
        overrides = consumer_overrides(settings)
        # Through consumer_config again: a client's fetch.max.bytes is fitted as a
        # configured one is.
        config = {
            **consumer_config(self._configured, overrides),
            "group.id": group,
            "client.id": name,
        }
        consumer = await KafkaConsumer.open(
            config, topics, self.stats, label=f"{group}:{name}", batch=self._consume_batch
        )
        if self._stopped:
            # stop() ran during the creation and could not see this one: nobody would
            # ever close it (nor join its thread).
            await consumer.close()
            raise ConsumerCreationError(STOPPED)
        self._consumers.add(consumer)
        # Forget it once closed, so that stop() only closes what the gateway did not.
        consumer.on_closed = self._forget
        return consumer

    def _forget(self, consumer: KafkaConsumer) -> None:
        self._consumers.discard(consumer)

    def where(self) -> str:
        brokers = self._producer_config.get("bootstrap.servers", "(no bootstrap.servers)")
        return f"Kafka brokers {brokers}"

    async def topics(self) -> list[str]:
        """Every topic the cluster reports, internal ones included (as Rafka's KEYS).

        Uses the shared producer, creating it if needed: a bad producer configuration
        raises MetadataClientError here, as Rafka answered `Error spawning producer`.
        """
        try:
            rd = self._shared_producer().rd
        except ProducerCreationError as error:
            raise MetadataClientError(str(error)) from None
        try:
            metadata = await asyncio.to_thread(rd.list_topics, timeout=self._metadata_timeout)
        except KafkaException as exc:
            raise MetadataError(error_text(exc)) from None
        return sorted(metadata.topics)

    async def partition_offsets(self, topic: str, partition: int) -> PartitionOffsets:
        """Each call: a short-lived assign()-based consumer (backends/kafka/reads.py)."""
        return await self._reads.partition_offsets(topic, partition)

    async def read(
        self, topic: str, partition: int, start: int, stop: int, limit: int
    ) -> list[Record]:
        return await self._reads.read(topic, partition, start, stop, limit)
