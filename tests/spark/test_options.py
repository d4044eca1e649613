"""The `rafka` source's options (spark-sql-kafka's names) and its per-trigger limit, without
Spark: what a user gets for each option, and the clear error for a wrong one; the
partition probe against a plain redis-server (the client's test double)."""

from __future__ import annotations

import uuid

import pytest
from rafka_client import Reader
from rafka_spark.offsets import LATEST, OptionError, SourceOptions, limit_offsets, partitions_of

from tests.support.redis_server import RedisServer


def parse(stream: bool = False, **options: str) -> SourceOptions:
    return SourceOptions.parse(options, stream=stream)


def test_defaults_are_spark_sql_kafkas() -> None:
    batch = parse(subscribe="a, b")
    assert batch.topics == ("a", "b")
    assert (batch.starting, batch.ending) == ("earliest", "latest")
    assert batch.url == "redis://127.0.0.1:6380"
    stream = parse(stream=True, subscribe="a")
    assert stream.starting == "latest"
    assert stream.max_per_trigger is None and stream.fail_on_data_loss


def test_option_names_are_case_insensitive_and_json_offsets_parse() -> None:
    options = parse(
        SUBSCRIBE="t",
        startingoffsets='{"t": {"0": 23, "1": -2}}',
        ENDINGOFFSETS='{"t": {"0": -1}}',
        maxOffsetsPerTrigger="500",
    )
    assert options.starting == {"t": {"0": 23, "1": -2}}
    assert options.ending == {"t": {"0": LATEST}}
    assert options.max_per_trigger == 500


def test_assign_names_the_partitions() -> None:
    options = parse(assign='{"t": [0, 2], "u": [1]}')
    assert options.topics == ("t", "u")
    assert options.assign == {"t": (0, 2), "u": (1,)}


@pytest.mark.parametrize(
    ("options", "stream", "error"),
    [
        ({}, False, "set exactly one of the options subscribe and assign"),
        ({"subscribe": "a", "assign": '{"a":[0]}'}, False, "set exactly one"),
        ({"subscribePattern": "a.*"}, False, "subscribePattern is not supported"),
        ({"subscribe": " , "}, False, "subscribe names no topic"),
        ({"subscribe": "a:b"}, False, "a topic has no ':'"),
        ({"assign": "[0]"}, False, "assign must be JSON like"),
        ({"subscribe": "a", "startingOffsets": "latest"}, False, "not allowed in a batch"),
        ({"subscribe": "a", "endingOffsets": "earliest"}, False, "not allowed in a batch"),
        ({"subscribe": "a", "endingOffsets": "latest"}, True, "endingOffsets is for batch"),
        ({"subscribe": "a", "startingOffsets": "{"}, True, "startingOffsets is not valid JSON"),
        ({"subscribe": "a", "startingOffsets": '{"a":{"x":1}}'}, True, "must be earliest"),
        ({"subscribe": "a", "startingOffsets": '{"a":{"0":-3}}'}, True, "must be earliest"),
        ({"subscribe": "a", "maxOffsetsPerTrigger": "0"}, True, "must be a positive integer"),
        ({"subscribe": "a", "failOnDataLoss": "maybe"}, True, "must be true or false"),
    ],
)
def test_a_wrong_option_is_refused_with_its_name(
    options: dict[str, str], stream: bool, error: str
) -> None:
    with pytest.raises(OptionError, match=error):
        SourceOptions.parse(options, stream=stream)


def test_the_limit_is_shared_in_proportion_to_what_waits() -> None:
    start = {("t", 0): 0, ("t", 1): 100}
    heads = {("t", 0): 300, ("t", 1): 200, ("t", 2): 100}  # 300 + 100 + 100 waiting
    end = limit_offsets(start, heads, 50)
    taken = {tp: end[tp] - start.get(tp, 0) for tp in heads}
    assert sum(taken.values()) == 50
    assert taken == {("t", 0): 30, ("t", 1): 10, ("t", 2): 10}
    assert limit_offsets(start, heads, 10_000) == heads  # all of it fits


def test_a_small_limit_still_moves_on() -> None:
    start = {("t", p): 0 for p in range(4)}
    heads = {("t", p): 1 for p in range(4)}
    end = limit_offsets(start, heads, 1)
    assert sum(end.values()) == 1


def test_against_plain_redis_the_partition_probe_asks_for_assign(redis_server: RedisServer) -> None:
    # Plain Redis answers LLEN 0 for any key, so the probe never meets an unknown partition.
    with (
        Reader(redis_server.url) as reader,
        pytest.raises(OptionError, match="name the partitions with the assign option"),
    ):
        partitions_of(reader, f"t-{uuid.uuid4().hex[:6]}")


def test_a_small_partition_is_not_starved_by_a_large_backlog() -> None:
    """maxOffsetsPerTrigger=1000; partition 0 has a backlog of a million records and gets
    1000 new ones a trigger, partition 1 has 5 waiting. spark-sql-kafka gives a partition
    whose share rounds below one record one record; shares rounded down gave partition 1
    nothing for as long as partition 0's backlog lasted (found in review)."""
    budget = 1000
    start = {("t", 0): 0, ("t", 1): 0}
    heads = {("t", 0): 1_000_000, ("t", 1): 5}
    for _ in range(5):
        end = limit_offsets(start, heads, budget)
        assert sum(end[tp] - start[tp] for tp in heads) <= budget
        start = end
        heads = {("t", 0): heads[("t", 0)] + budget, ("t", 1): 5}
    assert start[("t", 1)] == 5, f"partition 1 starved: offsets after 5 triggers {start}"


@pytest.mark.parametrize("text", ["nan", "inf", "-5", "0"])
def test_flush_timeout_must_be_positive_seconds(text: str) -> None:
    """nan and inf failed every task later (`cannot convert float NaN to integer`, no
    option named); 0 or less made DUMP answer at once and the writes fail with
    FlushTimeout (found in review)."""
    from pyspark.sql.types import StringType, StructField, StructType
    from rafka_spark.writer import WriterOptions

    schema = StructType([StructField("value", StringType())])
    with pytest.raises(OptionError, match="flushTimeout"):
        WriterOptions.parse({"topic": "t", "flushTimeout": text}, schema)


@pytest.mark.parametrize("option", ["startingOffsets", "endingOffsets"])
def test_offsets_of_a_topic_not_read_are_refused(option: str) -> None:
    """A typo in the JSON's topic (`flight` for `flights`) was ignored: the query read
    `flights` from its default offset instead (found in review)."""
    with pytest.raises(OptionError, match=f"{option} names topics the query does not read"):
        SourceOptions.parse(
            {"subscribe": "flights", option: '{"flight": {"0": 1000}}'}, stream=False
        )
