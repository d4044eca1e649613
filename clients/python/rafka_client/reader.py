"""Reads by offset: LLEN (a partition's next offset) and LRANGE (records by offset)."""

from __future__ import annotations

import re
from typing import Any

from redis.exceptions import ConnectionError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeout

from rafka_client._closing import Closing
from rafka_client._link import DEFAULT_URL, Link
from rafka_client.errors import ConnectionLost, NotHeld, RangeTooLarge, ReadError, UnknownPartition
from rafka_client.records import Record, field_pairs, record_of

_OVER = re.compile(r"range of (\d+) records is over the limit of (\d+) ")
_NOT_HELD = re.compile(r"are no longer held, the first held offset is (\d+)$")
_UNKNOWN = "unknown topic or partition "


def _read_error(error: ResponseError) -> ReadError:
    """The gateway's documented texts as exceptions (redis-py drops the `ERR `)."""
    text = str(error)
    if text.startswith(_UNKNOWN):
        return UnknownPartition(text)
    over = _OVER.match(text)
    if over:
        return RangeTooLarge(text, int(over[1]), int(over[2]))
    gone = _NOT_HELD.search(text)
    if gone:
        return NotHeld(text, int(gone[1]))
    return ReadError(text)


class Reader(Closing):
    """Reads a partition by offset, in no consumer group (nothing is committed and no
    group's position moves), from a rafka gateway or a plain Redis test double."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        protocol: int = 3,
        socket_timeout: float | None = 30.0,
        **options: Any,
    ) -> None:
        self._link = Link(url, protocol=protocol, socket_timeout=socket_timeout, **options)

    def _call(self, *args: str | int) -> Any:
        try:
            return self._link.call(*args)
        except ResponseError as error:
            raise _read_error(error) from None
        except (ConnectionError, RedisTimeout) as error:
            if not self._link.connects:
                raise  # never reached at all: redis-py's error, as documented
            raise ConnectionLost(f"connection lost while reading: {error}") from error

    def next_offset(self, topic: str, partition: int) -> int:
        """The offset the next record of (topic, partition) will get (LLEN).

        Raises UnknownPartition for a topic or partition that does not exist (a plain
        Redis double answers 0 instead).
        """
        return int(self._call("LLEN", _key(topic, partition)))

    def read(self, topic: str, partition: int, start: int = 0, stop: int = -1) -> list[Record]:
        """The records of (topic, partition) with start <= offset <= stop (LRANGE).

        Redis's index rules: negative indexes count from the end (-1: the last record),
        indexes past the ends are clamped, an empty range gives []. Records no longer
        held (retention) are left out. Raises RangeTooLarge over the gateway's
        `max_range` (read in pieces), NotHeld when the whole range is below the first
        held offset (`first_held`), UnknownPartition, ReadError.
        """
        key = _key(topic, partition)
        reply = self._call("LRANGE", key, start, stop)
        records: list[Record] = []
        first: int | None = None
        for index, item in enumerate(reply):
            pairs = field_pairs(item)
            if pairs is not None:
                records.append(record_of(pairs))
                continue
            # Plain Redis: values, one per offset from 0; a negative start needs the
            # list's length to know the offset of the first one.
            if first is None:
                first = start if start >= 0 else max(int(self._call("LLEN", key)) + start, 0)
            records.append(Record(topic, partition, first + index, None, item))
        return records

    def close(self) -> None:
        self._link.quit()


def _key(topic: str, partition: int) -> str:
    if not topic or ":" in topic:
        raise ValueError(f"a topic is not empty and has no ':', got {topic!r}")
    if not 0 <= partition < 2**31:
        raise ValueError(f"a partition is 0 .. 2**31 - 1, got {partition}")
    return f"topics:{topic}:{partition}"
