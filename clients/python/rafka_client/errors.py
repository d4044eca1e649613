"""The client's exceptions; each carries the gateway's text where there is one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class RafkaError(Exception):
    """Base of every error the client raises (redis-py's own errors excepted: a server
    that cannot be reached at all raises `redis.exceptions.ConnectionError`)."""


@dataclass(frozen=True)
class BatchFailure:
    """One RPUSHX the gateway refused: the records of `key` (None: no key) sent with it
    that precede the refused one were produced, the others were not."""

    topic: str
    key: bytes | None
    records: int
    text: str


class ProduceError(RafkaError):
    """The gateway refused records (`PROD ...`); `failures` lists the refused batches."""

    def __init__(self, text: str, failures: Sequence[BatchFailure] = ()) -> None:
        super().__init__(text)
        self.failures = tuple(failures)


class FlushTimeout(ProduceError):
    """`flush(timeout)` ended with `outstanding` records still not durable. They stay
    queued in the gateway: a later flush may still see them delivered."""

    def __init__(self, outstanding: int, timeout: float) -> None:
        super().__init__(f"{outstanding} records still not durable after {timeout:g}s")
        self.outstanding = outstanding


class DeliveryUnknown(ProduceError):
    """The connection was lost after `records` records were sent and before a flush
    confirmed them: the gateway flushed them when the connection closed, but whether
    they were delivered cannot be known. Produce them again for at-least-once."""

    def __init__(self, records: int) -> None:
        super().__init__(f"connection lost before {records} sent records were confirmed")
        self.records = records


class ConsumeError(RafkaError):
    """The gateway refused a consumer command (`CONS ...`)."""


class AckError(ConsumeError):
    """The gateway refused acks (e.g. the partition went to another member in a
    rebalance): those records will be delivered again, to this member or another."""


class ConnectionLost(RafkaError):
    """The consumer could not reconnect within its `reconnect_timeout`, the producer
    lost its connection while sending (the records stay buffered), or the reader lost
    its connection during a read (the next read reconnects)."""


class ReadError(RafkaError):
    """A read by offset (LLEN, LRANGE) failed."""


class UnknownPartition(ReadError):
    """The topic or the partition does not exist (plain Redis never says so)."""


class RangeTooLarge(ReadError):
    """The range holds more records than the gateway's `max_range` (`limit`)."""

    def __init__(self, text: str, count: int, limit: int) -> None:
        super().__init__(text)
        self.count, self.limit = count, limit


class NotHeld(ReadError):
    """The whole range is below the partition's first held offset (retention)."""

    def __init__(self, text: str, first_held: int) -> None:
        super().__init__(text)
        self.first_held = first_held
