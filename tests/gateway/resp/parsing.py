"""Parsing byte streams in every way they can arrive, for the request parser tests."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from gateway.resp import ParserLimits, ProtocolError, RequestParser, make_parser

Outcome = tuple[list[list[bytes]], str | None]  # commands, then the error text if any
MakeParser = Callable[..., RequestParser]

# Every request parser the gateway can run, by name (each takes the limits): pure Python,
# and hiredis-backed with its runs of one command read in C (`_repeat.c`) or in Python.
PARSERS: dict[str, MakeParser] = {
    "python": partial(make_parser, use_hiredis=False),
    "hiredis": partial(make_parser, use_hiredis=True, repeat_in_c=True),
    "hiredis-python-repeat": partial(make_parser, use_hiredis=True, repeat_in_c=False),
}
HIREDIS = [name for name in PARSERS if name != "python"]  # those with hiredis's fast path

DEFAULT_LIMITS = ParserLimits()
RAFKA_LIMITS = ParserLimits(max_arguments=20)  # the original Rafka's argument limit


def feed_pieces(
    parser: RequestParser,
    pieces: list[bytes],
    after_read: Callable[[bytes], None] | None = None,
) -> Outcome:
    """Feed the pieces one read at a time, taking every complete command after each (then
    calling `after_read(piece)`, if given)."""
    commands: list[list[bytes]] = []
    try:
        for piece in pieces:
            parser.feed(piece)
            while (command := parser.get_command()) is not None or parser.more:
                if command is not None:
                    commands.append(command)
            if after_read is not None:
                after_read(piece)
    except ProtocolError as error:
        return commands, str(error)
    return commands, None


def parse(make: MakeParser, data: bytes, limits: ParserLimits = DEFAULT_LIMITS) -> Outcome:
    """Parse data whole, byte by byte and in two reads split at every position; all the
    ways must agree (only inputs under 2 kB get the every-position split)."""
    whole = feed_pieces(make(limits), [data])
    splits = [[data[i : i + 1] for i in range(len(data))]]
    if len(data) < 2048:
        splits += [[data[:i], data[i:]] for i in range(1, len(data))]
    for pieces in splits:
        assert feed_pieces(make(limits), pieces) == whole, f"split {[len(p) for p in pieces]}"
    return whole


def commands_of(make: MakeParser, data: bytes, limits: ParserLimits = DEFAULT_LIMITS) -> list:
    commands, error = parse(make, data, limits)
    assert error is None, f"unexpected protocol error {error!r}"
    return commands


def error_of(make: MakeParser, data: bytes, limits: ParserLimits = DEFAULT_LIMITS) -> str:
    commands, error = parse(make, data, limits)
    assert error is not None, f"no protocol error; parsed {commands!r}"
    return error


def multibulk(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%b\r\n" % (len(a), a) for a in args)
