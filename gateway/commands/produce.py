"""The producing side: RPUSHX (produce) and DUMP (wait for this session's records)."""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from typing import Protocol, TypeAlias

import structlog

from backends.base import (
    ProduceError,
    Producer,
    ProducerCreationError,
    QueueFullError,
    Run,
)
from gateway import errors
from gateway.commands.base import Answer, Reply
from gateway.goparse import GoParseError, parse_int
from gateway.session import Session

log = structlog.get_logger("rafka.gateway.server")


def session_producer(session: Session) -> Producer:
    """The session's producer, created on first use (raises `PROD Error spawning ...`)."""
    if session.producer is None:
        try:
            session.producer = session.ctx.engine.producer(session.id)
        except ProducerCreationError as error:
            raise errors.from_engine(error) from None
    return session.producer


Target = tuple[str, bytes | None]  # an RPUSHX key's topic and partition key
# RPUSHX key bytes -> its target: clients send the same few keys over and over. Bounded:
# cleared when full, so a client cycling through keys costs a re-parse.
_TARGETS: dict[bytes, Target] = {}
_TARGETS_MAX = 4096
_TARGET_KEY_MAX = 1024  # bytes of an RPUSHX key worth caching


def _target(raw: bytes) -> Target:
    """`<prefix>:<topic>[:<key>]` -> (topic, key); raises the PROD form error."""
    parts = raw.split(b":")
    if len(parts) not in (2, 3):
        raise errors.rpushx_form()
    # Rafka does not check the prefix: `x:foo` produces to `foo` too.
    try:
        topic = parts[1].decode("utf-8")
    except UnicodeDecodeError:  # as text(), two names would have been one topic
        raise errors.invalid_topic() from None
    target = (topic, parts[2] if len(parts) == 3 else None)
    if len(raw) <= _TARGET_KEY_MAX:  # a few keys of 32 MB each must not stay here
        if len(_TARGETS) >= _TARGETS_MAX:
            _TARGETS.clear()
        _TARGETS[raw] = target
    return target


def rpushx(session: Session, args: list[bytes]) -> Answer:
    """RPUSHX <prefix>:<topic>[:<key>] <message> [<message> ...] -> messages enqueued."""
    count = len(args) - 2
    if count < 1:
        raise errors.rpushx_arity(count + 1)
    topic, key = _TARGETS.get(args[1]) or _target(args[1])
    producer = session.producer
    if producer is None:
        producer = session_producer(session)
    try:
        if count == 1:  # produce() is cheaper than produce_many() for one value
            producer.produce(topic, key, args[2])
        else:
            # On a refusal the values before it stay enqueued, as with one call each.
            producer.produce_many(topic, key, args[2:])
    except QueueFullError as full:
        return _queue_full(session, producer, topic, key, args, full)
    except ProduceError as error:
        raise errors.from_engine(error) from None
    return count


# What rpushx_run answers for one command: its reply, or the error to answer.
RunAnswer: TypeAlias = "Answer | errors.RespError"


class Pipeline(Protocol):
    """Where rpushx_run takes the commands parsed behind the first (the connection's
    parser: gateway.resp.requests.RequestParser)."""

    def next_named(self, name: bytes) -> list[bytes] | None: ...

    def give_back(self, commands: Sequence[list[bytes]]) -> None: ...


