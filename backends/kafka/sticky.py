"""The partition a batch of keyless records goes to: the one librdkafka chose last.

Why: with `queue.buffering.max.ms` 0 (Rafka's configuration), a loop pass's records
handed to librdkafka unassigned (its partitioner placing each) left in requests of about
19 records; given a partition, of about 66 (librdkafka's broker thread, under strace:
10,475 sendmsg calls in 5 s at 40,500 RPUSHX/s, against 2,694 at 35,500/s), and the
broker's and librdkafka's CPU per record fell by about half: they pay
per request. (Measured; which step of librdkafka's makes the difference was not pinned
down.)

What must not change: keyless records go about where librdkafka's partitioner would put
them. Its keyless choice is sticky: one partition per topic for
`sticky.partitioning.linger.ms` (10 ms), then another one available. So a batch goes with
the partition librdkafka chose for the topic's last unassigned batch (its last record's
delivery report), for one linger from when that was learned; then the next batch goes
unassigned, librdkafka chooses again (its own linger has run out by then), and its last
record teaches the new choice. It is close, not exact: a learned partition is kept one
linger from its report, where librdkafka's own choice ran one linger from its first
record, and librdkafka moves off a partition that lost its leader at once, the learned
one only when its linger ends. Records refused on a learned partition (the topic has
fewer partitions now) go unassigned at once (`Pending._unassigned`). Keyed records are
not concerned: librdkafka places them by their key; nor is a batch of one record
(`Pending.send`). With the `random` partitioner
(no stickiness) or a linger of 0, every batch goes unassigned.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

UNASSIGNED = -1  # RD_KAFKA_PARTITION_UA: librdkafka's partitioner chooses

DeliveryCallback = Callable[[Any, Any], None]


# Topics remembered at most; past it the table starts again (each topic's next batch
# then goes unassigned once).
_LEARNED_MAX = 4096


class StickyPartitions:
    """The partition librdkafka chose last for each topic's keyless records, for one
    linger. Used by one thread at a time: the loop's, which sends the batches and serves
    the delivery reports, or close()'s once the loop no longer does."""

    def __init__(self, linger: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.enabled = linger > 0  # else librdkafka places each keyless record anew
        self._linger = linger
        self._clock = clock
        self._learned: dict[str, tuple[int, float]] = {}  # topic -> (partition, since)

    def partition(self, topic: str) -> int:
        """Where a batch of keyless records of `topic` goes now: the partition learned
        less than a linger ago, else UNASSIGNED (and the batch should teach the next)."""
        learned = self._learned.get(topic)
        if learned is None:
            return UNASSIGNED
        partition, since = learned
        if self._clock() - since >= self._linger:
            del self._learned[topic]
            return UNASSIGNED
        return partition

    def learner(self, topic: str, callback: DeliveryCallback) -> Learner:
        """`callback`, which also learns the partition its record was delivered to."""
        return Learner(self, topic, callback)

    def learn(self, topic: str, partition: int) -> None:
        if self.enabled:
            if len(self._learned) >= _LEARNED_MAX:
                self._learned.clear()
            self._learned[topic] = (partition, self._clock())

    def forget(self, topic: str) -> None:
        self._learned.pop(topic, None)


class Learner:
    """A record's delivery callback that teaches StickyPartitions where it went."""

    __slots__ = ("_sticky", "_topic", "callback")

    def __init__(self, sticky: StickyPartitions, topic: str, callback: DeliveryCallback) -> None:
        self.callback = callback
        self._sticky = sticky
        self._topic = topic

    def __call__(self, error: Any, message: Any) -> None:
        self.callback(error, message)
        if error is None:
            self._sticky.learn(self._topic, message.partition())
