"""Reads by offset: LLEN (a partition's next offset) and LRANGE (records by offset).

Not in Rafka (its issue #56, "consume a specific message by offset"). The key names one
partition, `topics:<topic>:<partition>`, and the list indexes are offsets, so that a
plain Redis list holding a partition's values, one per offset from 0, answers the same
commands the same way (the client's test double):

- `LLEN topics:<t>:<p>` -> the offset the next record will get (the list's length).
- `LRANGE topics:<t>:<p> <start> <stop>` -> the records with start <= offset <= stop,
  with Redis's index rules: a negative index counts from the end (-1 is the last record,
  offset next - 1), indexes past either end are clamped, an empty range gives [].

Where a log differs from a list: records below the partition's first held offset
(retention) are absent. A range partly below it answers from the first held offset on
(each record carries its offset); a range wholly below it is refused with an error that
names the first held offset. A range of more than `gateway.max_range` records is
refused. Reads join no consumer group and move no committed offset.

Each record is an array of field/value pairs, BLPOP's eight first:
`topic <t> partition <p> offset <o> value <v> key <k> timestamp <ms>` (the key and the
timestamp may be null).
"""

from __future__ import annotations

import re

from backends.base import PartitionOffsets, ReadError, Record, UnknownPartitionError
from gateway import errors
from gateway.commands.base import Answer, Reply, text
from gateway.commands.consume import record_reply
from gateway.session import Session

PARTITION_LIMIT = 2**31
INT64 = 2**63
_INTEGER = re.compile(rb"-?[0-9]+")
_PARTITION = re.compile(r"[0-9]+")


def parse_partition_key(raw: bytes) -> tuple[str, int]:
    """`topics:<topic>:<partition>` -> (topic, partition); raises the documented errors."""
    key = text(raw)
    parts = key.split(":")
    if len(parts) != 3 or parts[0] != "topics" or not parts[1]:
        raise errors.read_key_form(key)
    topic, partition = parts[1], parts[2]
    if not _PARTITION.fullmatch(partition) or int(partition) >= PARTITION_LIMIT:
        raise errors.read_partition(partition)
    return topic, int(partition)


def parse_index(raw: bytes) -> int:
    """A list index as Redis reads it (64-bit, no sign but `-`)."""
    if not _INTEGER.fullmatch(raw):
        raise errors.not_an_integer()
    value = int(raw)
    if not -INT64 <= value < INT64:
        raise errors.not_an_integer()
    return value


def resolve_range(start: int, stop: int, following: int) -> tuple[int, int] | None:
    """Redis's LRANGE index rules over offsets 0..following-1: the (start, stop) to
    read, both inclusive, or None for an empty range."""
    if start < 0:
        start = max(following + start, 0)
    if stop < 0:
        stop = following + stop
    stop = min(stop, following - 1)
    if start > stop:
        return None
    return start, stop


def record_fields(record: Record) -> Reply:
    """BLPOP's fields of a record, then its key and timestamp."""
    return [
        *record_reply(record),
        b"key",
        record.key,
        b"timestamp",
        record.timestamp_ms,
    ]


async def _offsets(session: Session, topic: str, partition: int) -> PartitionOffsets:
    try:
        return await session.ctx.engine.partition_offsets(topic, partition)
    except UnknownPartitionError:
        raise errors.unknown_partition(topic, partition) from None
    except ReadError as error:
        raise errors.read_failed(str(error)) from None


def llen(session: Session, args: list[bytes]) -> Answer:
    """LLEN topics:<topic>:<partition> -> the partition's next offset."""
    if len(args) != 2:
        raise errors.wrong_arity("llen")
    topic, partition = parse_partition_key(args[1])
    return _llen(session, topic, partition)


async def _llen(session: Session, topic: str, partition: int) -> Reply:
    return (await _offsets(session, topic, partition)).next


def lrange(session: Session, args: list[bytes]) -> Answer:
    """LRANGE topics:<topic>:<partition> <start> <stop> -> records by offset."""
    if len(args) != 4:
        raise errors.wrong_arity("lrange")
    topic, partition = parse_partition_key(args[1])
    start, stop = parse_index(args[2]), parse_index(args[3])
    return _lrange(session, topic, partition, start, stop)


async def _lrange(session: Session, topic: str, partition: int, start: int, stop: int) -> Reply:
    first, following = await _offsets(session, topic, partition)
    resolved = resolve_range(start, stop, following)
    if resolved is None:
        return []
    start, stop = resolved
    if stop < first:
        raise errors.range_not_held(topic, partition, start, stop, first)
    start = max(start, first)
    count = stop - start + 1
    limit = session.ctx.config.max_range
    if count > limit:
        raise errors.range_over_limit(count, limit)
    try:
        records = await session.ctx.engine.read(topic, partition, start, stop, count)
    except UnknownPartitionError:
        raise errors.unknown_partition(topic, partition) from None
    except ReadError as error:
        raise errors.read_failed(str(error)) from None
    return [record_fields(record) for record in records]
