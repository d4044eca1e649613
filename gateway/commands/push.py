"""RAFKA.PUSH: the HTTP push subscriptions at run time (docs/push.md).

    RAFKA.PUSH ADD <subscription JSON>   -> +OK
    RAFKA.PUSH LIST                      -> one JSON object per subscription
    RAFKA.PUSH REMOVE <name>             -> +OK

A dotted name, as Redis modules name theirs: it is rafka's own and no Redis command.
"""

from __future__ import annotations

import json

from backends.settings import json_decoder
from gateway import errors
from gateway.commands.base import Answer, Reply, arg, text
from gateway.push.manager import PushError, PushManager
from gateway.push.spec import SubscriptionError, parse_subscription
from gateway.resp import SimpleString
from gateway.session import Session

NAME = "RAFKA.PUSH"


def _manager(session: Session) -> PushManager:
    if session.ctx.push is None:
        raise errors.push_refused("this server runs no push subscriptions")
    return session.ctx.push


def push(session: Session, args: list[bytes]) -> Answer:
    subcommand = text(arg(args, 1)).upper()
    if subcommand == "LIST" and len(args) == 2:
        return _list(_manager(session))
    if subcommand == "ADD" and len(args) == 3:
        return _add(_manager(session), text(args[2]))
    if subcommand == "REMOVE" and len(args) == 3:
        return _remove(_manager(session), text(args[2]))
    if subcommand in ("LIST", "ADD", "REMOVE"):
        raise errors.wrong_arity(f"{NAME}|{subcommand}")
    raise errors.unknown_subcommand(text(arg(args, 1)), NAME)


def _list(manager: PushManager) -> Reply:
    return [
        json.dumps({**subscription.to_json(), "source": source}).encode()
        for subscription, source in manager.listing()
    ]


async def _add(manager: PushManager, raw: str) -> Reply:
    try:
        document = json_decoder().decode(raw)
    except json.JSONDecodeError as error:
        raise errors.push_refused(f"invalid JSON: {error}") from None
    except RecursionError:
        raise errors.push_refused("invalid JSON: nested too deeply") from None
    try:
        subscription = parse_subscription(document)
        await manager.add(subscription)
    except (SubscriptionError, PushError) as error:
        raise errors.push_refused(str(error)) from None
    return SimpleString("OK")


async def _remove(manager: PushManager, name: str) -> Reply:
    try:
        await manager.remove(name)
    except PushError as error:
        raise errors.push_refused(str(error)) from None
    return SimpleString("OK")
