"""Real PySpark (local[2]) against a real `rafka` process on each engine: the foreachBatch
sink is at least once when the gateway is killed mid-batch, the `rafka` source resumes
from its checkpoint with nothing lost or read twice, batch reads honour
startingOffsets/endingOffsets, and the writers deliver every row.

One SparkSession for the module (a session takes ~10 s and 800 MB).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from rafka_client import Producer, Reader, Record
from rafka_spark import RafkaSink, register

from e2e.helpers import WAIT, Deployment
from tests.support.proxy import TcpProxy
from tests.support.rafka_process import RafkaProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(300)
QUERY_WAIT = 120  # seconds a query (availableNow) gets to end


def finish(query: StreamingQuery) -> None:
    """Wait for an availableNow query to end; raises its failure (StreamingQueryException)."""
    assert query.awaitTermination(QUERY_WAIT), f"the query still runs after {QUERY_WAIT}s"


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    session = (
        SparkSession.builder.master("local[2]")
        .appName("rafka-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


def url(server: RafkaProcess) -> str:
    return f"redis://127.0.0.1:{server.port}"


def everything(server: RafkaProcess, topic: str, partitions: int) -> list[Record]:
    """Every record of the topic, read by offset (no group)."""
    records: list[Record] = []
    with Reader(url(server)) as reader:
        for partition in range(partitions):
            head = reader.next_offset(topic, partition)
            for start in range(0, head, 1000):
                records += reader.read(topic, partition, start, min(start + 1000, head) - 1)
    return records


def produce(server: RafkaProcess, topic: str, values: list[str]) -> None:
    with Producer(url(server)) as producer:
        for n, value in enumerate(values):
            producer.produce(topic, value, key=f"k{n % 7}")


def lines_dir(path: Path, lines: list[str]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "rows.txt").write_text("".join(f"{line}\n" for line in lines))
    return path


# --- the foreachBatch sink ---------------------------------------------------------------


def test_sink_is_at_least_once_when_the_gateway_is_killed_mid_batch(
    spark: SparkSession, rafka: RafkaProcess, deployment: Deployment, tmp_path: Path
) -> None:
    topic = deployment.new_topic(2)
    rows = [f"row-{n}-" + "x" * 400 for n in range(2000)]
    source = lines_dir(tmp_path / "in", rows)
    # Each of the 2 partitions' connections gets its first 40 kB through (a few RPUSHX
    # of 20 rows), then is held: the batch is stopped mid-way, with records delivered.
    proxy = TcpProxy(rafka.port, hold_after=40_000).start()
    sink = RafkaSink(f"redis://127.0.0.1:{proxy.port}", topic, key="key", batch_size=20)
    runs: list[int] = []

    def send(df: DataFrame, batch_id: int) -> None:
        runs.append(batch_id)
        rows = df.repartition(2).select(F.substring("value", 1, 5).alias("key"), "value")
        sink(rows, batch_id)

    def start() -> StreamingQuery:
        return (
            spark.readStream.text(str(source))
            .writeStream.foreachBatch(send)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )

    try:
        query = start()
        wait_until(lambda: proxy.held == 2, QUERY_WAIT, "the sink's 2 connections held")
        delivered = wait_until(
            lambda: sum(_heads(rafka, topic, 2)), WAIT, "records of batch 0 delivered"
        )
        assert delivered < len(rows)
        assert rafka.child is not None
        os.kill(rafka.child.pid, signal.SIGKILL)  # the gateway dies under the batch
        rafka.child.wait(WAIT)
        proxy.cut()
        with pytest.raises(PySparkException) as failed:
            finish(query)
        assert "ConnectionLost" in str(failed.value), str(failed.value)[-2000:]

        # The gateway comes back; the query restarts on its checkpoint: batch 0 again.
        proxy.hold_after = None
        again = RafkaProcess(rafka.config_path, rafka.port)
        again.start()
        try:
            finish(start())
            assert runs == [0, 0], f"batch runs: {runs}"
            got = Counter(r.value.decode() for r in everything(again, topic, 2) if r.value)
        finally:
            again.kill()
    finally:
        proxy.close()
    missing = set(rows) - set(got)
    assert not missing, f"{len(missing)} rows lost, e.g. {sorted(missing)[:5]}"
    assert set(got) == set(rows)


def _heads(server: RafkaProcess, topic: str, partitions: int) -> list[int]:
    with Reader(url(server), socket_timeout=5) as reader:
        return [reader.next_offset(topic, p) for p in range(partitions)]


# --- the rafka source -----------------------------------------------------------------------


def stream_to_parquet(
    spark: SparkSession, server: RafkaProcess, topic: str, tmp_path: Path, **options: str
) -> StreamingQuery:
    reader = spark.readStream.format("rafka").option("url", url(server)).option("subscribe", topic)
    for name, value in options.items():
        reader = reader.option(name, value)
    return (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )


def test_source_restarts_from_its_checkpoint_with_nothing_lost_or_read_twice(
    spark: SparkSession, rafka: RafkaProcess, deployment: Deployment, tmp_path: Path
) -> None:
    topic = deployment.new_topic(3)
    first = [f"a{n}" for n in range(150)]
    produce(rafka, topic, first)
    options = {"startingOffsets": "earliest", "maxOffsetsPerTrigger": "40"}
    query = stream_to_parquet(spark, rafka, topic, tmp_path, **options)
    finish(query)
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert max(batches) <= 40 and sum(batches) == 150, batches

    # More records while the query is down, and the gateway restarted: the restarted
    # query reads exactly the new ones, from the offsets in its checkpoint.
    second = [f"b{n}" for n in range(90)]
    produce(rafka, topic, second)
    query = stream_to_parquet(spark, rafka, topic, tmp_path, **options)
    finish(query)

    read = spark.read.parquet(str(tmp_path / "out")).collect()
    values = Counter(row["value"].decode() for row in read)
    assert set(values) == set(first + second), "records lost"
    assert max(values.values()) == 1, f"read twice: {[v for v, n in values.items() if n > 1]}"
    truth = {(r.partition, r.offset): r.value for r in everything(rafka, topic, 3)}
    assert {(row["partition"], row["offset"]): row["value"] for row in read} == truth
    assert {row["topic"] for row in read} == {topic}
    keys = {row["key"] for row in read}
    assert keys == {f"k{n}".encode() for n in range(7)}


def test_batch_read_between_starting_and_ending_offsets(
    spark: SparkSession, rafka: RafkaProcess, deployment: Deployment
) -> None:
    topic = deployment.new_topic(2)
    produce(rafka, topic, [f"v{n}" for n in range(60)])
    truth = everything(rafka, topic, 2)
    count0 = sum(1 for r in truth if r.partition == 0)
    assert count0 > 12, "the test needs a dozen records on partition 0"

    def load(**options: str) -> list[Any]:
        reader = spark.read.format("rafka").option("url", url(rafka))
        for name, value in (
            {"subscribe": topic} | options if "assign" not in options else options
        ).items():
            reader = reader.option(name, value)
        return reader.load().collect()

    whole = load()  # earliest to latest
    assert sorted((r["partition"], r["offset"], r["value"]) for r in whole) == sorted(
        (r.partition, r.offset, r.value) for r in truth
    )
    if truth[0].timestamp_ms is not None:  # Kafka's records carry their time
        assert all(r["timestamp"] is not None for r in whole)

    part = load(
        startingOffsets=json.dumps({topic: {"0": 5, "1": -2}}),
        endingOffsets=json.dumps({topic: {"0": 12, "1": -1}}),
    )
    expected = [(r.partition, r.offset) for r in truth if r.partition == 1 or 5 <= r.offset < 12]
    assert sorted((r["partition"], r["offset"]) for r in part) == sorted(expected)

    assigned = load(assign=json.dumps({topic: [1]}), endingOffsets=json.dumps({topic: {"1": 3}}))
    assert sorted(r["offset"] for r in assigned) == [0, 1, 2]
    assert {r["partition"] for r in assigned} == {1}

    with pytest.raises(PySparkException, match="startingOffsets=latest is not allowed"):
        load(startingOffsets="latest")
    # A partition the topic does not have (a typo): its offset was ignored.
    with pytest.raises(
        PySparkException, match=f"names partitions the query does not read: {topic}:9"
    ):
        load(startingOffsets=json.dumps({topic: {"0": 0, "9": 0}}))
    with pytest.raises(PySparkException, match=f"endingOffsets names partitions .*{topic}:0"):
        load(assign=json.dumps({topic: [1]}), endingOffsets=json.dumps({topic: {"0": 3}}))


def test_records_produced_while_a_latest_stream_starts_are_read(
    spark: SparkSession, rafka: RafkaProcess, deployment: Deployment, tmp_path: Path
) -> None:
    """startingOffsets=latest (a stream's default). Spark asks the source for its
    initialOffset() when it plans batch 0 and again when it runs it; the source answers
    the partitions' heads *at each call*. Records produced between the two calls (here:
    while batch 0's latestOffset is held by the proxy) are inside batch 0's planned end
    but after its start as recomputed at run time: batch 0 runs empty, the checkpoint
    records its end, and those records are never read, with no failure at all."""
    topic = deployment.new_topic(1)
    produce(rafka, topic, [f"old{n}" for n in range(5)])  # before the query: not read (latest)
    # Connection 0: initialOffset's LLENs; connection 1: batch 0's latestOffset.
    proxy = TcpProxy(rafka.port, gated=1).start()
    through = f"redis://127.0.0.1:{proxy.port}"
    batches: list[tuple[int, list[str]]] = []

    def collect(df: DataFrame, batch_id: int) -> None:
        batches.append((batch_id, sorted(row["value"].decode() for row in df.collect())))

    new = [f"new{n}" for n in range(10)]
    try:
        query: StreamingQuery = (
            spark.readStream.format("rafka")
            .option("url", through)
            .option("subscribe", topic)
            .load()
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .start()
        )
        try:
            wait_until(
                lambda: proxy.arrived >= 2,
                QUERY_WAIT,
                "the source took its initial offsets and asks for the latest",
                interval=0.05,
            )
            produce(rafka, topic, new)
            proxy.gate.set()
            wait_until(lambda: batches, QUERY_WAIT, "batch 0 ran", interval=0.1)
            try:
                wait_until(
                    lambda: sorted(v for _, values in batches for v in values) == new,
                    30,
                    "the 10 new records read",
                    interval=0.1,
                )
            except AssertionError:
                planned = [
                    (p["batchId"], p["sources"][0]["startOffset"], p["sources"][0]["endOffset"])
                    for p in query.recentProgress
                ]
                raise AssertionError(
                    f"records produced as the query started were never read: batches "
                    f"{batches}, the batches' offsets {planned}"
                ) from None
        finally:
            query.stop()
    finally:
        proxy.close()


# --- the writers ----------------------------------------------------------------------------


def test_writers_deliver_every_row_of_a_batch_and_a_stream(
    spark: SparkSession, rafka: RafkaProcess, deployment: Deployment, tmp_path: Path
) -> None:
    topic = deployment.new_topic(2)
    batch = [f"w{n}" for n in range(300)]
    (
        spark.createDataFrame(
            [(f"k{n % 5}", value) for n, value in enumerate(batch)], "key string, value string"
        )
        .repartition(2)
        .write.format("rafka")
        .option("url", url(rafka))
        .option("topic", topic)
        .mode("append")
        .save()
    )
    streamed = [f"s{n}" for n in range(200)]
    query = (
        spark.readStream.text(str(lines_dir(tmp_path / "in", streamed)))
        .writeStream.format("rafka")
        .option("url", url(rafka))
        .option("topic", topic)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    finish(query)
    records = everything(rafka, topic, 2)
    values = Counter(r.value.decode() for r in records if r.value)
    assert set(values) == set(batch + streamed)
    keyed = {r.value.decode(): r.key for r in records if r.value}
    assert {keyed[v] for v in batch} == {f"k{n}".encode() for n in range(5)}
    assert all(keyed[v] is None for v in streamed)

    with pytest.raises(PySparkException, match="the value column must be string or binary"):
        spark.range(3).withColumnRenamed("id", "value").write.format("rafka").option(
            "url", url(rafka)
        ).option("topic", topic).mode("append").save()
