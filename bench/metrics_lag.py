"""How long a scrape of the metrics endpoint takes to read consumer lag, by topic count.

A real `rafka` process on the embedded Dafka engine (a data directory of its own, in a
temporary directory; or with --engine kafka, on a Tansu broker of its own), --topics
topics of 3 records each, one group that consumed and acked one record of each; then
--scrapes scrapes, each printing its time and the `rafka_consumer_lag_collect_seconds` it
reports. Prints figures; never passes or fails.

Usage: `.venv/bin/python bench/metrics_lag.py [--engine dafka|kafka] [--topics N]
[--scrapes N]`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import redis

from backends.ports import free_port

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support, as run.py

from tests.support.kafka import kafka_document
from tests.support.metrics import scrape
from tests.support.rafka_process import RafkaProcess
from tests.support.tansu import TansuBroker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("dafka", "kafka"), default="dafka")
    parser.add_argument("--topics", type=int, default=20)
    parser.add_argument("--scrapes", type=int, default=3)
    args = parser.parse_args()
    with ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        document: dict[str, Any]
        if args.engine == "kafka":
            broker = stack.enter_context(TansuBroker())
            document = {**kafka_document(broker.bootstrap), "gateway": {"engine": "kafka"}}
            names = [broker.create_topic(1) for _ in range(args.topics)]
        else:
            document = {"gateway": {"data_dir": str(Path(tmp) / "data")}}
            document["dafka"] = {"commit_interval": 0.2}
            names = [f"t{index}" for index in range(args.topics)]
        document["gateway"]["metrics_lag_timeout"] = 120
        config = Path(tmp) / "rafka.json"
        config.write_text(json.dumps(document))
        metrics_port = free_port()
        server = RafkaProcess(config, None, "--metrics-port", str(metrics_port))
        server.start()
        try:
            client = redis.Redis(port=server.port, socket_timeout=30)
            for name in names:
                client.execute_command("RPUSHX", f"topics:{name}", "a", "b", "c")
            assert client.execute_command("DUMP", "10000") == 0
            client.close()
            for name in names:
                consumer = redis.Redis(port=server.port, socket_timeout=30, client_name="g:c")
                reply = None
                for _ in range(10):  # the first BLPOPs may time out while the group forms
                    reply = reply or consumer.blpop([f"topics:{name}"], 5)
                assert reply is not None, f"nothing consumed from {name}"
                fields = dict(zip(reply[::2], reply[1::2], strict=True))
                ack = f"{name}:{int(fields[b'partition'])}:{int(fields[b'offset'])}"
                consumer.execute_command("RPUSH", "acks", ack)
                consumer.execute_command("QUIT")  # commits
                consumer.close()
            for _ in range(args.scrapes):
                started = time.monotonic()
                metrics = scrape(metrics_port, timeout=180)
                took = time.monotonic() - started
                lag_read = metrics.value("rafka_consumer_lag_collect_seconds") or 0
                series = len(metrics.labelled("rafka_consumer_lag"))
                print(
                    f"{args.engine}, {args.topics} topics: scrape {took:.2f} s, lag read in "
                    f"{lag_read:.2f} s, {series} lag series",
                    flush=True,
                )
        finally:
            server.kill()


if __name__ == "__main__":
    main()
