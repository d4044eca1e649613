"""Consumed librdkafka messages as the engine interface's records: `records_of()` turns a
fetched batch into one RecordBatch column by column (no Python code and no object per
message), `record_of()` one message into a Record (errors and the one-by-one path; the
reads by offset of reads.py)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import is_not
from typing import cast, overload

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message

from backends.base import Record, RecordBatch

Partition = tuple[str, int]


class _Stamps(Sequence[int | None]):
    """The timestamps of a batch of messages, read from them only when asked for
    (BLMPOP never does; confluent-kafka builds a tuple per timestamp() call)."""

    __slots__ = ("_messages",)

    def __init__(self, messages: list[Message]) -> None:
        self._messages = messages

    def __len__(self) -> int:
        return len(self._messages)

    @overload
    def __getitem__(self, index: int) -> int | None: ...

    @overload
    def __getitem__(self, index: slice) -> _Stamps: ...

    def __getitem__(self, index: int | slice) -> int | _Stamps | None:
        if isinstance(index, slice):
            return _Stamps(self._messages[index])
        kind, stamp = self._messages[index].timestamp()
        return None if kind == TIMESTAMP_NOT_AVAILABLE else stamp


def records_of(messages: list[Message], owned: set[Partition]) -> RecordBatch | None:
    """`messages` (not empty) as a batch of records, built column by column:
    confluent-kafka's accessors mapped over the list, no Python code and no object per
    message. None, to convert them one by one, unless every message is a record (no
    error) of a partition in `owned`."""
    # `is not`, never `==`: a KafkaError compared with None raises.
    if any(map(is_not, map(Message.error, messages), repeat(None))):
        return None
    topics = list(map(Message.topic, messages))
    partitions = list(map(Message.partition, messages))
    first = topics[0]
    # The common case, one topic: count() compares strings, set() would hash each one.
    if topics.count(first) == len(topics):
        if not {(first, partition) for partition in set(partitions)} <= owned:
            return None
    elif not set(zip(topics, partitions, strict=True)) <= owned:
        return None
    return RecordBatch(
        cast(list[str], topics),
        cast(list[int], partitions),
        cast(list[int], list(map(Message.offset, messages))),
        list(map(Message.key, messages)),
        cast(list[bytes | None], list(map(Message.value, messages))),
        _Stamps(messages),
    )


def record_of(message: Message) -> Record:
    """A consumed librdkafka message (no error) as the engine interface's Record."""
    topic, partition, offset = message.topic(), message.partition(), message.offset()
    assert topic is not None and partition is not None and offset is not None
    kind, stamp = message.timestamp()
    return Record(
        topic=topic,
        partition=partition,
        offset=offset,
        key=message.key(),
        value=message.value(),
        timestamp_ms=None if kind == TIMESTAMP_NOT_AVAILABLE else stamp,
    )
