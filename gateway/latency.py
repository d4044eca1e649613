"""Per-command latency histograms, cheap enough for the command path.

Only made when the metrics endpoint is on (`gateway.metrics_port`); a connection then
reads the clock once per command and once per read (`time.perf_counter`; a command's time
runs from the end of the one before it in the same read, its parsing included) and adds
one to a bucket. The event loop is the only writer; the metrics endpoint reads from its
own thread. A reader may see a command counted in its bucket and not yet in `total`:
`snapshot` derives the count from the buckets, so that every histogram it returns is
consistent in itself.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import accumulate

# Upper bounds in seconds (Prometheus `le`), from a fast command on the event loop (tens
# of µs) to a BLPOP waiting for a record; +Inf is implicit.
BUCKETS: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)

# The label of commands the table does not know (their count stays bounded).
OTHER = "other"


class Histogram:
    """One command's observations: a count per bucket (the last one is +Inf) and a sum."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)
        self.total = 0.0


@dataclass(frozen=True, slots=True)
class HistogramSnapshot:
    command: str
    # Cumulative counts per upper bound, BUCKETS then +Inf (Prometheus' `_bucket` series).
    cumulative: tuple[int, ...]
    total: float

    @property
    def count(self) -> int:
        return self.cumulative[-1]


class CommandLatency:
    """A histogram per command name of the table, and one for unknown commands."""

    def __init__(self, commands: Iterable[bytes]) -> None:
        """`commands`: the table's names (upper case, as gateway.commands.COMMANDS)."""
        self._by_name: dict[str, Histogram] = {
            name.decode().upper(): Histogram() for name in commands
        }
        self._other = Histogram()
        # The spellings clients send (as the dispatcher's table): no upper() in the common case.
        self._by_spelling: dict[bytes, Histogram] = {}
        for name, histogram in self._by_name.items():
            self._by_spelling[name.encode()] = histogram
            self._by_spelling[name.lower().encode()] = histogram

    def observe(self, name: bytes, seconds: float) -> None:
        """One command, named by its request's first argument, took `seconds`. One call
        on the command path (a lookup, a bisect, two additions)."""
        histogram = self._by_spelling.get(name)
        if histogram is None:
            histogram = self._by_name.get(name.upper().decode("utf-8", "replace"), self._other)
        histogram.counts[bisect_left(BUCKETS, seconds)] += 1
        histogram.total += seconds

    def snapshot(self) -> list[HistogramSnapshot]:
        """Every command that ran at least once, by name (lower case)."""
        out: list[HistogramSnapshot] = []
        entries = [*self._by_name.items(), (OTHER, self._other)]
        for name, histogram in sorted(entries):
            counts = list(histogram.counts)  # one copy: the loop may add meanwhile
            if not any(counts):
                continue
            out.append(HistogramSnapshot(name.lower(), tuple(accumulate(counts)), histogram.total))
        return out
