"""HTTP push subscriptions: records delivered per second, next to a reference.

A gateway on the embedded Dafka engine (fresh data directory) with one subscription to a
local threaded HTTP server (tests/support/http_sink.py, 127.0.0.1); COUNT records are
produced first, then the subscription is added (RAFKA.PUSH ADD) and timed until every
record was answered 2xx. The reference, in the same run: the same bodies POSTed to the
same server by a bare aiohttp loop with the same concurrency (no engine, no acks), i.e.
what the HTTP side alone allows.

Prints figures; never passes or fails anything. Usage:
`make bench-push`, or `.venv/bin/python bench/push.py [--count N] [--concurrency C ...]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.config import from_dict
from gateway.runner import ServerThread
from tests.support.http_sink import HttpSink
from tests.support.waiting import wait_until


async def _direct(url: str, count: int, concurrency: int) -> float:
    """Seconds a bare aiohttp loop takes to POST `count` bodies, `concurrency` at once."""
    body = json.dumps({"topic": "t", "partition": 0, "offset": 0, "value": "x" * 100}).encode()
    pending = iter(range(count))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def worker() -> None:
            for _ in pending:
                async with http.post(url, data=body) as response:
                    assert response.status == 200

        started = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for _ in range(concurrency):
                group.create_task(worker())
        return time.perf_counter() - started


def _push(sink: HttpSink, count: int, concurrency: int, data_dir: str) -> float:
    """Seconds from RAFKA.PUSH ADD to `count` records answered 2xx."""
    config = from_dict({"gateway": {"host": "127.0.0.1", "port": 0, "data_dir": data_dir}})
    path = f"/push{concurrency}"
    with ServerThread(config, start_timeout=60) as server:
        c = redis.Redis(port=server.port)
        topic = f"bench-{concurrency}"
        for start in range(0, count, 500):
            values = [b"x" * 100] * min(500, count - start)
            for part in range(4):
                c.execute_command("RPUSHX", f"topics:{topic}:k{part}", *values[part::4])
        assert c.execute_command("DUMP", 30_000) == 0
        hook = {"name": "b", "topic": topic, "group": "bench", "urls": [sink.url(path)]}
        started = time.perf_counter()
        c.execute_command("RAFKA.PUSH", "ADD", json.dumps({**hook, "concurrency": concurrency}))
        wait_until(lambda: len(sink.delivered(path)) >= count, 600, f"{count} delivered")
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()
    with HttpSink() as sink, tempfile.TemporaryDirectory() as tmp:
        print(f"{args.count} records of 100 bytes, 4 partitions, one URL on 127.0.0.1")
        for concurrency in args.concurrency:
            direct = asyncio.run(_direct(sink.url("/direct"), args.count, concurrency))
            pushed = _push(sink, args.count, concurrency, f"{tmp}/c{concurrency}")
            print(
                f"concurrency {concurrency}: push {args.count / pushed:8.0f} rec/s, "
                f"bare aiohttp {args.count / direct:8.0f} POST/s, ratio {direct / pushed:.2f}"
            )


if __name__ == "__main__":
    main()
