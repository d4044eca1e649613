"""Go's `strconv.ParseInt` as Go 1.11 behaved, for Rafka's exact ack error texts.

Rafka parses the ack partition with `ParseInt(s, 10, 32)` and the offset with
`ParseInt(s, 0, 64)` (base auto-detection: `0x` hex, leading `0` octal, no `0o`/`0b`
and no underscores in Go 1.11). Errors read
`strconv.ParseInt: parsing "<s quoted as Go does>": invalid syntax` or
`...: value out of range`.
"""

from __future__ import annotations

import string

_DIGITS = {c: i for i, c in enumerate(string.digits + string.ascii_lowercase)}
_MAX_UINT64 = (1 << 64) - 1
_SHORT_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    "\\": "\\\\",
    '"': '\\"',
}


class GoParseError(ValueError):
    """`str(error)` is Go's NumError text."""


def go_quote(raw: bytes) -> str:
    """Go's strconv.Quote: printable runes kept, others escaped, bad UTF-8 as \\xNN."""
    out = ['"']
    text = raw.decode("utf-8", errors="surrogateescape")
    for char in text:
        code = ord(char)
        if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte (surrogateescape)
            out.append(f"\\x{code - 0xDC00:02x}")
        elif char in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[char])
        elif char.isprintable():
            out.append(char)
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def _error(raw: bytes, reason: str) -> GoParseError:
    return GoParseError(f"strconv.ParseInt: parsing {go_quote(raw)}: {reason}")


def parse_int(raw: bytes, base: int, bit_size: int) -> int:
    """Go 1.11 strconv.ParseInt(raw, base, bit_size); base 0 auto-detects 0x / 0."""
    text = raw.decode("latin-1")
    if not text:
        raise _error(raw, "invalid syntax")
    negative = False
    if text[0] == "+":
        text = text[1:]
    elif text[0] == "-":
        negative = True
        text = text[1:]
    if not text:
        raise _error(raw, "invalid syntax")
    if base == 0:
        if text[0] == "0" and len(text) > 1 and text[1] in "xX":
            if len(text) < 3:
                raise _error(raw, "invalid syntax")
            base, text = 16, text[2:]
        elif text[0] == "0":
            base, text = 8, text[1:]
        else:
            base = 10
    # ParseUint's loop: a bad digit is a syntax error, overflow a range error, whichever
    # comes first from the left. ParseInt passes its bit size on: overflow is past
    # 1<<bit_size - 1 (4294967295 for the 32-bit partition), not past 1<<64 - 1.
    cutoff = _MAX_UINT64 // base + 1
    max_value = (1 << bit_size) - 1
    value = 0
    for char in text:
        digit = _DIGITS.get(char.lower())
        if digit is None or digit >= base:
            raise _error(raw, "invalid syntax")
        if value >= cutoff:
            raise _error(raw, "value out of range")
        value = value * base + digit
        if value > max_value:
            raise _error(raw, "value out of range")
    limit = 1 << (bit_size - 1)
    if (not negative and value >= limit) or (negative and value > limit):
        raise _error(raw, "value out of range")
    return -value if negative else value


def wrap_int64(value: int) -> int:
    """Two's-complement wrap-around, as Go's int64 arithmetic does."""
    return (value + (1 << 63)) % (1 << 64) - (1 << 63)
