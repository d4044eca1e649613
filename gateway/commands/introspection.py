"""COMMAND, COMMAND COUNT, COMMAND INFO, COMMAND DOCS: enough for redis-cli and clients.

`describe` answers from the table it is given: the command table, which lists COMMAND
itself, passes itself in (so this module needs nothing of it).
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway import errors
from gateway.commands.base import Argument, CommandSpec, Reply, arg, text
from gateway.resp import SimpleString


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


def _selected(
    table: Mapping[bytes, CommandSpec], args: list[bytes]
) -> list[tuple[bytes, CommandSpec | None]]:
    if len(args) <= 2:
        return [(name, spec) for name, spec in table.items()]
    return [(name.upper(), table.get(name.upper())) for name in args[2:]]


def describe(table: Mapping[bytes, CommandSpec], args: list[bytes]) -> Reply:
    """The reply to `COMMAND [COUNT | INFO [name ...] | DOCS [name ...]]` about `table`."""
    if len(args) == 1:
        return [_info(spec) for spec in table.values()]
    sub = text(arg(args, 1)).upper()
    if sub == "COUNT":
        return len(table)
    if sub == "INFO":
        return [None if spec is None else _info(spec) for _, spec in _selected(table, args)]
    if sub == "DOCS":
        return {
            name.decode().lower(): _docs(spec)
            for name, spec in _selected(table, args)
            if spec is not None
        }
    raise errors.not_supported(sub)
