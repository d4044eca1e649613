"""What the Dafka engine's producing side costs the event loop per record, for a pipeline
round-robin over 1, 100 and 1,000 topics: the two steps the gateway's loop runs for each
read of RPUSHX, timed apart from everything else the loop does.

1. `Producer.produce_grouped`: the pipeline's values gathered by topic (one run per
   topic, as `gateway/commands/produce.py` hands them over), queued on their writers;
2. the end of the loop's pass: every writer's records to the actor in one hand-over,
   and to this gateway's groups in process (`producing.Handover`).

One engine (embedded tower and store, as `rafka` starts it), one group joined on every
topic (so the in-process delivery runs as it does under BLPOP). Each step is timed in
each pass of 1,000 records; the figures are the best pass and the median one, in µs per
record, next to the one-topic figures of the same run. The best pass is the least
disturbed by the actor and the store, which share the machine and the GIL.

Usage: `.venv/bin/python bench/dafka_pass_cost.py [--records 200000]`. Prints figures;
never fails on them.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backends.base import Engine, Run, Stats
from backends.dafka.engine import DafkaEngine
from backends.registry import engine_entry
from gateway.config import from_dict
from gateway.loops import loop_factory
from tests.support.consuming import consume

PIPELINE = 1000  # records a pass (bench/growth.py's pipeline)
VALUE = b"x" * 100
WAIT = 30.0  # seconds for the warm-up records to be stored and for room in the queue


def pipeline_runs(topics: list[str]) -> list[Run]:
    """A pipeline of PIPELINE values round-robin over `topics`, gathered by topic."""
    values: dict[str, list[bytes]] = {}
    for i in range(PIPELINE):
        values.setdefault(topics[i % len(topics)], []).append(VALUE)
    return [(topic, None, held) for topic, held in values.items()]


async def shape(engine: DafkaEngine, prefix: str, count: int, records: int) -> list[float]:
    """Per-record µs of both steps, best and median pass: [grouped, grouped median,
    hand-over, hand-over median]."""
    topics = [f"{prefix}-{i}" for i in range(count)]
    warm = engine.producer(f"{prefix}-warm")
    for topic in topics:
        warm.produce(topic, None, b"warm-up")
    if await warm.flush(WAIT):
        raise RuntimeError("warm-up records not durable")
    await warm.close(1)
    consumer = await engine.consumer(f"{prefix}-group", "c", topics, {})
    await consume(consumer, len(topics))  # the warm-up records: every partition started

    handover = engine.handover
    end_of_pass: Callable[[], None] = handover._end_of_pass
    handed: list[float] = []

    def timed_end_of_pass() -> None:
        full = len(handover._writers) >= max(1, len(topics) - 1)  # a pass of the pipeline's
        started = time.perf_counter()
        end_of_pass()
        if full:
            handed.append(time.perf_counter() - started)

    handover._end_of_pass = timed_end_of_pass  # type: ignore[method-assign]
    grouped: list[float] = []
    producer = engine.producer(f"{prefix}-s")
    runs = pipeline_runs(topics)
    try:
        for _ in range(records // PIPELINE):
            while True:
                batch = [(topic, key, list(values)) for topic, key, values in runs]
                started = time.perf_counter()
                taken = producer.produce_grouped(batch)
                if taken:
                    grouped.append(time.perf_counter() - started)
                    break
                await producer.wait_for_room(WAIT)  # the queue is full: as the gateway waits
            await asyncio.sleep(0)  # the pass ends
        if await producer.flush(120):
            raise RuntimeError("records not durable after flush")
    finally:
        handover._end_of_pass = end_of_pass  # type: ignore[method-assign]
        await producer.close(1)
        await consumer.close()
    each = 1e6 / PIPELINE
    return [
        min(grouped) * each,
        statistics.median(grouped) * each,
        min(handed) * each if handed else float("nan"),
        statistics.median(handed) * each if handed else float("nan"),
    ]


async def run(records: int) -> None:
    with tempfile.TemporaryDirectory() as data_dir:
        config = from_dict({"dafka": {"partitions": 1}}, data_dir=data_dir)
        entry = engine_entry(config.engine)
        engine: Engine = entry.create(config.engine_settings, Stats(), config.engine_options())
        assert isinstance(engine, DafkaEngine)
        await engine.start()
        try:
            print(f"Dafka engine, {records:,} records a shape, passes of {PIPELINE:,}")
            print("  µs per record, and the ratio to 1 topic:")
            print("  topics   produce_grouped: best      median    hand-over: best       median")
            first: list[float] = []
            for count in (1, 100, 1000):
                figures = await shape(engine, f"pass{count}", count, records)
                first = first or figures
                cells = "".join(
                    f"{value:6.2f} {value / base:6.2f}x"
                    for value, base in zip(figures, first, strict=True)
                )
                print(f"  {count:>6}             {cells}")
        finally:
            await engine.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000, help="per shape")
    args = parser.parse_args()
    with asyncio.Runner(loop_factory=loop_factory("uvloop")) as runner:
        runner.run(run(args.records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
