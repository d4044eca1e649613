"""The consuming side: BLPOP (one record), BLMPOP (a batch) and RPUSH acks (store offsets)."""

from __future__ import annotations

import asyncio
import functools
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import chain
from typing import Any, cast

import structlog

from backends.base import AckError, ConsumeError, Consumer, EngineError, Record, RecordBatch
from backends.settings import JsonNumber, json_decoder
from gateway import errors
from gateway.commands.base import Answer, Reply, arg, text
from gateway.errors import RespError
from gateway.goparse import GoParseError, parse_int, wrap_int64
from gateway.resp import NULL_ARRAY, Encoded
from gateway.session import Session

log = structlog.get_logger("rafka.gateway.consume")

_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_JSON_SPACE = " \t\n\r"
_CACHED_KEY = 64 * 1024  # bytes of a BLPOP key a session keeps parsed (1,000 topics: 12 KB)


# --- BLPOP key and timeout ---------------------------------------------------------------


def _go_kind(value: object) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, JsonNumber):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "value"


def parse_config_json(raw: str) -> dict[str, object] | None:
    """Decode the JSON part of a BLPOP key as Rafka does; raises RespError #5.

    Only the first JSON value counts (trailing bytes ignored), `null` means none, and a
    value that is not an object is refused with Go's unmarshal wording.
    """
    stripped = raw.lstrip(_JSON_SPACE)
    if not stripped:
        raise errors.bad_consumer_config(raw, "EOF")
    try:
        value, _ = json_decoder().raw_decode(stripped)
    except json.JSONDecodeError as error:
        raise errors.bad_consumer_config(raw, str(error)) from None
    if value is None:
        return None
    if not isinstance(value, dict):
        kind = _go_kind(value)
        detail = f"json: cannot unmarshal {kind} into Go value of type map[string]interface {{}}"
        raise errors.bad_consumer_config(raw, detail)
    return value


def parse_topics_key(key: str) -> tuple[list[str], dict[str, object] | None]:
    """`topics:<t1>[,<t2>...][:<json>]` -> (topics, raw JSON settings or None)."""
    parts = key.split(":", 2)
    if len(parts) < 2 or parts[0] != "topics":
        raise errors.cannot_parse_topics(key)
    topics = parts[1].split(",")
    settings = parse_config_json(parts[2]) if len(parts) == 3 and parts[2] else None
    return topics, settings


def session_topics(
    session: Session, key: bytes
) -> tuple[tuple[str, ...], dict[str, object] | None, str]:
    """parse_topics_key() of `key`, with its topics joined by ","; the session's last
    key is answered without parsing it again. Kept only once the session has a consumer
    (which holds those topics anyway) and up to _CACHED_KEY bytes: a connection must not
    keep what a huge or refused key parsed to."""
    parsed = session.topics_parsed
    if parsed is not None and key == session.topics_key:
        return parsed
    topics, settings = parse_topics_key(text(key))
    parsed = (tuple(topics), settings, ",".join(topics))
    if session.consumer is not None and len(key) <= _CACHED_KEY:
        session.topics_key, session.topics_parsed = key, parsed
    return parsed


def parse_timeout(raw: bytes, default: float) -> float | None:
    """Seconds to wait (None = forever). Not a number -> Rafka's default."""
    # A consumer sends the same timeout every time: its parse (0.5 us, the regular
    # expression mostly) is cached; refusals are not (lru_cache keeps no exception), nor
    # timeouts longer than any number needs.
    if len(raw) <= _TIMEOUT_KEPT_LENGTH:
        return _cached_timeout(raw, default)
    return _parse_timeout(raw, default)


_TIMEOUT_KEPT_LENGTH = 32


def _parse_timeout(raw: bytes, default: float) -> float | None:
    candidate = raw.decode("latin-1")
    if not _NUMBER.fullmatch(candidate):
        return default
    seconds = float(candidate)
    if seconds < 0:
        raise errors.timeout_negative()
    if seconds == 0 or math.isinf(seconds):
        return None
    return seconds


_cached_timeout = functools.lru_cache(maxsize=256)(_parse_timeout)


def record_reply(record: Record) -> list[Reply]:
    return [
        b"topic",
        record.topic.encode(),
        b"partition",
        record.partition,
        b"offset",
        record.offset,
        b"value",
        record.value,
    ]


