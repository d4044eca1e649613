"""Connection commands: PING, ECHO, QUIT, CLIENT, HELLO, AUTH, SELECT."""

from __future__ import annotations

import asyncio

import structlog

from gateway import __version__, errors
from gateway import auth as users
from gateway.commands.base import Answer, Reply, arg, text
from gateway.resp import SimpleString
from gateway.session import Session

log = structlog.get_logger("rafka.gateway.auth")

OK = SimpleString("OK")
# Rafka answers SETNAME and QUIT with a bulk "OK", not +OK (spec §1.3).
BULK_OK = b"OK"


def ping(session: Session, args: list[bytes]) -> Reply:
    # Rafka ignores arguments (no echo, unlike Redis).
    return SimpleString("PONG")


def echo(session: Session, args: list[bytes]) -> Reply:
    # Not one of Rafka's commands, but `redis-cli --pipe` ends its input with ECHO and a
    # random marker, and waits for that marker to come back before it exits.
    if len(args) != 2:
        raise errors.wrong_arity("echo")
    return args[1]


def quit_(session: Session, args: list[bytes]) -> Reply:
    session.quit = True
    return BULK_OK


def client(session: Session, args: list[bytes]) -> Reply:
    sub = text(arg(args, 1)).upper()
    if sub == "SETNAME":
        session.set_name(text(arg(args, 2)))
        return BULK_OK
    if sub == "GETNAME":
        return session.id.encode()
    if sub == "ID":
        return session.number
    if sub == "SETINFO":
        # Sent by current clients on connect; we keep nothing of it.
        return OK
    raise errors.not_supported(sub)


def _log_in(session: Session, user: str, password: bytes) -> bool:
    """Check the credentials; True authenticates the session. The password is never
    logged, nor a user name that is not configured (it may be a mistyped password)."""
    config = session.ctx.config
    if users.check(config, user, password):
        session.authenticated = True
        return True
    shown = user if users.known_user(config, user) else "(unknown)"
    log.warning("authentication failed", client=session.id, user=shown)
    return False


async def _refused(delay: float) -> Reply:
    """WRONGPASS after the configured pause: this connection waits, the others are
    served meanwhile (a waiting command, as BLPOP)."""
    await asyncio.sleep(delay)
    raise errors.wrongpass()


def _refuse(session: Session) -> Answer:
    delay = session.ctx.config.auth_failure_delay
    if delay > 0:
        return _refused(delay)
    raise errors.wrongpass()


def auth(session: Session, args: list[bytes]) -> Answer:
    if len(args) not in (2, 3):
        raise errors.wrong_arity("auth")
    config = session.ctx.config
    if len(args) == 2 and not config.auth_required:
        raise errors.auth_not_configured()
    user = text(args[1]) if len(args) == 3 else users.DEFAULT_USER
    if not _log_in(session, user, args[-1]):
        return _refuse(session)
    return OK


def hello(session: Session, args: list[bytes]) -> Answer:
    """HELLO [protover [AUTH user pass] [SETNAME name]], checked in Redis's order."""
    version: int | None = None
    if len(args) >= 2:
        try:
            version = int(args[1])
        except ValueError:
            raise errors.protocol_not_integer() from None
        if version not in (2, 3):
            raise errors.noproto()
    credentials: tuple[str, bytes] | None = None
    name: str | None = None
    index = 2
    while index < len(args):
        option = text(args[index])
        remaining = len(args) - index - 1
        if option.upper() == "AUTH" and remaining >= 2:
            credentials = (text(args[index + 1]), args[index + 2])
            index += 3
        elif option.upper() == "SETNAME" and remaining >= 1:
            name = text(args[index + 1])
            index += 2
        else:
            raise errors.hello_syntax(option)
    if credentials is not None and not _log_in(session, *credentials):
        return _refuse(session)
    if not session.authenticated:
        raise errors.hello_noauth()
    if name is not None:
        session.set_name(name)
    if version is not None:
        session.protocol = version
    return {
        "server": "rafka",
        "version": __version__,
        "proto": session.protocol,
        "id": session.number,
        "mode": "standalone",
        "role": "master",
        "modules": [],
    }


def select(session: Session, args: list[bytes]) -> Reply:
    if len(args) != 2:
        raise errors.wrong_arity("select")
    try:
        index = int(args[1])
    except ValueError:
        raise errors.not_an_integer() from None
    if index != 0:
        raise errors.db_out_of_range()
    return OK
