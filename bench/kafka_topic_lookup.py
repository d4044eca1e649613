"""What one produce() costs librdkafka as the topics a producer writes grow: records
round-robin over N topics, with no broker (the records wait in the producer's queue, so
only the call is timed), next to N = 1 in the same run.

librdkafka finds a topic's handle by name on every produce, walking the list of every
topic the producer knows: the Kafka engine's RPUSHX over 1,000 topics pays that in its
loop, and a direct confluent-kafka client alike (docs/gateway.md, "What scale costs").
Prints the curve; never fails a build. Usage: `.venv/bin/python bench/kafka_topic_lookup.py
[--records N] [--topics 1,100,1000,3000]`.
"""

from __future__ import annotations

import argparse
import time

from confluent_kafka import Producer

VALUE = b"x" * 100


def per_produce(topics: int, records: int) -> float:
    """Microseconds per produce() over `topics` topics (each known to the producer)."""
    producer = Producer(
        {
            "bootstrap.servers": "127.0.0.1:1",  # nothing listens: nothing is sent
            "queue.buffering.max.messages": records + topics,
            "log_level": 0,
        }
    )
    names = [f"lookup-{n}" for n in range(topics)]
    for name in names:
        producer.produce(name, VALUE)  # every handle made before the clock starts
    produce = producer.produce
    started = time.perf_counter()
    for n in range(records):
        produce(names[n % topics], VALUE)
    elapsed = time.perf_counter() - started
    producer.purge()
    return elapsed / records * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--topics", default="1,100,1000,3000", help="comma-separated")
    args = parser.parse_args()
    counts = [int(count) for count in args.topics.split(",")]
    reference = per_produce(1, args.records)
    print(f"librdkafka produce() with no broker, {args.records:,} records of 100 bytes")
    print(f"  {1:>6,} topic     {reference:6.2f} us a record   (the reference)")
    for count in counts:
        if count != 1:
            cost = per_produce(count, args.records)
            print(f"  {count:>6,} topics    {cost:6.2f} us a record   x{cost / reference:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
