"""The `rafka` Python Data Source: batch and stream reads of topics, Kafka's row schema.

    spark.dataSource.register(RafkaDataSource)
    df = (
        spark.read.format("rafka")
        .option("url", "redis://gateway:6380")
        .option("subscribe", "flights")
        .option("startingOffsets", "earliest")
        .load()
    )

Built on the reads by offset (LLEN: a partition's next offset; LRANGE: records by
offset), so reading joins no consumer group and commits nothing: a stream's position is
the offsets Spark keeps in its checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType
from rafka_client import NotHeld, Reader

from rafka_spark.offsets import (
    EARLIEST,
    LATEST,
    Offsets,
    SourceOptions,
    first_held,
    flat,
    limit_offsets,
    nested,
    next_offsets,
    resolve,
)

SCHEMA = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp"
Row = tuple[bytes | None, bytes | None, str, int, int, datetime | None]


class DataLoss(RuntimeError):
    """Records the query should read are no longer held (retention), with
    failOnDataLoss=true (the default)."""


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """One Spark partition: the records of (topic, partition) with start <= offset < end."""

    topic: str
    partition: int
    start: int
    end: int


def read_range(
    url: str, span: OffsetRange, range_size: int, fail_on_data_loss: bool
) -> Iterator[Row]:
    """The records of `span` as rows, read with LRANGE in pieces of `range_size`."""
    with Reader(url) as reader:
        start = span.start
        if start == EARLIEST:  # a partition that appeared after the query started
            start = first_held(reader, span.topic, span.partition)
        while start < span.end:
            stop = min(start + range_size, span.end) - 1
            try:
                records = reader.read(span.topic, span.partition, start, stop)
            except NotHeld as gone:
                if fail_on_data_loss:
                    raise DataLoss(
                        f"{span.topic}:{span.partition}: offsets {start} to {stop} are no "
                        f"longer held (first held: {gone.first_held}); set "
                        "failOnDataLoss=false to skip them"
                    ) from None
                start = gone.first_held
                continue
            lost = start == span.start and records and records[0].offset > start
            if fail_on_data_loss and lost:
                raise DataLoss(
                    f"{span.topic}:{span.partition}: offset {start} is no longer "
                    f"held (first held: {records[0].offset}); set failOnDataLoss=false"
                )
            for record in records:
                stamp = record.timestamp_ms
                yield (
                    record.key,
                    record.value,
                    record.topic,
                    record.partition,
                    record.offset,
                    None if stamp is None else datetime.fromtimestamp(stamp / 1000, UTC),
                )
            # On from the last record answered: an engine may answer fewer than the range
            # holds (Dafka, a store slower than the read's settle time), and the rest is
            # asked for again. An empty answer moves past the range.
            start = records[-1].offset + 1 if records else stop + 1


def _ranges(start: Offsets, end: Offsets) -> list[OffsetRange]:
    """One range per partition with records between `start` and `end`; a partition that
    `start` lacks (it appeared since) is read from its first held offset."""
    first = flat(start)
    return [
        OffsetRange(topic, partition, first.get((topic, partition), EARLIEST), last)
        for (topic, partition), last in sorted(flat(end).items())
        if last > max(first.get((topic, partition), 0), 0)
    ]


class RafkaDataSource(DataSource):
    """`format("rafka")`: read (batch, stream) and write (batch, stream) topics."""

    @classmethod
    def name(cls) -> str:
        return "rafka"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return RafkaBatchReader(SourceOptions.parse(self.options, stream=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return RafkaStreamReader(SourceOptions.parse(self.options, stream=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from rafka_spark.writer import RafkaWriter, WriterOptions

        return RafkaWriter(WriterOptions.parse(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from rafka_spark.writer import RafkaStreamWriter, WriterOptions

        return RafkaStreamWriter(WriterOptions.parse(self.options, schema))


class RafkaBatchReader(DataSourceReader):
    """Reads from startingOffsets (default earliest) to endingOffsets (default latest),
    both resolved once, when the query is planned."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        with Reader(options.url) as reader:
            heads = next_offsets(reader, options)
            self.start = resolve(reader, options.starting, heads)
            self.end = resolve(reader, options.ending, heads, LATEST, "endingOffsets")

    def partitions(self) -> list[OffsetRange]:
        return _ranges(self.start, self.end)

    def read(self, partition: InputPartition) -> Iterator[Row]:
        assert isinstance(partition, OffsetRange)
        yield from read_range(
            self.options.url, partition, self.options.range_size, self.options.fail_on_data_loss
        )


class RafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Each micro-batch reads from the last batch's end to the partitions' next offsets
    (at most maxOffsetsPerTrigger records in all); Spark keeps the offsets in the query's
    checkpoint, so a restarted query goes on where the last committed batch ended.
    Partitions that appear later are read from their first held offset."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._target: dict[tuple[str, int], int] | None = None  # Trigger.AvailableNow's
        self._initial: Offsets | None = None

    def initialOffset(self) -> Offsets:
        """Resolved once: Spark asks again when it runs batch 0 (after planning it with
        the first answer); "latest" resolved anew then would skip what came in between."""
        if self._initial is None:
            with Reader(self.options.url) as reader:
                heads = next_offsets(reader, self.options)
                self._initial = resolve(reader, self.options.starting, heads)
        return self._initial

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: read what the partitions hold now, nothing after."""
        with Reader(self.options.url) as reader:
            self._target = next_offsets(reader, self.options)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def latestOffset(self, start: Offsets | None = None, limit: ReadLimit | None = None) -> Offsets:
        with Reader(self.options.url) as reader:
            heads = next_offsets(reader, self.options)
            if self._target is not None:
                heads = {tp: min(h, self._target.get(tp, 0)) for tp, h in heads.items()}
            begin = flat(start or {})
            for tp in heads:  # a new partition: from its first held offset
                if tp not in begin:
                    begin[tp] = resolve(reader, "earliest", {tp: heads[tp]})[tp[0]][str(tp[1])]
        for tp, offset in begin.items():  # a partition no longer listed keeps its offset
            heads.setdefault(tp, offset)
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if budget is None and start is None:  # Spark < 4.2: no admission control
            budget = self.options.max_per_trigger
        if budget is None:
            return nested({tp: max(h, begin[tp]) for tp, h in heads.items()})
        return nested(limit_offsets(begin, heads, budget))

    def partitions(self, start: Offsets, end: Offsets) -> list[OffsetRange]:
        return _ranges(start, end)

    def read(self, partition: InputPartition) -> Iterator[Row]:
        assert isinstance(partition, OffsetRange)
        yield from read_range(
            self.options.url, partition, self.options.range_size, self.options.fail_on_data_loss
        )

    def commit(self, end: Offsets) -> None:
        """Nothing to do: reads commit nothing in rafka; the checkpoint holds the offsets."""