# A BLPOP record up to its value, in RESP (the same in RESP2 and RESP3).
_RECORD_HEAD = (
    b"*8\r\n$5\r\ntopic\r\n$%d\r\n%b\r\n$9\r\npartition\r\n:%d\r\n"
    b"$6\r\noffset\r\n:%d\r\n$5\r\nvalue\r\n"
)


# A value that is not null, in RESP.
_VALUE = b"$%d\r\n%b\r\n"
_RECORD = _RECORD_HEAD + _VALUE


def blpop_reply(record: Record) -> Reply:
    """BLPOP's reply: record_reply's bytes in one formatting, not eight items encoded one
    by one (a null value's spelling depends on the protocol: that one goes as the list)."""
    value = record.value
    if value is None:
        return record_reply(record)
    topic = record.topic.encode()
    fields = (len(topic), topic, record.partition, record.offset, len(value), value)
    return Encoded(_RECORD % fields)


# BLMPOP's reply up to its records: [key, [...]].
_BATCH_HEAD = b"*2\r\n$%d\r\n%b\r\n*%d\r\n"


def batch_reply(key: bytes, records: Sequence[Record], protocol: int) -> Reply:
    """BLMPOP's reply: Redis's `[key, [element, ...]]`, each element a BLPOP record
    (record_reply's bytes). The records are taken apart into columns and formatted by one
    `bytes %` over the whole batch: no Python code runs per record (the per-record cost
    of a batch), unless a value is null."""
    head = (len(key), key, len(records))
    if not records:
        return Encoded(_BATCH_HEAD % head)
    # An engine's RecordBatch is columns already: nothing is built per record.
    columns = RecordBatch.of(records)
    topics, partitions, offsets = columns.topics, columns.partitions, columns.offsets
    if None in columns.values:
        return Encoded(_BATCH_HEAD % head + _records_one_by_one(records, protocol))
    values = cast(list[bytes], columns.values)
    names = set(topics)
    if len(names) == 1:  # the topic written into the format, once: four fields a record
        name = topics[0].encode()
        record = _RECORD_HEAD.replace(
            b"$%d\r\n%b\r\n", b"$%d\r\n%b\r\n" % (len(name), name.replace(b"%", b"%%")), 1
        )
        fields: Iterable[tuple[object, ...]] = zip(
            partitions, offsets, map(len, values), values, strict=True
        )
    else:
        record = _RECORD_HEAD
        each = {topic: topic.encode() for topic in names}
        encoded = list(map(each.__getitem__, topics))
        fields = zip(
            map(len, encoded), encoded, partitions, offsets, map(len, values), values, strict=True
        )
    # The whole reply in one formatting, so in one buffer, never copied on its way out.
    template = _BATCH_HEAD + (record + _VALUE) * len(records)
    return Encoded(template % tuple(chain(head, chain.from_iterable(fields))))


def _records_one_by_one(records: Sequence[Record], protocol: int) -> bytes:
    """batch_reply's records, record by record: the shape with null values too."""
    null = b"_\r\n" if protocol >= 3 else b"$-1\r\n"
    parts: list[bytes] = []
    append, head = parts.append, _RECORD_HEAD
    topics: dict[str, bytes] = {}
    for record in records:
        topic = topics.get(record.topic)
        if topic is None:
            topic = topics[record.topic] = record.topic.encode()
        append(head % (len(topic), topic, record.partition, record.offset))
        value = record.value
        append(null if value is None else b"$%d\r\n%b\r\n" % (len(value), value))
    return b"".join(parts)


def blpop(session: Session, args: list[bytes]) -> Answer:
    """BLPOP topics:<t1,t2>[:<json>] [...] <timeout>, in Rafka's processing order."""
    key = arg(args, 1)
    topics, settings, joined = session_topics(session, key)
    timeout = parse_timeout(args[-1], session.ctx.config.blpop_default_timeout)
    return _consume(session, topics, settings, joined, timeout, None, key)