def rpushx_run(session: Session, args: list[bytes], pipeline: Pipeline) -> list[RunAnswer]:
    """RPUSHX `args`, then each RPUSHX (the same command name, any key) already parsed
    behind it, exactly as one rpushx() each (which the connection may call in their
    place once it knows no MONITOR, latency clock or AUTH needs to see each command): the
    answers in order. The last answer may be one that waits (room in the queue); then no
    command after it was taken.

    Paid once per batch of commands instead of per command: the connection's dispatch,
    the session's producer look-up and the engine's produce call (`_produce_batch`); a
    key's parsing once per change of key (a pipeline over 1,000 topics changes it at
    every command)."""
    answers: list[RunAnswer] = []
    name = args[0]
    # Batches are produced together until one is refused: the commands behind the
    # refusal, given back, then run one by one (taken again as a batch each time, a
    # pipeline of n commands that all find the queue full would cost n * n / 2).
    together = True
    while True:
        try:
            # In rpushx()'s order: the key's form, then the session's producer.
            target = _TARGETS.get(args[1]) or _target(args[1])
            producer = session.producer
            if producer is None:
                producer = session_producer(session)
        except errors.RespError as error:  # the key's form, or no producer: as rpushx()
            answers.append(error)
        except Exception:  # as the connection answers a command that failed
            log.exception("command failed", client=session.id, command=[name])
            answers.append(errors.internal_error())
        else:
            ran = _produce_batch(session, producer, target, args, pipeline, together, answers)
            if ran is _Ran.WAITS:
                return answers  # it waits: the commands behind it run after it
            together = ran is _Ran.ALL
        after = pipeline.next_named(name)
        if after is None:
            return answers
        args = after


class _Ran(enum.Enum):
    """What _produce_batch did with its batch."""

    ALL = enum.auto()  # every command's values enqueued
    REFUSED = enum.auto()  # one answered with an error; those after it given back
    WAITS = enum.auto()  # one waits for room (the last answer); those after it given back


def _produce_batch(
    session: Session,
    producer: Producer,
    target: Target,
    first: list[bytes],
    pipeline: Pipeline,
    together: bool,
    answers: list[RunAnswer],
) -> _Ran:
    """RPUSHX `first` to `target` and, when `together`, the RPUSHX right behind it up to
    one whose key does not parse (taken here), produced with one engine call, each
    answered as if run alone: those before a refused value with their counts; the one
    holding it with the refusal, which may wait for room; the ones after it are given
    back to the pipeline, to run as if they came next.

    The values are gathered by key: `redis-benchmark -P 16` sends 16 RPUSHX to one key
    per read, one run of 16 values; a pipeline round-robin over 100 topics, 100 runs
    (`Producer.produce_grouped`), each topic's values in one, when each topic has one key
    in the batch and the engine takes them all at once; else the commands to one key in
    a row make one run, all in one call (`Producer.produce_runs`), a run per value
    round-robin."""
    values = first[2:]
    raw_key = first[1]
    groups = {raw_key: (target, values)}  # raw key -> its target and values, in order
    changes = 0  # of key from one command to the next: runs in order, less one
    batch = [first]
    single = len(first) == 3  # one value each, as redis-benchmark's
    if together:
        name = first[0]
        next_named = pipeline.next_named
        while (after := next_named(name)) is not None:
            if after[1] != raw_key:
                group = groups.get(after[1])
                if group is None:
                    next_target = _TARGETS.get(after[1])
                    if next_target is None:
                        try:
                            next_target = _target(after[1])
                        except errors.RespError:  # answered with its error once these ran
                            pipeline.give_back([after])
                            break
                    group = groups[after[1]] = (next_target, [])
                raw_key = after[1]
                changes += 1
                values = group[1]
            if len(after) == 3:
                values.append(after[2])
            else:
                values.extend(after[2:])
                single = False
            batch.append(after)
    try:
        if len(groups) > 1:
            runs: list[Run] = [(*group_target, held) for group_target, held in groups.values()]
            if not (len({run[0] for run in runs}) == len(runs) and producer.produce_grouped(runs)):
                # In order, so that a refusal falls between two commands as it would
                # have when each ran alone.
                in_order = runs if changes < len(runs) else _runs_in_order(batch, groups)
                producer.produce_runs(in_order)
        elif len(values) == 1:  # produce() is cheaper than produce_many() for one value
            producer.produce(*target, values[0])
        else:
            producer.produce_many(*target, values)
    except ProduceError as refused:
        counts = [len(command) - 2 for command in batch]
        at = before = 0  # the command holding the refused value, and the values before it
        while at < len(batch) - 1 and before + counts[at] <= refused.enqueued:
            before += counts[at]
            at += 1
        answers.extend(counts[:at])
        if at + 1 < len(batch):
            pipeline.give_back(batch[at + 1 :])
        if not isinstance(refused, QueueFullError):
            answers.append(errors.from_engine(refused))
            return _Ran.REFUSED
        full = QueueFullError(str(refused), refused.enqueued - before)
        held = batch[at]
        topic, key = _TARGETS.get(held[1]) or _target(held[1])
        try:
            answer = _queue_full(session, producer, topic, key, held, full)
        except errors.RespError as error:
            answers.append(error)
            return _Ran.REFUSED
        answers.append(answer)
        return _Ran.WAITS
    except Exception:  # as the connection answers a command that failed, each of them
        log.exception("command failed", client=session.id, command=first[:1])
        answers.extend(errors.internal_error() for _ in batch)
        return _Ran.REFUSED
    if single:
        answers.extend([1] * len(batch))
    else:
        answers.extend([len(command) - 2 for command in batch])
    return _Ran.ALL


