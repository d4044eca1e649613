"""What parsing a pipeline of RPUSHX costs per command, round-robin over 1, 100 and 1,000
topics, with each request parser (tests/gateway/resp/parsing.PARSERS: pure Python;
hiredis-backed, its runs of one command parsed in C or in Python): the gateway's parse
cost as the keys change, next to the one-topic figure of the same run.

The commands are those of bench/growth.py (100-byte values, keys `topics:growth-NNNN`),
fed in 64 KiB reads as the connection reads them. Best of --rounds (the parse is pure
CPU; the best is the least disturbed by others' load). Prints figures; never fails.

Usage: `.venv/bin/python bench/parse_cost.py [--commands 100000] [--rounds 5]`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.gateway.resp.parsing import PARSERS, MakeParser
from tests.support.resp import command

READ = 64 * 1024  # bytes per read, as the connection reads
VALUE = b"x" * 100


def pipeline(topics: int, commands: int) -> list[bytes]:
    """`commands` RPUSHX round-robin over `topics`, cut into reads."""
    data = b"".join(
        command(b"RPUSHX", b"topics:growth-%04d" % (i % topics), VALUE) for i in range(commands)
    )
    return [data[at : at + READ] for at in range(0, len(data), READ)]


def cost(make: MakeParser, reads: list[bytes], rounds: int) -> float:
    """Microseconds per command, the best of `rounds`."""
    best = float("inf")
    for _ in range(rounds):
        parser = make()
        taken = 0
        start = time.perf_counter()
        for read in reads:
            parser.feed(read)
            while (command := parser.get_command()) is not None or parser.more:
                taken += command is not None
        best = min(best, (time.perf_counter() - start) / taken)
    return best * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print("pipelined RPUSHX, 100-byte values, us per command parsed (ratio to 1 topic):")
    for name, make in PARSERS.items():
        reference = 0.0
        figures = []
        for topics in (1, 100, 1000):
            figure = cost(make, pipeline(topics, args.commands), args.rounds)
            reference = reference or figure
            figures.append(f"{topics:>5} topic(s) {figure:5.2f} ({figure / reference:4.2f})")
        print(f"  {name:<24}" + "   ".join(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
