"""The cost of the metrics endpoint on the command path (per-command latency histograms).

Two gateways on the in-memory engine in this process, one with `metrics_port` set and one
without; redis-benchmark (50 clients, pipelines of 16) runs PING and RPUSHX against each
in turn, alternating, --runs times; medians and the ratio on/off, of the throughput and of
the event loop thread's CPU time per command (its minimum too: the least disturbed run).
A scrape every 0.5 s runs meanwhile against the gateway with metrics (as Prometheus would,
more often). Also the cost of one observation (a clock read, a lookup, a bucket) alone,
with timeit.

Usage: `.venv/bin/python bench/metrics_cost.py [--runs N] [--requests N]`. Prints
figures; never passes or fails anything.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import timeit
import urllib.request
from pathlib import Path
from time import perf_counter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support, as run.py

from backends.registry import ENGINES, EngineEntry
from gateway.commands import COMMANDS
from gateway.latency import CommandLatency
from gateway.runner import ServerThread
from tests.support.engines import MemoryEngineFactory
from tests.support.redis_server import redis_benchmark


async def _loop_thread() -> int:
    return threading.get_ident()


def cpu_clock(server: ServerThread) -> int:
    """The CPU-time clock of the thread that runs the gateway's event loop."""
    return time.pthread_getcpuclockid(server.call(_loop_thread()))


def observation_cost() -> float:
    """Seconds per observation as the connection makes it."""
    latency = CommandLatency(COMMANDS)
    started = [perf_counter()]

    def observe() -> None:
        now = perf_counter()
        latency.observe(b"RPUSHX", now - started[0])
        started[0] = now

    def nothing() -> None:
        pass

    number = 50_000
    base = min(timeit.repeat(nothing, number=number, repeat=15))
    return (min(timeit.repeat(observe, number=number, repeat=15)) - base) / number


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--requests", type=int, default=200_000)
    args = parser.parse_args()
    ENGINES["memory"] = EngineEntry("memory", "tests.support.memory_engine")
    factory = MemoryEngineFactory()
    topic = factory.new_topic(4)
    off = ServerThread(factory.gateway_config()).start()
    on = ServerThread(factory.gateway_config(metrics_port=0)).start()
    assert on.server.metrics is not None
    url = f"http://127.0.0.1:{on.server.metrics.port}/metrics"
    stop = threading.Event()

    def scrape_every_half_second() -> None:
        while not stop.wait(0.5):
            urllib.request.urlopen(url, timeout=10).read()

    scraper = threading.Thread(target=scrape_every_half_second)
    scraper.start()
    try:
        print(f"one observation alone: {observation_cost() * 1e9:.0f} ns")
        commands = {"PING": ("PING",), "RPUSHX": ("RPUSHX", f"topics:{topic}", "x" * 100)}
        clocks = {"off": cpu_clock(off), "on": cpu_clock(on)}
        for name, command in commands.items():
            figures: dict[str, list[float]] = {"off": [], "on": []}
            # The event loop's CPU time per command, µs: less sensitive than throughput to
            # the other processes of a shared machine.
            cpu: dict[str, list[float]] = {"off": [], "on": []}
            for _ in range(args.runs):
                for label, server in (("off", off), ("on", on)):
                    before = time.clock_gettime(clocks[label])
                    figures[label].append(
                        redis_benchmark(server.port, args.requests, "-P", "16", *command)
                    )
                    used = time.clock_gettime(clocks[label]) - before
                    cpu[label].append(used / args.requests * 1e6)
            median_off = statistics.median(figures["off"])
            median_on = statistics.median(figures["on"])
            cpu_off, cpu_on = statistics.median(cpu["off"]), statistics.median(cpu["on"])
            print(
                f"{name:<8} metrics off {median_off:>10,.0f}/s   on {median_on:>10,.0f}/s   "
                f"ratio on/off {median_on / median_off:.3f}   "
                f"(runs off {[round(f) for f in figures['off']]}, "
                f"on {[round(f) for f in figures['on']]})\n"
                f"{name:<8} event-loop CPU per command: off {cpu_off:.2f} µs, on {cpu_on:.2f} µs, "
                f"ratio on/off {cpu_on / cpu_off:.3f}; min off {min(cpu['off']):.2f} µs, "
                f"on {min(cpu['on']):.2f} µs "
                f"(runs off {[round(c, 2) for c in cpu['off']]}, "
                f"on {[round(c, 2) for c in cpu['on']]})",
                flush=True,
            )
    finally:
        stop.set()
        scraper.join()
        on.stop()
        off.stop()
        factory.close()


if __name__ == "__main__":
    main()