def _runs_in_order(
    batch: list[list[bytes]], groups: dict[bytes, tuple[Target, list[bytes]]]
) -> list[Run]:
    """The values of `batch` (RPUSHX commands, their keys' targets in `groups`), the
    commands to one key in a row in one run."""
    runs: list[Run] = []
    raw_key = None
    values: list[bytes] = []
    for command in batch:
        if command[1] != raw_key:
            raw_key = command[1]
            values = []
            runs.append((*groups[raw_key][0], values))
        values.extend(command[2:])
    return runs


def _queue_full(
    session: Session,
    producer: Producer,
    topic: str,
    key: bytes | None,
    args: list[bytes],
    full: QueueFullError,
) -> Answer:
    """RPUSHX `args` was refused with the queue full after `full.enqueued` values: wait
    for room (see _when_room), or Rafka's error at once without a bound."""
    bound = session.ctx.config.produce_block_timeout
    if bound <= 0:
        raise errors.from_engine(full) from None
    session.stop_reading = True
    return _when_room(session, producer, topic, key, args[2 + full.enqueued :], len(args) - 2)


async def _when_room(
    session: Session,
    producer: Producer,
    topic: str,
    key: bytes | None,
    values: Sequence[bytes],
    count: int,
) -> Reply:
    """Backpressure, as Kafka's producers block up to max.block.ms: queue the rest of the
    values as room comes (the connection reads nothing meanwhile); after
    `produce_block_timeout` without room, Rafka's `PROD Local: Queue full`."""
    # The clock, not loop.time(): uvloop's is read at the start of a loop pass, in ms, so
    # a bound measured with it could end a little before the bound had passed.
    deadline = time.monotonic() + session.ctx.config.produce_block_timeout
    try:
        while True:
            # Tried first: room that came between the refusal and this task's start (the
            # ACKs delivered while the loop ran the refused command) woke no one.
            try:
                producer.produce_many(topic, key, values)
                return count
            except QueueFullError as full:
                values = values[full.enqueued :]
                if time.monotonic() >= deadline:
                    raise errors.from_engine(full) from None
            except ProduceError as error:
                raise errors.from_engine(error) from None
            await producer.wait_for_room(deadline - time.monotonic())
    finally:
        session.stop_reading = False


def dump(session: Session, args: list[bytes]) -> Answer:
    """DUMP <timeout ms> -> how many of this session's records are still outstanding."""
    producer = session.producer
    if producer is None:
        return 0  # before the argument checks, as in Rafka
    if len(args) != 2:
        raise errors.dump_arity(len(args) - 1)
    try:
        millis = parse_int(args[1], 10, 64)
    except GoParseError:
        raise errors.dump_nan() from None
    return producer.flush(max(millis, 0) / 1000)
