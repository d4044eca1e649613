"""backends.kafka.sticky on its own: what it learns from delivery reports and how long it
keeps it, on a clock of the test's."""

from __future__ import annotations

import asyncio
from typing import Any

from backends.kafka.pending import Pending
from backends.kafka.sticky import UNASSIGNED, StickyPartitions


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Report:
    """What a delivery callback reads of its record."""

    def __init__(self, partition: int) -> None:
        self._partition = partition

    def partition(self) -> int:
        return self._partition


def test_a_partition_is_kept_for_one_linger_from_when_it_was_learned() -> None:
    clock = Clock()
    sticky = StickyPartitions(0.01, clock)
    assert sticky.partition("t") == UNASSIGNED, "nothing learned yet"
    sticky.learn("t", 3)
    clock.now += 0.009
    assert sticky.partition("t") == 3
    assert sticky.partition("u") == UNASSIGNED, "learned for its own topic only"
    clock.now += 0.001
    assert sticky.partition("t") == UNASSIGNED, "a linger later, librdkafka chooses again"
    clock.now -= 0.005
    assert sticky.partition("t") == UNASSIGNED, "forgotten once its linger ended"


def test_a_forgotten_partition_is_not_used_again() -> None:
    sticky = StickyPartitions(60.0, Clock())
    sticky.learn("t", 5)
    sticky.forget("t")
    assert sticky.partition("t") == UNASSIGNED
    sticky.forget("never-learned")


def test_without_a_linger_nothing_is_learned() -> None:
    """sticky.partitioning.linger.ms 0: librdkafka places every keyless record anew."""
    sticky = StickyPartitions(0.0, Clock())
    assert not sticky.enabled
    sticky.learn("t", 1)
    assert sticky.partition("t") == UNASSIGNED


def test_a_learner_calls_its_callback_and_learns_only_a_delivered_records_partition() -> None:
    sticky = StickyPartitions(60.0, Clock())
    calls: list[tuple[Any, Any]] = []

    def callback(error: Any, message: Any) -> None:
        calls.append((error, message))

    failed, delivered = Report(1), Report(2)
    learner = sticky.learner("t", callback)
    learner("Local: Message timed out", failed)
    assert sticky.partition("t") == UNASSIGNED, "a failed record's partition taught nothing"
    learner(None, delivered)
    assert sticky.partition("t") == 2
    assert calls == [("Local: Message timed out", failed), (None, delivered)]
    assert learner.callback is callback


class ClosedLibrdkafka:
    """A fake of confluent-kafka's Producer that refuses every batch as a producer closed
    under the loop would: a refusal that cannot be timed against a real one."""

    def __len__(self) -> int:
        return 0

    def produce_batch(self, topic: str, messages: list[dict[str, Any]], partition: int) -> int:
        raise RuntimeError("Producer has been closed")


class Owner:
    """A producer handle, as Pending sees one: whose bound method is each callback."""

    def __init__(self) -> None:
        self.refused: list[tuple[str, str, bytes]] = []
        self.settled = 0

    def on_delivery(self, error: Any, message: Any) -> None:
        raise AssertionError("no record was delivered")

    def note_refused(self, error: str, topic: str, value: bytes) -> None:
        self.refused.append((error, topic, value))

    def settle(self, count: int) -> None:
        self.settled += count


def test_a_refused_batch_that_was_to_teach_its_partition_is_its_owners_delivery_error() -> None:
    """The last record of an unassigned batch of keyless records carries a Learner:
    refused, it is still its owner's record, settled and noted as refused."""
    owner = Owner()

    async def send_two() -> Pending:
        pending = Pending(ClosedLibrdkafka(), {})
        assert pending.take("t", None, b"v0", 2, owner.on_delivery)
        assert pending.take("t", None, b"v1", 2, owner.on_delivery)
        pending.send()  # as the loop pass's end would, the two in one batch
        return pending

    pending = asyncio.run(send_two())
    refused = "Producer has been closed"
    assert owner.refused == [(refused, "t", b"v0"), (refused, "t", b"v1")]
    assert owner.settled == 2
    assert "t" not in pending.known
