"""Gateway benchmark: figures next to references measured in the same run.

1. redis-benchmark RPUSHX (50 clients, without and with -P 16) against the rafka gateway
   and against a redis-server: the cost of the RESP front.
2. Produce and consume through the gateway against a direct confluent-kafka client on the
   same Tansu broker: the cost of the gateway on the Kafka path.

Prints figures and ratios; never passes or fails anything. Usage: `make bench`, or
`.venv/bin/python bench/run.py [--records N]`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
from confluent_kafka import Consumer, Producer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backends.kafka.settings import KafkaSettings, parse_settings
from backends.settings import json_decoder
from tests.support.kafka import kafka_document
from tests.support.rafka_process import RafkaProcess, write_config
from tests.support.tansu import TansuBroker, free_port
from tests.support.waiting import wait_until

VALUE = "x" * 100


def redis_benchmark(port: int, key: str, requests: int, pipeline: int) -> float:
    """Requests per second of `RPUSHX <key> <100 bytes>` with 50 clients."""
    output = subprocess.run(
        [
            "redis-benchmark",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-c",
            "50",
            "-n",
            str(requests),
            "-P",
            str(pipeline),
            "-q",
            "--csv",
            "RPUSHX",
            key,
            VALUE,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    last = [line for line in output.splitlines() if line.startswith('"RPUSHX')][-1]
    return float(last.split(",")[1].strip('"'))


def start_redis_server() -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    server = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    wait_until(lambda: _pings(client), 10, "redis-server did not start")
    client.rpush("topics:bench", "seed")  # so that RPUSHX really appends
    return server, port


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def gateway_produce(port: int, topic: str, records: int, batch: int) -> float:
    client = redis.Redis(port=port)
    start = time.perf_counter()
    pipe = client.pipeline(transaction=False)
    for i in range(records):
        pipe.rpushx(f"topics:{topic}", VALUE)
        if (i + 1) % batch == 0:
            pipe.execute()
    pipe.execute()
    left = client.execute_command("DUMP", "60000")
    elapsed = time.perf_counter() - start
    assert left == 0, f"{left} records not delivered"
    client.close()
    return records / elapsed


def gateway_produce_multi(port: int, topic: str, records: int, per_command: int) -> float:
    client = redis.Redis(port=port)
    start = time.perf_counter()
    for _ in range(records // per_command):
        client.execute_command("RPUSHX", f"topics:{topic}", *([VALUE] * per_command))
    left = client.execute_command("DUMP", "60000")
    elapsed = time.perf_counter() - start
    assert left == 0, f"{left} records not delivered"
    client.close()
    return records / elapsed


def gateway_properties(bootstrap: str) -> KafkaSettings:
    """The librdkafka properties of the gateway under test, as its Kafka engine reads them
    from the configuration file: the direct clients are configured exactly as the
    gateway's, so the ratio is the gateway's cost."""
    return parse_settings(json_decoder().decode(json.dumps(kafka_document(bootstrap))))


def direct_produce(bootstrap: str, topic: str, records: int) -> float:
    producer = Producer(dict(gateway_properties(bootstrap).producer))
    start = time.perf_counter()
    for _ in range(records):
        while True:
            try:
                producer.produce(topic, VALUE.encode())
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    left = producer.flush(60)
    elapsed = time.perf_counter() - start
    assert left == 0
    return records / elapsed


def gateway_consume(port: int, topic: str, records: int) -> float:
    client = redis.Redis(port=port, client_name=f"bench:{topic}")
    first = client.blpop([f"topics:{topic}"], timeout=30)  # group join not timed
    assert first is not None, "gateway consumer got nothing"
    start = time.perf_counter()
    for _ in range(records - 1):
        assert client.blpop([f"topics:{topic}"], timeout=30) is not None
    elapsed = time.perf_counter() - start
    client.close()
    return (records - 1) / elapsed


def direct_consume(bootstrap: str, topic: str, records: int) -> float:
    consumer = Consumer({**gateway_properties(bootstrap).consumer, "group.id": f"direct-{topic}"})
    consumer.subscribe([topic])
    first = None
    while first is None:
        first = consumer.poll(1.0)
    start = time.perf_counter()
    got = 1
    while got < records:
        got += len(consumer.consume(num_messages=1000, timeout=1.0))
    elapsed = time.perf_counter() - start
    consumer.close()
    return (records - 1) / elapsed


def wait_delivered(port: int, timeout: float = 120) -> None:
    """Wait until the gateway's producer has delivered everything produced so far.

    redis-benchmark leaves records queued in librdkafka when it disconnects; timing the
    next test on top of that backlog measured the backlog (or failed with `PROD Local:
    Queue full`).
    """
    client = redis.Redis(port=port)

    def delivered() -> bool:
        stats = client.hgetall("stats")
        done = int(stats[b"producer.delivered.messages"])
        done += int(stats[b"producer.delivery.errors"])
        return done >= int(stats[b"producer.produced.messages"])

    wait_until(delivered, timeout, "the gateway to deliver the records already produced")
    client.close()


def row(name: str, ours: float, reference: float, reference_name: str) -> None:
    print(
        f"{name:<44} {ours:>12,.0f}/s   {reference_name:<22} {reference:>12,.0f}/s"
        f"   ratio {ours / reference:5.2f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--consume-records", type=int, default=10_000)
    args = parser.parse_args()

    with TansuBroker() as broker, tempfile.TemporaryDirectory() as scratch:
        gateway = RafkaProcess(write_config(Path(scratch) / "librdkafka.json", broker.bootstrap))
        gateway.start()
        redis_server, redis_port = start_redis_server()
        try:
            # The producer refuses unknown topics (as Rafka's tests require): create it,
            # and warm the gateway's producer up so the first timed request is not a cold one.
            bench_topic = broker.create_topic(4)
            subprocess.run(
                [
                    "redis-cli",
                    "-p",
                    str(gateway.port),
                    "RPUSHX",
                    f"topics:{bench_topic}",
                    "warm-up",
                ],
                check=True,
                capture_output=True,
            )
            print(
                f"rafka gateway on :{gateway.port}, redis-server on :{redis_port}, "
                f"Tansu on {broker.bootstrap}; {args.records} records of 100 bytes\n"
            )
            print("RESP front: redis-benchmark RPUSHX, 50 clients")
            for pipeline in (1, 16):
                ours = redis_benchmark(
                    gateway.port, f"topics:{bench_topic}", args.records, pipeline
                )
                reference = redis_benchmark(redis_port, "topics:bench", args.records, pipeline)
                row(f"  gateway -P {pipeline}", ours, reference, "redis-server")
                wait_delivered(gateway.port)

            print("\nKafka path: records/s, gateway vs direct confluent-kafka")
            topic_a = broker.create_topic(4)
            topic_b = broker.create_topic(4)
            topic_c = broker.create_topic(4)
            direct = direct_produce(broker.bootstrap, topic_b, args.records)
            row(
                "  produce, pipelined RPUSHX (1000/batch)",
                gateway_produce(gateway.port, topic_a, args.records, 1000),
                direct,
                "direct producer",
            )
            row(
                "  produce, RPUSHX with 100 values",
                gateway_produce_multi(gateway.port, topic_c, args.records, 100),
                direct,
                "direct producer",
            )
            consume_direct = direct_consume(broker.bootstrap, topic_b, args.consume_records)
            row(
                "  consume, BLPOP one record per call",
                gateway_consume(gateway.port, topic_a, args.consume_records),
                consume_direct,
                "direct consumer",
            )
        finally:
            redis_server.terminate()
            redis_server.wait()
            gateway.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
