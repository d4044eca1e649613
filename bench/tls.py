"""TLS overhead on the RESP port: one `rafka` (embedded Dafka engine) listening on a
plaintext port and a TLS port at once, driven by redis-benchmark (50 clients) on each in
turn, so that the ratio compares the same server in the same run:

- PING, one request per round trip, then 16 pipelined: the cost of encryption alone;
- PING with a new connection for every request (`-k 0`): the cost of the handshake;
- RPUSHX of 100 bytes, 16 pipelined: the produce path.

Prints the median of --runs runs and the TLS/plaintext ratio; never passes or fails
anything. Usage: `make bench-tls`, or `.venv/bin/python bench/tls.py [--runs N]
[--requests N]`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backends.ports import answers_ping, free_port
from backends.process import start
from tests.support.certs import make_certs
from tests.support.rafka_process import RAFKA, exit_status
from tests.support.redis_server import redis_benchmark

VALUE = "x" * 100


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (the median)")
    parser.add_argument("--requests", type=int, default=50_000, help="requests per run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rafka-bench-tls-") as tmp:
        certs = make_certs(Path(tmp) / "certs")
        plain, secure = free_port(), free_port()
        argv = [str(RAFKA), "--host", "127.0.0.1", "-p", str(plain), *certs.server_flags(secure)]
        child = start(
            [*argv, "--data-dir", str(Path(tmp) / "data")],
            name="rafka",
            ready=lambda: answers_ping(plain),
            timeout=30,
        )
        try:
            cases = [
                ("PING", ["-t", "ping_mbulk"], args.requests),
                ("PING, 16 pipelined", ["-t", "ping_mbulk", "-P", "16"], args.requests * 4),
                (
                    "PING, a new connection each",
                    ["-t", "ping_mbulk", "-k", "0"],
                    args.requests // 50,
                ),
                (
                    "RPUSHX 100 B, 16 pipelined",
                    ["-P", "16", "RPUSHX", "topics:bench-tls", VALUE],
                    args.requests * 4,
                ),
            ]
            print(f"redis-benchmark, 50 clients, median of {args.runs} runs", flush=True)
            for name, options, requests in cases:
                tls = ("--tls", "--cacert", str(certs.ca))
                ours = [redis_benchmark(secure, requests, *tls, *options) for _ in range(args.runs)]
                reference = [redis_benchmark(plain, requests, *options) for _ in range(args.runs)]
                mine, theirs = statistics.median(ours), statistics.median(reference)
                print(
                    f"TLS {name:<32} {mine:>10,.0f}/s   plaintext {theirs:>10,.0f}/s"
                    f"   ratio {mine / theirs:5.2f}",
                    flush=True,
                )
        finally:
            child.stop(30)
    return exit_status(child)


if __name__ == "__main__":
    sys.exit(main())
