"""rafka_spark: Spark to and from rafka topics, at least once.

    from rafka_spark import RafkaDataSource, RafkaSink, to_records

    spark.dataSource.register(RafkaDataSource)         # format("rafka")
    spark.read.format("rafka").option("subscribe", "flights").load()
    stream.writeStream.foreachBatch(RafkaSink(url, "flights", key="key"))

See clients/spark/README.md.
"""

from rafka_spark.sink import RafkaSink, to_records, write_rows

__all__ = ["RafkaDataSource", "RafkaSink", "register", "to_records", "write_rows"]


def __getattr__(name: str) -> object:
    # The data source needs pyspark's datasource API (and pyarrow); the sink only pyspark.
    if name == "RafkaDataSource":
        from rafka_spark.source import RafkaDataSource

        return RafkaDataSource
    raise AttributeError(name)


def register(spark: object) -> None:
    """Register the `rafka` format with `spark` (a SparkSession)."""
    from rafka_spark.source import RafkaDataSource

    spark.dataSource.register(RafkaDataSource)  # type: ignore[attr-defined]
