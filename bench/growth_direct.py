"""The growth bench's reference on the Kafka engine: a direct confluent-kafka client in
the same shape as the gateway's (bench/growth.py), so that each drop of the gateway's
curve can be told apart from the broker's and librdkafka's own.

Run by bench/growth.py as a process of its own (its RSS is the direct client's, as the
gateway's is the `rafka` process's); prints one JSON object. Same steps as the gateway's:
1. one warm-up record per topic, flushed; every group's consumer subscribes to every
   topic and reads its warm-up records (set-up, not timed);
2. produce: --records records of 100 bytes, round-robin over the topics, then flush;
3. consume: every group reads --deliveries / groups of them (all at most), the groups at
   once (one thread each, as the gateway's consumers);
4. RSS (VmRSS of this process) with the groups still joined.
The producer and consumers are configured as the gateway's Kafka engine configures its
own (the same document, read by backends/kafka/settings.py): the ratio between the two
curves is then the gateway's cost.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from confluent_kafka import Consumer, Producer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backends.kafka.settings import KafkaSettings, consumer_properties, parse_settings
from backends.settings import json_decoder
from tests.support.connections import rss_bytes
from tests.support.kafka import kafka_document

VALUE = b"x" * 100
WAIT = 30.0  # seconds a consumer may wait for a record before the run fails
FETCH = 500  # records per consume() call: the gateway's default consume_batch


def settings(bootstrap: str, document: str) -> KafkaSettings:
    """The gateway's settings: the tests' Kafka document with `document`'s sections over
    it (as bench/growth.py writes the gateway's configuration file)."""
    base = kafka_document(bootstrap)
    for name, section in json.loads(document).items():
        base.setdefault(name, {}).update(section)
    return parse_settings(json_decoder().decode(json.dumps(base)))


def produce(producer: Producer, topics: Sequence[str], records: int) -> float:
    """Records/s, round-robin over `topics`, until all are delivered."""
    start = time.perf_counter()
    count = len(topics)
    for i in range(records):
        topic = topics[i % count]
        while True:
            try:
                producer.produce(topic, VALUE)
                break
            except BufferError:
                producer.poll(0.01)
    left = producer.flush(120)
    elapsed = time.perf_counter() - start
    if left:
        raise RuntimeError(f"{left} records not delivered")
    return records / elapsed


def read(consumer: Consumer, count: int) -> None:
    """`count` records (not errors) from `consumer`; raises after WAIT s without one."""
    got = 0
    while got < count:
        messages = consumer.consume(num_messages=min(FETCH, count - got), timeout=WAIT)
        if not messages:
            raise RuntimeError(f"a consumer waited {WAIT:g} s for nothing after {got}")
        for message in messages:
            error = message.error()
            if error is None:
                got += 1
            elif not error.retriable() and error.code() >= 0:
                raise RuntimeError(f"consume failed: {error.str()}")


def in_threads(consumers: Sequence[Consumer], count: int) -> None:
    """read(consumer, count) for every consumer at once; the first failure raises."""
    failures: list[BaseException] = []

    def run(consumer: Consumer) -> None:
        try:
            read(consumer, count)
        except BaseException as error:  # reported by the caller
            failures.append(error)

    threads = [threading.Thread(target=run, args=(c,)) for c in consumers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]


def shape(
    config: KafkaSettings,
    topics: Sequence[str],
    groups: int,
    records: int,
    deliveries: int,
) -> Mapping[str, float]:
    started = time.perf_counter()
    producer = Producer(dict(config.producer))
    for topic in topics:
        producer.produce(topic, b"warm-up")
    if producer.flush(120):
        raise RuntimeError("warm-up records not delivered")
    consumers = [
        Consumer({**consumer_properties(config), "group.id": f"growth-{g}", "client.id": "c"})
        for g in range(groups)
    ]
    for consumer in consumers:
        consumer.subscribe(list(topics))
    in_threads(consumers, len(topics))
    setup = time.perf_counter() - started
    produced = produce(producer, topics, records)
    each = min(records, max(1, deliveries // groups))
    start = time.perf_counter()
    in_threads(consumers, each)
    consumed = each * groups / (time.perf_counter() - start)
    rss = float(rss_bytes(os.getpid()))
    for consumer in consumers:
        consumer.close()
    return {"produce": produced, "consume": consumed, "rss": rss, "setup": setup}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topics", required=True, help="comma-separated, created already")
    parser.add_argument("--groups", type=int, required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--deliveries", type=int, required=True)
    parser.add_argument(
        "--document", default="{}", help="JSON sections over the tests' Kafka document"
    )
    args = parser.parse_args()
    config = settings(args.bootstrap, args.document)
    figures = shape(config, args.topics.split(","), args.groups, args.records, args.deliveries)
    print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
