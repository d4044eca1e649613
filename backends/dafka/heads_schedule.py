"""When a node asks the stores for a topic's heads again (GET_HEADS), issue 7.

C asks once, at subscribe: a partition whose producer a node never hears (its RECORDs and
HEADs went out before the node's subscription reached it, or it is connected through
another tower) and that the stores had not committed when they answered is never fetched.
Asking again after 100 ms, doubling up to `interval` ms, then every `interval` ms for as
long as the subscription lasts, picks such a partition up within the interval. The cost:
one GET_HEADS per topic and interval to each store, one DIRECT_HEAD back per partition.
"""

from __future__ import annotations

from backends.dafka.doubling import DoublingGap

FIRST_RETRY_MS = 100
NEVER = 2**62


class HeadsSchedule:
    def __init__(self, interval_ms: int) -> None:
        """`interval_ms` 0: never ask again."""
        self.interval = max(0, interval_ms)
        self._due: dict[str, tuple[int, DoublingGap]] = {}  # topic -> (due ms, its gap)
        self.next_due = NEVER

    def add(self, topic: str, now: int) -> None:
        if self.interval > 0:
            gaps = DoublingGap(FIRST_RETRY_MS, self.interval)
            self._due[topic] = (now + gaps.gap, gaps)
            self.next_due = min(self.next_due, now + gaps.gap)

    def remove(self, topic: str) -> None:
        self._due.pop(topic, None)

    def due(self, now: int) -> list[str]:
        """The topics to ask about now; each then waits twice as long, up to the interval."""
        if now < self.next_due:
            return []
        topics: list[str] = []
        next_due = NEVER
        for topic, (due, gaps) in list(self._due.items()):
            if now >= due:
                topics.append(topic)
                due = now + gaps.double()
                self._due[topic] = (due, gaps)
            next_due = min(next_due, due)
        self.next_due = next_due
        return topics