def parse_blmpop(args: list[bytes]) -> tuple[float | None, bytes, int]:
    """`BLMPOP timeout numkeys key [key ...] LEFT|RIGHT [COUNT n]` -> (seconds or None
    for forever, the first key, count); Redis 7's checks, texts and order (numkeys, the
    direction, COUNT, then the timeout), then RIGHT refused."""
    if len(args) < 5:
        raise errors.wrong_arity("blmpop")
    numkeys = _positive(args[2], errors.numkeys_not_positive)
    where_at = 3 + numkeys
    if where_at >= len(args):
        raise errors.syntax_error()
    where = args[where_at].upper()
    if where not in (b"LEFT", b"RIGHT"):
        raise errors.syntax_error()
    count = None
    index = where_at + 1
    while index < len(args):
        if count is None and args[index].upper() == b"COUNT" and index + 1 < len(args):
            count = _positive(args[index + 1], errors.count_not_positive)
            index += 2
        else:
            raise errors.syntax_error()
    raw = args[1].decode("latin-1")
    if not _NUMBER.fullmatch(raw):
        raise errors.timeout_not_a_float()
    seconds = float(raw)
    if seconds < 0:
        raise errors.timeout_negative()
    if where == b"RIGHT":
        raise errors.blmpop_right()
    timeout = None if seconds == 0 or math.isinf(seconds) else seconds
    return timeout, args[3], 1 if count is None else count


# Redis's integers (string2ll): an optional '-', no '+', no leading zero, no spaces.
_REDIS_INTEGER = re.compile(rb"-?[1-9][0-9]*|0")
_LONG_MAX = 2**63 - 1


def _positive(raw: bytes, error: Callable[[], RespError]) -> int:
    """`raw` as an int in 1..LONG_MAX read as Redis reads it, else `error()` (BLMPOP's
    numkeys and COUNT)."""
    if not _REDIS_INTEGER.fullmatch(raw):
        raise error()
    value = int(raw)
    if not 0 < value <= _LONG_MAX:
        raise error()
    return value


def blmpop(session: Session, args: list[bytes]) -> Answer:
    """BLMPOP <timeout> <numkeys> topics:<t1,t2>[:<json>] [...] LEFT [COUNT n]: up to n
    records in one reply. The first key counts (as BLPOP's); then as BLPOP."""
    timeout, key, count = parse_blmpop(args)
    topics, settings, joined = session_topics(session, key)
    return _consume(session, topics, settings, joined, timeout, count, key)


def _consume(
    session: Session,
    topics: Sequence[str],
    settings: dict[str, object] | None,
    joined: str,
    timeout: float | None,
    count: int | None,
    key: bytes,
) -> Answer:
    """BLPOP (count None: one record) or BLMPOP (up to count), after the key's parsing
    (`joined`: the topics joined by ",")."""
    ctx = session.ctx
    if ctx.shutting_down:
        raise errors.server_shutdown()
    if not session.name_set:
        raise errors.not_ready()
    consumer = session.consumer
    if consumer is None:
        return _create_then_next(session, topics, settings or {}, joined, timeout, count, key)
    # The consumer's id is "<client id>|<topics>", and the client id is set for good
    # before a consumer exists: the topics tell. Compared, not the id built per BLPOP
    # (the string is the one the parse cached: equal at once, however many topics).
    if joined != session.consumer_topics:
        assert session.consumer_id is not None
        new_id = session.consumer_id_for(joined)
        raise errors.consumer_exclusive(session.id, session.consumer_id, new_id)
    # Same topics: reuse; a later BLPOP's JSON settings are ignored, as in Rafka.
    # Records the consumer already holds are answered in this pass: no task, no wake-up.
    try:
        if count is None:
            ready = consumer.next_ready()
            if ready is not None:
                return blpop_reply(ready)
        else:
            batch = consumer.take_ready(count)
            if batch:
                return batch_reply(key, batch, session.protocol)
    except ConsumeError as error:
        raise errors.from_engine(error) from None
    return _next(session, consumer, timeout, count, key)


