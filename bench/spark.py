"""Spark benchmark (`make bench-spark`): rows/s of the NYC flights through the
foreachBatch sink and through the `rafka` source, next to the same rows written and read
directly in the same run.

For each engine, a `rafka` process (Dafka: embedded, over a temporary directory; Kafka: on
a Tansu broker started here) and one SparkSession (local[2]):
- sink: `RafkaSink` over the flights as JSON records keyed by carrier (2 Spark partitions,
  one connection each), up to DUMP answering 0;
- reference: the same records (bytes for bytes) with rafka_client's Producer in this
  process (one connection), up to its flush; on Kafka also with confluent-kafka's Producer
  straight to the broker (the engine's own client), up to its flush;
- source: `spark.read.format("rafka")` over the sink's topic, every value touched;
- reference: the same records read with rafka_client's Reader (LRANGE, 1000 per call) in
  this process; on Kafka also with a confluent-kafka consumer straight from the broker.

Prints figures and ratios; never fails a build. `.venv/bin/python bench/spark.py
[--engine dafka|kafka|both] [--limit N]`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "clients" / "spark"))

from confluent_kafka import Consumer, Producer, TopicPartition
from flights_pipeline import COLUMNS, spark_session, split_flights
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from rafka_client import Producer as RafkaProducer
from rafka_client import Reader
from rafka_spark import RafkaSink, register, to_records

from e2e.helpers import dafka_document
from tests.support.rafka_process import RafkaProcess, write_config
from tests.support.tansu import TansuBroker


def timed(what: str, rows: int, work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    rate = rows / (time.perf_counter() - started)
    print(f"  {what:58} {rate:>10,.0f} rows/s", flush=True)
    return rate


def ratio(name: str, ours: float, reference: float, reference_name: str) -> None:
    print(f"  -> {name}: {ours / reference:.2f} x {reference_name}", flush=True)


@contextmanager
def gateway(engine: str, work: Path) -> Iterator[tuple[str, TansuBroker | None]]:
    config = work / engine / "rafka.json"
    config.parent.mkdir(parents=True)
    if engine == "kafka":
        with TansuBroker() as broker:
            server = RafkaProcess(write_config(config, broker.bootstrap))
            server.start()
            try:
                yield f"redis://127.0.0.1:{server.port}", broker
            finally:
                server.terminate()
        return
    config.write_text(json.dumps(dafka_document(config.parent / "rafka-data")))
    server = RafkaProcess(config)
    server.start()
    try:
        yield f"redis://127.0.0.1:{server.port}", None
    finally:
        server.terminate()


def topic_for(broker: TansuBroker | None, name: str) -> str:
    return broker.create_topic(4) if broker is not None else f"p4-{name}-{os.getpid()}"


def direct_write(url: str, topic: str, records: list[tuple[str, bytes]]) -> None:
    with RafkaProducer(url, flush_timeout=120) as producer:
        for key, value in records:
            producer.produce(topic, value, key=key)


def confluent_write(bootstrap: str, topic: str, records: list[tuple[str, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for key, value in records:
        while True:
            try:
                producer.produce(topic, value, key=key)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0


def direct_read(url: str, topic: str) -> int:
    from rafka_spark.offsets import partitions_of

    count = 0
    with Reader(url) as reader:
        for partition in partitions_of(reader, topic):
            head = reader.next_offset(topic, partition)
            for start in range(0, head, 1000):
                count += len(reader.read(topic, partition, start, min(start + 1000, head) - 1))
    return count


def confluent_read(bootstrap: str, topic: str, rows: int) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{time.time()}"})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(4)])
    seen = 0
    deadline = time.monotonic() + 300
    while seen < rows and time.monotonic() < deadline:
        seen += sum(1 for m in consumer.consume(1000, 1.0) if m.error() is None)
    consumer.close()


def source_read(spark: SparkSession, url: str, topic: str) -> int:
    df = spark.read.format("rafka").option("url", url).option("subscribe", topic).load()
    return int(df.select(F.sum(F.length("value"))).collect()[0][0] or 0)


def bench(engine: str, spark: SparkSession, records: DataFrame, rows: list, work: Path) -> None:
    count = len(rows)
    print(f"\n{engine} engine, {count:,} flights", flush=True)
    with gateway(engine, work) as (url, broker):
        sink_topic = topic_for(broker, "sink")
        sink = RafkaSink(url, sink_topic, key="key")
        sunk = timed("sink: foreachBatch RafkaSink (2 partitions)", count, lambda: sink(records, 0))
        direct_topic = topic_for(broker, "direct")
        direct = timed(
            "rafka_client Producer, this process",
            count,
            lambda: direct_write(url, direct_topic, rows),
        )
        ratio("sink", sunk, direct, "rafka_client Producer")
        if broker is not None:
            native_topic = broker.create_topic(4)
            native = timed(
                "confluent-kafka Producer, straight to the broker",
                count,
                lambda: confluent_write(broker.bootstrap, native_topic, rows),
            )
            ratio("sink", sunk, native, "confluent-kafka Producer")
        source = timed(
            "source: spark.read.format('rafka')", count, lambda: source_read(spark, url, sink_topic)
        )
        reader = timed(
            "rafka_client Reader (LRANGE), this process",
            count,
            lambda: direct_read(url, sink_topic),
        )
        ratio("source", source, reader, "rafka_client Reader")
        if broker is not None:
            consumer = timed(
                "confluent-kafka Consumer, straight from the broker",
                count,
                lambda: confluent_read(broker.bootstrap, sink_topic, count),
            )
            ratio("source", source, consumer, "confluent-kafka Consumer")


def main() -> int:
    parser = argparse.ArgumentParser(description="Spark sink and source throughput")
    parser.add_argument("--engine", choices=["dafka", "kafka", "both"], default="both")
    parser.add_argument("--limit", type=int, help="only the first N flights")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rafka-bench-spark-") as temporary:
        work = Path(temporary)
        csv_file, _ = split_flights(work / "months", args.limit)
        spark = spark_session(2)
        try:
            register(spark)
            flights = (
                spark.read.schema(COLUMNS)
                .option("header", "true")
                .option("nullValue", "NA")
                .csv(str(csv_file))
            )
            records = to_records(flights, key="carrier").repartition(2).cache()
            rows = [(r["key"], r["value"].encode()) for r in records.collect()]
            for engine in ["dafka", "kafka"] if args.engine == "both" else [args.engine]:
                bench(engine, spark, records, rows, work)
        finally:
            spark.stop()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as error:  # a benchmark reports, it never fails a build
        print(f"bench/spark.py: {error!r}", file=sys.stderr)
        sys.exit(0)
