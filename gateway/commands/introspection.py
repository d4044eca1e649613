"""COMMAND, COMMAND COUNT, COMMAND INFO, COMMAND DOCS: enough for redis-cli and clients."""

from __future__ import annotations

from gateway import errors
from gateway.commands.base import Argument, CommandSpec, Reply, arg, text
from gateway.resp import SimpleString
from gateway.session import Session


def _table() -> dict[bytes, CommandSpec]:
    from gateway.commands.table import COMMANDS  # the table imports this module

    return COMMANDS


def _info(spec: CommandSpec) -> Reply:
    # Redis 7 layout: name, arity, flags, first key, last key, step, ACL categories,
    # tips, key specs, subcommands.
    return [
        spec.name.lower().encode(),
        spec.arity,
        [SimpleString(flag) for flag in spec.flags],
        spec.first_key,
        spec.last_key,
        spec.key_step,
        [],
        [],
        [],
        [],
    ]


def _argument_docs(argument: Argument) -> dict[str, Reply]:
    # redis-cli 7 builds its hints from these maps and dereferences display_text and a
    # block's nested arguments without checking (SIGSEGV), so send them as Redis does.
    entry: dict[str, Reply] = {
        "name": argument.name,
        "type": argument.type,
        "display_text": argument.name,
    }
    if argument.token is not None:
        entry["token"] = argument.token
    flags = [
        flag
        for flag, on in (("optional", argument.optional), ("multiple", argument.multiple))
        if on
    ]
    if flags:
        entry["flags"] = [SimpleString(flag) for flag in flags]
    if argument.arguments:
        entry["arguments"] = [_argument_docs(part) for part in argument.arguments]
    return entry


def _docs(spec: CommandSpec) -> Reply:
    return {
        "summary": spec.summary,
        "since": "0.1.0",
        "group": spec.group,
        "complexity": "O(1)",
        "arguments": [_argument_docs(argument) for argument in spec.arguments],
    }


def _selected(args: list[bytes]) -> list[tuple[bytes, CommandSpec | None]]:
    table = _table()
    if len(args) <= 2:
        return [(name, spec) for name, spec in table.items()]
    return [(name.upper(), table.get(name.upper())) for name in args[2:]]


def command(session: Session, args: list[bytes]) -> Reply:
    if len(args) == 1:
        return [_info(spec) for spec in _table().values()]
    sub = text(arg(args, 1)).upper()
    if sub == "COUNT":
        return len(_table())
    if sub == "INFO":
        return [None if spec is None else _info(spec) for _, spec in _selected(args)]
    if sub == "DOCS":
        return {
            name.decode().lower(): _docs(spec) for name, spec in _selected(args) if spec is not None
        }
    raise errors.not_supported(sub)
