"""The record type, and the gateway's (or plain Redis's) replies turned into records."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Record:
    """One record of the log.

    `key` and `timestamp_ms` come with reads by offset (`Reader.read`); a consumer's
    records have neither (None): the gateway's BLPOP reply is Rafka's, without them.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None = None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def field_pairs(reply: Any) -> dict[str, Any] | None:
    """A gateway record (an array of field/value pairs) as a dict; None for anything
    else (e.g. a plain Redis value)."""
    if not isinstance(reply, list | tuple) or len(reply) % 2 or not reply:
        return None
    names = reply[0::2]
    if not all(isinstance(name, bytes | str) for name in names):
        return None
    pairs = {_text(name): value for name, value in zip(names, reply[1::2], strict=True)}
    return pairs if {"topic", "partition", "offset", "value"} <= pairs.keys() else None


def record_of(pairs: dict[str, Any]) -> Record:
    """A record from a gateway reply's fields (BLPOP's eight, LRANGE's twelve)."""
    stamp = pairs.get("timestamp")
    return Record(
        topic=_text(pairs["topic"]),
        partition=int(pairs["partition"]),
        offset=int(pairs["offset"]),
        key=pairs.get("key"),
        value=pairs["value"],
        timestamp_ms=None if stamp is None else int(stamp),
    )


def topic_of_list(name: bytes | str) -> str:
    """The topic a plain Redis list stands for: `topics:<topic>[:...]` -> `<topic>`."""
    parts = _text(name).split(":")
    return parts[1] if len(parts) >= 2 and parts[0] == "topics" else _text(name)
