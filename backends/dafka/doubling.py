"""A timer's gap that starts short and doubles up to its interval.

Where a Dafka message may be lost because the peer has just appeared (a PUB drops what it
sends before a subscriber's subscription has reached it) and repeating it costs little,
the first repeats come soon and then less and less often: a node's announcements
(`beacon`), a writers' actor's HEADs (`publisher`), a node's GET_HEADS (`heads_schedule`).
"""

from __future__ import annotations


class DoublingGap:
    """`first` ms at the start, twice as long at each `double()`, up to `interval` ms."""

    __slots__ = ("gap", "interval")

    def __init__(self, first: int, interval: int) -> None:
        self.interval = interval
        self.gap = min(first, interval)  # ms: the gap in force

    def double(self) -> int:
        """The next gap: twice this one, at most `interval`."""
        self.gap = min(2 * self.gap, self.interval)
        return self.gap

    @property
    def quick(self) -> bool:
        """Still shorter than `interval`."""
        return self.gap < self.interval

    def settle(self) -> None:
        """Every gap from now on is `interval`."""
        self.gap = self.interval
