"""`write_rows`, what every Spark partition of RafkaSink, df.write.format("rafka") and
df.writeStream.format("rafka") runs, against a real gateway: a write whose records were
not delivered fails its task."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rafka_client import ProduceError
from rafka_spark.sink import write_rows

from gateway.runner import ServerThread
from tests.support.engines import FACTORIES
from tests.support.gateway import running


@pytest.fixture
def kafka_gateway(request: pytest.FixtureRequest) -> Iterator[ServerThread]:
    factory = FACTORIES["kafka"](request)
    with running(factory.gateway_config()) as gateway:
        yield gateway
    factory.close()


def test_rows_written_to_a_missing_topic_fail_the_task(kafka_gateway: ServerThread) -> None:
    """On Kafka with a broker that does not create topics, the gateway takes the RPUSHX,
    the delivery fails, and DUMP answers 0 (nothing outstanding): write_rows returned 300
    as if the records were durable, and the Spark job succeeded with its records nowhere
    (found in review)."""
    url = f"redis://127.0.0.1:{kafka_gateway.port}"
    topic = "no-such-topic-spark-sink"
    rows = [{"value": f"v{n}"} for n in range(300)]
    with pytest.raises(ProduceError, match=f"topic '{topic}' does not exist"):
        write_rows(rows, url=url, topic=topic, flush_timeout=10.0)