async def _create_then_next(
    session: Session,
    topics: Sequence[str],
    settings: Mapping[str, object],
    joined: str,
    timeout: float | None,
    count: int | None,
    key: bytes,
) -> Reply:
    ctx = session.ctx
    consumer_id = session.consumer_id_for(joined)
    failed = errors.consumer_registration_failed(consumer_id, session.id)
    if not session.group:
        log.warning("consumer creation failed", consumer=consumer_id, cause="empty group")
        raise failed
    creation = asyncio.ensure_future(
        ctx.engine.consumer(session.group, session.client_name, topics, settings)
    )
    try:
        # Shielded: if this connection goes away meanwhile, the consumer still gets closed.
        consumer = await asyncio.shield(creation)
    except EngineError as error:
        log.warning("consumer creation failed", consumer=consumer_id, cause=str(error))
        raise failed from None
    except asyncio.CancelledError:
        creation.add_done_callback(_close_orphan)
        raise
    session.consumer = consumer
    session.consumer_topics = joined
    log.info("consumer registered", consumer=consumer_id, topics=list(topics))
    return await _next(session, consumer, timeout, count, key)


def _close_orphan(creation: asyncio.Future[Consumer]) -> None:
    if creation.cancelled() or creation.exception() is not None:
        return
    task = asyncio.ensure_future(creation.result().close())
    _ORPHAN_CLOSES.add(task)
    task.add_done_callback(_ORPHAN_CLOSES.discard)


# Keeps orphan-close tasks referenced until they finish.
_ORPHAN_CLOSES: set[asyncio.Future[None]] = set()


async def _next(
    session: Session, consumer: Consumer, timeout: float | None, count: int | None, key: bytes
) -> Reply:
    stop = session.ctx.shutdown_started
    if stop.done():
        raise errors.server_shutdown()
    # The consumer is awaited in this task (the connection's), not in one of its own: a
    # record handed to the consumer is answered in the next loop pass, not two passes
    # later. The shutdown cancels this task; the client going away does too (the
    # connection's teardown), and then the BLPOP is not answered at all.
    task = asyncio.current_task()
    assert task is not None
    stopping = False

    def stop_waiting(_: object, task: asyncio.Task[Any] = task) -> None:
        nonlocal stopping
        stopping = True
        task.cancel()

    # A callback on the shutdown future instead of asyncio.wait((wait, stop)): the same
    # outcome with less machinery per BLPOP.
    stop.add_done_callback(stop_waiting)
    got: Record | Sequence[Record] | None
    try:
        if count is None:
            got = await consumer.next(timeout)
        else:
            got = await consumer.next_batch(count, timeout)
    except asyncio.CancelledError:
        if not stopping or task.uncancel() > 0:
            raise  # this BLPOP itself was cancelled (client gone): not a shutdown
        # A record that arrived together with the shutdown is still handed out.
        try:
            got = consumer.next_ready() if count is None else consumer.take_ready(count)
        except ConsumeError:
            got = None
        if not got:
            raise errors.server_shutdown() from None
    except ConsumeError as error:
        raise errors.from_engine(error) from None
    finally:
        stop.remove_done_callback(stop_waiting)
        # A CancelledError leaving this frame keeps it in its traceback, which the task
        # keeps: the frame's references to the task would close a cycle that only the
        # cycle collector frees (with the connection behind it).
        del stop_waiting, task
    if not got:
        return NULL_ARRAY
    if isinstance(got, Record):
        return blpop_reply(got)
    return batch_reply(key, got, session.protocol)


# --- RPUSH acks ----------------------------------------------------------------------------


def _parse_ack(raw: bytes) -> tuple[str, int, int]:
    parts = raw.split(b":", 2)
    if len(parts) < 3:
        raise errors.cannot_parse_ack(text(raw))
    try:
        partition = parse_int(parts[1], 10, 32)
        offset = parse_int(parts[2], 0, 64)
    except GoParseError as error:
        raise errors.parse_int_failed(str(error)) from None
    return text(parts[0]), partition, offset


def rpush(session: Session, args: list[bytes]) -> Reply:
    """RPUSH acks <topic>:<partition>:<offset> [...]: all checked first, then stored."""
    if arg(args, 1).upper() != b"ACKS":
        raise errors.rpush_only_acks()
    acks = [_parse_ack(raw) for raw in (args[2:] or [b""])]
    consumer = session.consumer
    if consumer is None:
        raise errors.no_consumer(session.id)
    for _, _, offset in acks:
        position = wrap_int64(offset + 1)  # Go's int64 arithmetic, as in Rafka
        if position < 0:
            raise errors.negative_offset(position)
    for topic, partition, offset in acks:
        try:
            consumer.ack(topic, partition, offset)
        except AckError as error:
            raise errors.from_engine(error) from None
    return len(acks)
