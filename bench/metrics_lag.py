"""How long a scrape of the metrics endpoint takes to read consumer lag, by topic count.

A real `rafka` process on the embedded Dafka engine (a data directory of its own, in a
temporary directory), --topics topics of 3 records each, one group that consumed and
acked one record of each; then --scrapes scrapes, each printing its time and the
`rafka_consumer_lag_collect_seconds` it reports. Prints figures; never passes or fails.

Usage: `.venv/bin/python bench/metrics_lag.py [--topics N] [--scrapes N]`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support, as run.py

from tests.support.metrics import scrape
from tests.support.rafka_process import RafkaProcess
from tests.support.tansu import free_port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=20)
    parser.add_argument("--scrapes", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        document = {
            "gateway": {"data_dir": str(Path(tmp) / "data"), "metrics_lag_timeout": 120},
            "dafka": {"commit_interval": 0.2},
        }
        config = Path(tmp) / "rafka.json"
        config.write_text(json.dumps(document))
        metrics_port = free_port()
        server = RafkaProcess(config, None, "--metrics-port", str(metrics_port))
        server.start()
        try:
            client = redis.Redis(port=server.port, socket_timeout=30)
            for index in range(args.topics):
                client.execute_command("RPUSHX", f"topics:t{index}", "a", "b", "c")
            assert client.execute_command("DUMP", "10000") == 0
            client.close()
            for index in range(args.topics):
                consumer = redis.Redis(port=server.port, socket_timeout=30, client_name="g:c")
                reply = consumer.blpop([f"topics:t{index}"], 10)
                assert reply is not None, f"nothing consumed from t{index}"
                fields = dict(zip(reply[::2], reply[1::2], strict=True))
                ack = f"t{index}:{int(fields[b'partition'])}:{int(fields[b'offset'])}"
                consumer.execute_command("RPUSH", "acks", ack)
                consumer.execute_command("QUIT")  # commits
                consumer.close()
            for _ in range(args.scrapes):
                started = time.monotonic()
                metrics = scrape(metrics_port, timeout=180)
                print(
                    f"{args.topics} topics: scrape {time.monotonic() - started:.2f} s, lag read "
                    f"in {metrics.value('rafka_consumer_lag_collect_seconds') or 0:.2f} s, "
                    f"{len(metrics.labelled('rafka_consumer_lag'))} lag series",
                    flush=True,
                )
        finally:
            server.kill()


if __name__ == "__main__":
    main()
