"""The growth bench's reference on the Dafka engine: the engine's Python interface
(backends/base.py, as the gateway calls it) driven directly in the same shape as the
gateway's (bench/growth.py), without the RESP front, so that each drop of the gateway's
curve can be told apart from the engine's own.

Run by bench/growth.py as a process of its own on a fresh data directory (its own
embedded tower and stores, as a fresh gateway has); prints one JSON object. The engine is
made as the gateway makes it (gateway.config from the same document, the same event
loop), and the steps are the gateway's:
1. one warm-up record per topic, flushed; every group's consumer joins on every topic
   and reads its warm-up records (set-up, not timed);
2. produce: --records records of 100 bytes, round-robin over the topics, one produce()
   each (what the gateway does for each RPUSHX), a pass of the event loop every 1,000
   (the gateway's pipeline), then flush (DUMP's wait); a record refused with the queue
   full waits for room, as RPUSHX does;
3. consume: every group reads --deliveries / groups of them (all at most), the groups at
   once, one record per call as BLPOP takes it (next_ready(), else next());
4. RSS (VmRSS of this process; the tower and stores are processes of their own and not
   counted, as for the gateway) with the groups still joined, threads, open files, the
   CPU of the child processes, and this process's CPU per record produced and consumed
   (all its threads; the process's clock, not /proc's 10 ms ticks: a short run still
   gets a figure).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backends.base import Consumer, Engine, Producer, QueueFullError, Stats
from backends.registry import engine_entry
from gateway.config import from_dict
from gateway.loops import loop_factory
from tests.support.connections import rss_bytes
from tests.support.processes import children_cpu, threads_and_files

VALUE = b"x" * 100  # bench/growth.py's
PIPELINE = 1000  # records per pass of the event loop (bench/growth.py's RPUSHX pipeline)
WAIT = 30.0  # seconds a consumer may wait for a record before the run fails


async def read(consumer: Consumer, count: int) -> None:
    """`count` records, one call each as BLPOP takes them; raises after WAIT s without one."""
    for got in range(count):
        if consumer.next_ready() is None and await consumer.next(WAIT) is None:
            raise RuntimeError(f"a consumer waited {WAIT:g} s for nothing after {got}")


async def produce_when_room(producer: Producer, topic: str) -> None:
    """Produce one record refused with the queue full (more records than
    `dafka.queue_max_messages` on their way to the stores), once there is room: as the
    gateway's RPUSHX waits (`produce_block_timeout`); raises after WAIT s without room."""
    deadline = time.monotonic() + WAIT
    while True:
        await producer.wait_for_room(deadline - time.monotonic())
        try:
            producer.produce(topic, None, VALUE)
            return
        except QueueFullError:
            if time.monotonic() >= deadline:
                raise


async def shape(
    engine: Engine, topics: Sequence[str], groups: int, records: int, deliveries: int
) -> Mapping[str, float]:
    pid = os.getpid()
    started = time.perf_counter()
    warm = engine.producer("warm-up")
    for topic in topics:
        warm.produce(topic, None, b"warm-up")
    if await warm.flush(120):
        raise RuntimeError("warm-up records not durable")
    await warm.close(1)
    consumers = [await engine.consumer(f"growth-{g}", "c", topics, {}) for g in range(groups)]
    await asyncio.gather(*(read(c, len(topics)) for c in consumers))
    setup = time.perf_counter() - started
    producer = engine.producer("growth")
    produce = producer.produce
    count = len(topics)
    cpu = time.process_time()
    start = time.perf_counter()
    for first in range(0, records, PIPELINE):
        for i in range(first, min(first + PIPELINE, records)):
            try:
                produce(topics[i % count], None, VALUE)
            except QueueFullError:
                await produce_when_room(producer, topics[i % count])
        await asyncio.sleep(0)  # the pass ends: the gateway would read the next pipeline
    left = await producer.flush(120)
    produced = records / (time.perf_counter() - start)
    produce_cpu = (time.process_time() - cpu) * 1e6 / records
    if left:
        raise RuntimeError(f"{left} records not durable after flush")
    each = min(records, max(1, deliveries // groups))
    cpu = time.process_time()
    start = time.perf_counter()
    await asyncio.gather(*(read(c, each) for c in consumers))
    consumed = each * groups / (time.perf_counter() - start)
    consume_cpu = (time.process_time() - cpu) * 1e6 / (each * groups)
    rss = float(rss_bytes(pid))
    threads, files = threads_and_files(pid)
    for consumer in consumers:
        await consumer.close()
    await producer.close(1)
    return {
        "produce": produced,
        "consume": consumed,
        "rss": rss,
        "setup": setup,
        "threads": threads,
        "files": files,
        "children_cpu": children_cpu(pid),
        "produce_cpu": produce_cpu,
        "consume_cpu": consume_cpu,
    }


async def run(document: Mapping[str, object], data_dir: str, args: argparse.Namespace) -> None:
    config = from_dict(document, data_dir=data_dir)
    entry = engine_entry(config.engine)
    engine = entry.create(config.engine_settings, Stats(), config.engine_options())
    await engine.start()
    try:
        topics = args.topics.split(",")
        figures = await shape(engine, topics, args.groups, args.records, args.deliveries)
    finally:
        await engine.stop()
    print(json.dumps(figures), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--document", required=True, help="the gateway's configuration (JSON)")
    parser.add_argument("--data-dir", required=True, help="a fresh directory")
    parser.add_argument("--topics", required=True, help="comma-separated")
    parser.add_argument("--groups", type=int, required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--deliveries", type=int, required=True)
    args = parser.parse_args()
    document = json.loads(args.document)
    event_loop = from_dict(document).event_loop
    with asyncio.Runner(loop_factory=loop_factory(event_loop)) as runner:
        runner.run(run(document, args.data_dir, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
