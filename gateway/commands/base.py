"""What a command handler is, and small helpers shared by the command modules."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gateway.resp import Reply
from gateway.session import Session

# What a handler returns: the reply, or an awaitable of it for commands that wait (BLPOP,
# DUMP, KEYS). A handler raises gateway.errors.RespError for an error reply.
Answer = Reply | Awaitable[Reply]
Handler = Callable[[Session, list[bytes]], Answer]


@dataclass(frozen=True)
class Argument:
    """One argument, as COMMAND DOCS describes it."""

    name: str
    type: str = "string"
    optional: bool = False
    multiple: bool = False
    # The literal word before the value (`SETNAME` in `SETNAME <name>`), as Redis documents.
    token: str | None = None
    # The parts of a "block" argument; redis-cli crashes on a block without them.
    arguments: tuple[Argument, ...] = ()


@dataclass(frozen=True)
class CommandSpec:
    name: str
    handler: Handler
    # Redis convention: N = exactly N words with the name, -N = at least N.
    arity: int
    flags: tuple[str, ...]
    summary: str
    group: str
    arguments: tuple[Argument, ...] = ()
    first_key: int = 0
    last_key: int = 0
    key_step: int = 0
    # Served before AUTH when a password is configured.
    no_auth: bool = False


def text(raw: bytes) -> str:
    """Client bytes as text for ids, topics and error messages (never fails)."""
    return raw.decode("utf-8", "replace")


def arg(args: list[bytes], index: int) -> bytes:
    """Argument `index`, or b"" when missing (Rafka reads missing arguments as empty)."""
    return args[index] if index < len(args) else b""
