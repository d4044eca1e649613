"""Where a Kafka gateway's CPU goes, thread by thread, under redis-benchmark RPUSHX (50
clients): each thread of `rafka` (its event loop, librdkafka's) and of the Tansu broker it
produces to, with its user and system CPU per command, from /proc. The Kafka counterpart
of bench/thread_cpu.sh; never fails a build, a measuring aid.

Usage: `.venv/bin/python bench/kafka_thread_cpu.py PIPELINE COMMANDS [--linger-ms N]`
(e.g. `1 200000`: Rafka's test configuration, queue.buffering.max.ms 0, unless set).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from run import kafka_config

from tests.support.processes import thread_cpu
from tests.support.rafka_process import RafkaProcess
from tests.support.tansu import TansuBroker

# (pid, thread id) -> (thread name, user CPU seconds, system CPU seconds)
Snapshot = dict[tuple[int, int], tuple[str, float, float]]


def snapshot(pids: list[int]) -> Snapshot:
    return {(pid, tid): cpu for pid in pids for tid, cpu in thread_cpu(pid).items()}


def benchmark(port: int, key: str, pipeline: int, commands: int) -> str:
    done = subprocess.run(
        [
            *("redis-benchmark", "-p", str(port), "-c", "50", "-n", str(commands)),
            *("-P", str(pipeline), "-q", "RPUSHX", key, "v"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.replace("\r", "\n").strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pipeline", type=int)
    parser.add_argument("commands", type=int)
    parser.add_argument("--linger-ms", type=int, default=None)
    args = parser.parse_args()
    with TansuBroker() as broker, tempfile.TemporaryDirectory() as scratch:
        config = Path(scratch) / "librdkafka.json"
        config.write_text(json.dumps(kafka_config(broker.bootstrap, args.linger_ms)))
        gateway = RafkaProcess(config, None, "--event-loop", "uvloop")
        gateway.start()
        try:
            key = f"topics:{broker.create_topic(4)}"
            benchmark(gateway.port, key, args.pipeline, 20_000)  # warm-up
            assert gateway.child is not None
            pids = [gateway.child.pid, broker.pid]
            before = snapshot(pids)
            print(benchmark(gateway.port, key, args.pipeline, args.commands))
            after = snapshot(pids)
        finally:
            gateway.terminate()
    total = 0.0
    for (pid, thread), (name, user, system) in after.items():
        if (pid, thread) not in before:
            continue
        _, user_before, system_before = before[(pid, thread)]
        scale = 1e6 / args.commands
        du, ds = (user - user_before) * scale, (system - system_before) * scale
        total += du + ds
        if du + ds >= 0.05:
            owner = "rafka" if pid == pids[0] else "tansu"
            print(f"{owner:6} {thread:>8} {name:16} user {du:6.2f}  sys {ds:6.2f} us/cmd")
    print(f"all threads: {total:.2f} us/cmd")


if __name__ == "__main__":
    main()
