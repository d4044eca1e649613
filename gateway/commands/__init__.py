"""Command handlers, one module per family, and the dispatcher."""

from __future__ import annotations

from gateway import errors
from gateway.commands.base import Answer, CommandSpec, text
from gateway.commands.table import COMMANDS
from gateway.session import Session

__all__ = ["COMMANDS", "dispatch"]

# The spellings clients really send (upper and lower case) -> spec, so that the common
# case skips upper-casing the name; anything else is upper-cased and looked up.
_BY_SPELLING: dict[bytes, CommandSpec] = {
    **{name.lower(): spec for name, spec in COMMANDS.items()},
    **COMMANDS,
}


def dispatch(session: Session, args: list[bytes]) -> Answer:
    """Run one command: its reply, or an awaitable for commands that wait.

    Raises errors.RespError for an error reply.
    """
    if not args:
        raise errors.not_supported("")  # `*0`: Rafka's text, trailing space included
    spec = _BY_SPELLING.get(args[0])
    if spec is None:
        name = args[0].upper()
        spec = COMMANDS.get(name)
    if not session.authenticated and (spec is None or not spec.no_auth):
        raise errors.noauth()
    monitors = session.ctx.monitors
    if monitors.registered:
        monitors.publish(session.id, args)
    if spec is None:
        raise errors.not_supported(text(name))
    return spec.handler(session, args)
