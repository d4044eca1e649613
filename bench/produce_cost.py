"""CPU time per record of producing through the gateway on the Kafka engine (Tansu).

Wall-clock rates on a shared 2-core machine move with everyone else's load; the CPU
time each process and thread spends per record moves much less. This script runs one
gateway (`rafka`, Kafka engine) on a Tansu broker, sends pre-encoded pipelined RPUSHX
(1000 commands per pipeline, then DUMP) and prints, per round, the records/s and the
CPU microseconds per record of: the gateway's event-loop thread (which also serves
librdkafka's delivery callbacks), its other Python threads, librdkafka's threads, and
the broker. `--values N` sends N values per RPUSHX instead; `--linger-ms` sets the
producer's `queue.buffering.max.ms` (the tests' configuration has 0).

Usage: `.venv/bin/python bench/produce_cost.py [--rounds 3] [--records 100000]
[--values 1] [--linger-ms MS]`. Prints figures; never fails on them.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import hiredis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.kafka import kafka_document
from tests.support.processes import process_cpu
from tests.support.rafka_process import RafkaProcess
from tests.support.resp import command
from tests.support.tansu import TansuBroker

PIPELINE = 1000  # commands per pipeline
TICKS = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread group of `pid`: the main thread, its other Python threads
    (named like the process), and the others by name (librdkafka's are `rdk:*`)."""
    groups: dict[str, float] = {}
    name_of_process = Path(f"/proc/{pid}/comm").read_text().strip()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        if task.name == str(pid):
            name = "event loop"
        elif name == name_of_process:
            name = "other Python threads"
        elif name.startswith("rdk:"):
            name = "librdkafka"
        groups[name] = groups.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / TICKS
    return groups


def broker_pid(broker: TansuBroker) -> int:
    """The broker's process, found by its listener address on the command line."""
    listener = f"tcp://{broker.bootstrap}".encode()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and listener in (entry / "cmdline").read_bytes():
                return int(entry.name)
        except OSError:  # a process that ended meanwhile
            continue
    raise RuntimeError(f"no process listens on {broker.bootstrap}")


def produce(port: int, topic: str, records: int, values: int) -> float:
    """Records/s of pre-encoded pipelined RPUSHX until DUMP answers 0."""
    key = f"topics:{topic}".encode()
    value = b"x" * 100
    commands = records // values
    chunks = [
        command(b"RPUSHX", key, *[value] * values) * min(PIPELINE, commands - first)
        for first in range(0, commands, PIPELINE)
    ]
    reader = hiredis.Reader()
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:

        def replies(count: int) -> list[object]:
            got: list[object] = []
            while len(got) < count:
                reader.feed(sock.recv(1 << 16))
                while (reply := reader.gets()) is not False:
                    got.append(reply)
            return got

        start = time.perf_counter()
        for chunk in chunks:
            sock.sendall(chunk)
            answers = replies(chunk.count(b"RPUSHX"))
            assert all(answer == values for answer in answers), answers[:3]
        sock.sendall(command(b"DUMP", b"60000"))
        assert replies(1) == [0], "records left after DUMP"
        return commands * values / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--values", type=int, default=1, help="values per RPUSHX")
    parser.add_argument("--linger-ms", type=int, help="producer queue.buffering.max.ms")
    args = parser.parse_args()
    with TansuBroker() as broker, tempfile.TemporaryDirectory() as scratch:
        document = kafka_document(broker.bootstrap)
        if args.linger_ms is not None:
            document["producer"]["queue.buffering.max.ms"] = args.linger_ms
        config = Path(scratch) / "librdkafka.json"
        config.write_text(json.dumps(document))
        gateway = RafkaProcess(config)
        gateway.start()
        try:
            assert gateway.child is not None
            pid, tansu = gateway.child.popen.pid, broker_pid(broker)
            produce(gateway.port, broker.create_topic(4), 2000, args.values)  # warm-up
            linger = document["producer"]["queue.buffering.max.ms"]
            print(
                f"pre-encoded RPUSHX, {args.values} value(s) of 100 bytes each, "
                f"{PIPELINE} per pipeline; queue.buffering.max.ms {linger}; "
                "CPU microseconds per record:"
            )
            for _ in range(args.rounds):
                topic = broker.create_topic(4)
                before, broker_before = thread_cpu(pid), process_cpu(tansu)
                rate = produce(gateway.port, topic, args.records, args.values)
                after, broker_after = thread_cpu(pid), process_cpu(tansu)
                per = 1e6 / args.records
                threads = ", ".join(
                    f"{name} {(after[name] - before.get(name, 0.0)) * per:.2f}"
                    for name in sorted(after)
                )
                print(
                    f"  {rate:>9,.0f} records/s   gateway: {threads}   "
                    f"broker: {(broker_after - broker_before) * per:.2f}",
                    flush=True,
                )
        finally:
            gateway.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
