"""Instructions per consumed record on the Kafka engine: the gateway vs a direct consumer.

Wall-clock rates on a shared 2-core machine swing by a factor of several from run to run;
instruction counts (valgrind's callgrind) do not. On one Tansu broker and one topic
filled beforehand:
- the gateway (`rafka`, from `--tree`, default this checkout) runs under callgrind; a
  pre-encoded client takes the first record with BLMPOP (the group join), the counters
  are zeroed, the client drains `--records` with `BLMPOP ... COUNT --count`, and the
  counters are dumped: the gateway's instructions for exactly those records;
- the bench's direct confluent-kafka consumer (bench/run.py: each record's error,
  partition, offset and value read) runs under callgrind the same way, zeroed after its
  first record and a second of prefetch.
Prints instructions per record for each, and their ratio. `--tree /path/to/other/checkout`
measures another version of the gateway (e.g. before a change) with the same client.
Usage: `.venv/bin/python bench/consume_instructions.py [--records N] [--tree DIR]`.
"""

from __future__ import annotations

import argparse
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import RawClient, batch_positions, fill_topic

from backends.process import spawn
from tests.support.child_process import run_to_end
from tests.support.rafka_process import write_config
from tests.support.tansu import TansuBroker, free_port
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parent.parent
STARTUP = 600.0  # seconds rafka may take to listen under valgrind on a loaded machine

# Run under callgrind by the direct consumer measurement: argv bootstrap, topic, records.
DIRECT = """
import os, subprocess, sys, time
from confluent_kafka import Consumer, KafkaError
sys.path.insert(0, {bench!r})
from run import gateway_properties
from backends.kafka.settings import consumer_properties
bootstrap, topic, records = sys.argv[1], sys.argv[2], int(sys.argv[3])
properties = consumer_properties(gateway_properties(bootstrap))
consumer = Consumer({{**properties, "group.id": "instructions"}})
consumer.subscribe([topic])
got = []
def take(messages):
    for message in messages:
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                continue
            raise RuntimeError(error.str())
        len(message.value())
        got.append((message.partition(), message.offset()))
while not got:
    first = consumer.poll(1.0)
    if first is not None:
        take([first])
time.sleep(1.0)
subprocess.run(["callgrind_control", "-z", str(os.getpid())], check=True, capture_output=True)
while len(got) < records + 1:
    take(consumer.consume(num_messages=min(1000, records + 1 - len(got)), timeout=1.0))
subprocess.run(["callgrind_control", "-d", str(os.getpid())], check=True, capture_output=True)
assert len(set(got)) == records + 1, "records lost or twice"
consumer.close()
"""


def total(dump: Path) -> int:
    """The instructions of a callgrind dump."""
    for line in dump.read_text().splitlines():
        if match := re.match(r"(?:summary|totals): (\d+)", line):
            return int(match.group(1))
    raise RuntimeError(f"no totals in {dump}")


def callgrind(out: Path) -> list[str]:
    return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]


def gateway(tree: Path, bootstrap: str, topic: str, records: int, count: int, out: Path) -> int:
    """The gateway's instructions for `records` records taken with BLMPOP COUNT `count`."""
    config = write_config(out.parent / "rafka.json", bootstrap)
    port = free_port()
    main = "import sys; from gateway.cli import main; sys.exit(main())"
    rafka = ["-c", str(config), "-p", str(port), "--host", "127.0.0.1"]
    # Through backends.process: it dies with this bench, even a SIGKILLed one.
    process = spawn(
        [*callgrind(out), sys.executable, "-c", main, *rafka],
        name="rafka under callgrind",
        cwd=tree,
        env={"PYTHONPATH": str(tree)},
    )
    try:

        def listening() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                return False
            return True

        wait_until(listening, STARTUP, "rafka under valgrind to listen")
        key = f"topics:{topic}".encode()
        client = RawClient(port, "instructions:bench")
        client.sock.settimeout(STARTUP)
        got: list[tuple[int, int]] = []
        batch_positions(client.call(b"BLMPOP", b"300", b"1", key, b"LEFT", b"COUNT", b"1"), got)
        control = ["callgrind_control", "-z", str(process.pid)]
        subprocess.run(control, check=True, capture_output=True)
        command = [b"BLMPOP", b"300", b"1", key, b"LEFT", b"COUNT", str(count).encode()]
        while len(got) < records + 1:
            batch_positions(client.call(*command), got)
        control[1] = "-d"
        subprocess.run(control, check=True, capture_output=True)
        client.close()
        assert len(set(got)) == len(got), "a record came twice"
        return total(Path(f"{out}.1")) // (len(got) - 1)
    finally:
        process.stop(120)  # SIGTERM, then SIGKILL after 120 s


def direct(bootstrap: str, topic: str, records: int, out: Path) -> int:
    """The direct consumer's instructions per record."""
    script = out.parent / "direct.py"
    script.write_text(DIRECT.format(bench=str(REPO / "bench")))
    run_to_end(
        [*callgrind(out), sys.executable, str(script), bootstrap, topic, str(records)],
        STARTUP,
        name="direct consumer under callgrind",
    )
    return total(Path(f"{out}.1")) // records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000, help="records measured")
    parser.add_argument("--count", type=int, default=500, help="BLMPOP's COUNT")
    parser.add_argument("--tree", type=Path, default=REPO, help="the checkout rafka runs from")
    args = parser.parse_args()
    with TansuBroker() as broker, tempfile.TemporaryDirectory() as scratch:
        topic = broker.create_topic(4)
        fill_topic(broker.bootstrap, topic, args.records + 1)
        ours = gateway(
            args.tree.resolve(),
            broker.bootstrap,
            topic,
            args.records,
            args.count,
            Path(scratch) / "gateway.out",
        )
        theirs = direct(broker.bootstrap, topic, args.records, Path(scratch) / "direct.out")
    print(f"gateway ({args.tree}), BLMPOP COUNT {args.count}: {ours:,} instructions/record")
    print(f"direct confluent-kafka consumer: {theirs:,} instructions/record")
    print(f"gateway / direct: {ours / theirs:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
