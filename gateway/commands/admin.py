"""Stats and metadata: HGETALL stats, DEL stats, KEYS topics:, MONITOR."""

from __future__ import annotations

from backends.base import MetadataError
from gateway import errors
from gateway.commands.base import Answer, Reply, arg, text
from gateway.monitor import Monitor
from gateway.resp import SimpleString
from gateway.session import Session


def _check_stats_key(args: list[bytes]) -> None:
    key = text(arg(args, 1)).upper()
    if key != "STATS":
        raise errors.expected_stats_key(key)


def hgetall(session: Session, args: list[bytes]) -> Reply:
    """Every counter as decimal text, Rafka's three first: a flat array in RESP2, a map
    in RESP3."""
    _check_stats_key(args)
    return {name: str(value) for name, value in session.ctx.stats.snapshot().items()}


def del_(session: Session, args: list[bytes]) -> Reply:
    _check_stats_key(args)
    session.ctx.stats.reset()
    return 1


def keys(session: Session, args: list[bytes]) -> Answer:
    pattern = text(arg(args, 1))
    if pattern != "topics:":
        raise errors.expected_topics_argument(pattern)
    return _topics(session)


async def _topics(session: Session) -> Reply:
    try:
        names = await session.ctx.engine.topics()
    except MetadataError as error:
        raise errors.from_engine(error) from None
    return [f"topics:{name}".encode() for name in names]


def monitor(session: Session, args: list[bytes]) -> Reply:
    if len(args) > 1:
        raise errors.monitor_arguments()
    if not session.monitoring and session.writer is not None:
        config = session.ctx.config
        session.start_monitor(
            Monitor(
                session.id, session.writer, config.monitor_queue_size, config.monitor_queue_bytes
            )
        )
    return SimpleString("OK")
