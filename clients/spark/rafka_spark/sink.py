"""The foreachBatch sink: each partition of a micro-batch through one rafka_client Producer.

    from rafka_spark import RafkaSink, to_records

    sink = RafkaSink("redis://gateway:6380", "flights", key="key")
    query = (
        stream.writeStream.foreachBatch(
            lambda df, batch_id: sink(to_records(df, key="carrier", batch_id=batch_id), batch_id)
        )
        .option("checkpointLocation", "/tmp/checkpoints/flights")
        .start()
    )

One connection per partition of the micro-batch (`foreachPartition`): values (and the
optional key column) go as multi-value RPUSHX batches, then DUMP. A record still
outstanding after the flush, a refused batch or a lost connection raises in the task, so
the batch fails and Spark runs it again (at least once).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

from rafka_client import ProduceError, Producer, Reader, UnknownPartition

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

DEFAULT_URL = "redis://127.0.0.1:6380"
BATCH_SIZE = 1000  # records per RPUSHX (rafka_client's default)
FLUSH_TIMEOUT = 30.0  # seconds a partition's DUMP waits for its records


def _payload(value: Any, what: str) -> bytes | str:
    if isinstance(value, bytes | str):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if value is None:
        raise ValueError(f"the {what} column is null in a row: rafka cannot send a null {what}")
    raise TypeError(f"the {what} column must be string or binary, got {type(value).__name__}")


def write_rows(
    rows: Iterable[Any],
    *,
    url: str,
    topic: str | None,
    value: str = "value",
    key: str | None = None,
    topic_column: str | None = None,
    batch_size: int = BATCH_SIZE,
    flush_timeout: float = FLUSH_TIMEOUT,
) -> int:
    """Produce every row on one connection, then flush; return how many were produced.

    Each row gives the record's value (column `value`), key (column `key`, if any; a null
    key means no key) and topic (column `topic_column` when set and not null, else
    `topic`). Raises what the Producer raises (FlushTimeout when records stay outstanding,
    ProduceError, ConnectionLost, DeliveryUnknown), ValueError/TypeError for bad rows.
    """
    count = 0
    topics: set[str] = set()
    with Producer(url, batch_size=batch_size, flush_timeout=flush_timeout) as producer:
        for row in rows:
            target = row[topic_column] if topic_column is not None else None
            target = target if target is not None else topic
            if target is None:
                raise ValueError("a row has no topic: set the topic option or a topic column")
            record_key = None if key is None else row[key]
            producer.produce(
                target,
                _payload(row[value], "value"),
                None if record_key is None else _payload(record_key, "key"),
            )
            topics.add(target)
            count += 1
    # DUMP answers 0 also for records whose delivery failed (on Kafka: a topic the broker
    # does not have and does not create): what was written to a missing topic is lost.
    with Reader(url) as reader:
        for name in sorted(topics):
            try:
                reader.next_offset(name, 0)
            except UnknownPartition:
                raise ProduceError(
                    f"topic {name!r} does not exist: its records were not delivered"
                ) from None
    return count


def _write_partition(rows: Iterator[Any], **settings: Any) -> None:
    write_rows(rows, **settings)


class RafkaSink:
    """A `foreachBatch` function: `sink(df, batch_id)` sends every row of `df` to rafka.

    `value`: the column of the record values (string or binary); `key`: an optional key
    column; `topic`: the topic, or `topic_column` naming a column that holds each row's
    topic. Returns once every partition's records are durable (DUMP answered 0); raises
    (and so fails the batch, which Spark runs again) otherwise.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        topic: str | None = None,
        *,
        value: str = "value",
        key: str | None = None,
        topic_column: str | None = None,
        batch_size: int = BATCH_SIZE,
        flush_timeout: float = FLUSH_TIMEOUT,
    ) -> None:
        if topic is None and topic_column is None:
            raise ValueError("RafkaSink needs a topic or a topic_column")
        self.settings: dict[str, Any] = {
            "url": url,
            "topic": topic,
            "value": value,
            "key": key,
            "topic_column": topic_column,
            "batch_size": batch_size,
            "flush_timeout": flush_timeout,
        }

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        columns = [self.settings["value"], self.settings["key"], self.settings["topic_column"]]
        wanted = [name for name in columns if name is not None]
        missing = [name for name in wanted if name not in df.columns]
        if missing:
            raise ValueError(f"RafkaSink: no column {missing[0]!r} in {df.columns}")
        df.select(*dict.fromkeys(wanted)).foreachPartition(
            partial(_write_partition, **self.settings)
        )


def to_records(df: DataFrame, *, key: str | None = None, batch_id: int | None = None) -> DataFrame:
    """`df` as records for the sink: `value` is one JSON object per row holding every
    column by name (nulls included), plus `"batch_id": <batch_id>` when given, so that a
    batch Spark ran again can be recognised downstream; `key` is the `key` column cast to
    string when given."""
    from pyspark.sql import functions as F

    fields = [F.col(f"`{name}`") for name in df.columns]
    if batch_id is not None:
        fields.append(F.lit(batch_id).alias("batch_id"))
    value = F.to_json(F.struct(*fields), {"ignoreNullFields": "false"}).alias("value")
    if key is None:
        return df.select(value)
    return df.select(F.col(f"`{key}`").cast("string").alias("key"), value)
