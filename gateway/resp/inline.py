"""Inline (telnet) command lines split into arguments, by Redis's rules."""

from __future__ import annotations

import re
from typing import Final

from gateway.resp.errors import UNBALANCED_QUOTES, ProtocolError

# Bytes that end an unquoted argument in sdssplitargs, and C isspace() for blanks.
_ARG_END: Final = frozenset(b" \n\r\t")
_C_SPACE: Final = frozenset(b" \t\n\v\f\r")
_HEX: Final = frozenset(b"0123456789abcdefABCDEF")
_ESCAPES: Final = {ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("b"): 8, ord("a"): 7}
# Lines without these bytes split exactly like bytes.split() (on ASCII whitespace).
_NEEDS_SDSSPLIT: Final = re.compile(rb"[\"'\v\f]")
_EOL: Final = -1  # what _sdssplitargs reads past the end of the line


def split_inline(line: bytes) -> list[bytes]:
    """Split an inline command line the way Redis's ``sdssplitargs`` does.

    ``line`` excludes the line terminator. Raises ProtocolError on unbalanced quotes.
    """
    if _NEEDS_SDSSPLIT.search(line) is None:
        return line.split()
    return _sdssplitargs(line)


def _sdssplitargs(line: bytes) -> list[bytes]:
    """A port of Redis's sdssplitargs, made binary-safe.

    Redis works on a C string, so a NUL byte would end the line; worse, Redis 7 finds
    the newline with strchr() and so never answers an inline line holding a NUL. Here
    NUL is an ordinary byte. Everything else follows Redis exactly: blanks between
    arguments are C isspace() (including \\v and \\f), but only space, \\t, \\r
    and \\n end an unquoted argument; quotes may start mid-argument (``a"b c"`` is
    ``ab c``); a closing quote must be followed by a blank or the end of the line.
    """
    size = len(line)

    def at(i: int) -> int:
        return line[i] if i < size else _EOL

    args: list[bytes] = []
    p = 0
    while True:
        while at(p) in _C_SPACE:
            p += 1
        if p >= size:
            return args
        quote = 0  # the quote (0x22 or 0x27) of the quoted part being read, if any
        done = False
        current = bytearray()
        while not done:
            c = at(p)
            if quote == 0x22 and c == 0x5C:
                if at(p + 1) == 0x78 and at(p + 2) in _HEX and at(p + 3) in _HEX:
                    current.append(int(line[p + 2 : p + 4], 16))
                    p += 3
                elif p + 1 < size:
                    p += 1
                    current.append(_ESCAPES.get(line[p], line[p]))
                else:  # a backslash ending the line: the quote is never closed
                    raise ProtocolError(UNBALANCED_QUOTES)
            elif quote == 0x27 and c == 0x5C and at(p + 1) == 0x27:
                p += 1
                current.append(0x27)
            elif quote:
                if c == quote:
                    if p + 1 < size and line[p + 1] not in _C_SPACE:
                        raise ProtocolError(UNBALANCED_QUOTES)
                    done = True
                elif c == _EOL:
                    raise ProtocolError(UNBALANCED_QUOTES)
                else:
                    current.append(c)
            elif c == _EOL or c in _ARG_END:
                done = True
            elif c in (0x22, 0x27):
                quote = c
            else:
                current.append(c)
            p += 1
        args.append(bytes(current))
