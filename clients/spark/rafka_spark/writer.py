"""`df.write.format("rafka")` and `df.writeStream.format("rafka")`: the Data Source writer
classes, with the foreachBatch sink's guarantee (each Spark partition through one
Producer, flushed with DUMP; anything outstanding fails the task: at least once).

Columns as spark-sql-kafka's writer: `value` (string or binary, required), `key`
(optional), `topic` (optional: overrides the `topic` option per row).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, StringType, StructType

from rafka_spark.offsets import OptionError, _positive
from rafka_spark.sink import BATCH_SIZE, DEFAULT_URL, FLUSH_TIMEOUT, write_rows


@dataclass(frozen=True)
class WriterOptions:
    url: str
    topic: str | None
    key: str | None
    topic_column: str | None
    batch_size: int
    flush_timeout: float

    @staticmethod
    def parse(options: Mapping[str, str], schema: StructType) -> WriterOptions:
        lower = {name.lower(): value for name, value in options.items()}
        types = {field.name: field.dataType for field in schema.fields}
        for name in ("value", "key", "topic"):
            if name in types and not isinstance(types[name], StringType | BinaryType):
                raise OptionError(f"the {name} column must be string or binary, got {types[name]}")
        if "value" not in types:
            raise OptionError(f"the rafka writer needs a value column, got {list(types)}")
        topic = lower.get("topic")
        if topic is None and "topic" not in types:
            raise OptionError("set the topic option or give the rows a topic column")
        try:
            flush_timeout = float(lower.get("flushtimeout", FLUSH_TIMEOUT))
        except ValueError:
            raise OptionError(
                f"flushTimeout must be seconds, got {lower['flushtimeout']!r}"
            ) from None
        if not 0 < flush_timeout < float("inf"):
            raise OptionError(
                f"flushTimeout must be a positive number of seconds, got {lower['flushtimeout']!r}"
            )
        return WriterOptions(
            url=lower.get("url", DEFAULT_URL),
            topic=topic,
            key="key" if "key" in types else None,
            topic_column="topic" if "topic" in types else None,
            batch_size=_positive("batchSize", lower.get("batchsize", str(BATCH_SIZE))),
            flush_timeout=flush_timeout,
        )


@dataclass
class Written(WriterCommitMessage):
    records: int


def _write(options: WriterOptions, rows: Iterator[Any]) -> Written:
    return Written(
        write_rows(
            rows,
            url=options.url,
            topic=options.topic,
            key=options.key,
            topic_column=options.topic_column,
            batch_size=options.batch_size,
            flush_timeout=options.flush_timeout,
        )
    )


class RafkaWriter(DataSourceWriter):
    def __init__(self, options: WriterOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> Written:
        return _write(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every partition's records were durable when its task ended: nothing left."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Records of the partitions that did finish stay in the topic (at least once)."""


class RafkaStreamWriter(DataSourceStreamWriter):
    def __init__(self, options: WriterOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> Written:
        return _write(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Every partition's records were durable when its task ended: nothing left."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Records of the partitions that did finish stay in the topic: the batch is
        run again, and those come twice (at least once)."""
