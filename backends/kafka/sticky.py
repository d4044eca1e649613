"""The partition a batch of keyless records goes to: the one librdkafka chose last.

Why: librdkafka's partitioner runs per record, and each record it places in an empty
partition queue wakes its broker thread. With `queue.buffering.max.ms` 0 (Rafka's
configuration), the broker thread then sends the records already there while the rest of
the batch is still being placed: a loop pass's 30 records left in requests of about 20,
and the broker's and librdkafka's cost per request was most of theirs. A batch given a
partition is placed in one step, so it leaves in one request.

What must not change: keyless records go where librdkafka's partitioner would put them.
Its keyless choice is sticky: one partition per topic for `sticky.partitioning.linger.ms`
(10 ms), then another one available. So a batch goes with the partition librdkafka
chose for the last record of the topic delivered, for one linger from when that was
learned; then the next batch goes unassigned, librdkafka chooses again (its own linger
has run out by then), and its last record teaches the new choice. A partition the
topic no longer has is forgotten where librdkafka refuses it (`Pending.send` then lets
librdkafka choose for those records). Keyed records are not concerned: librdkafka
places them by their key.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

UNASSIGNED = -1  # RD_KAFKA_PARTITION_UA: librdkafka's partitioner chooses

DeliveryCallback = Callable[[Any, Any], None]


class StickyPartitions:
    """The partition librdkafka chose last for each topic's keyless records, for one
    linger (the loop's thread only: batches are sent and reports served there)."""

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
