"""Keys on Dafka, whose records carry only a content.

A record produced with a key is sent as `MAGIC + key length (4 bytes, big endian) + key +
value`; a record without one is sent as its value, unchanged, so Dafka's console
consumer and the C programs see the values of keyless records as they were produced
(Rafka's RPUSHX without a key: the usual case). A keyless value that happens to start
with MAGIC is wrapped too (length NO_KEY), so reading is never ambiguous. Other Dafka
consumers see keyed records with their envelope.
"""

from __future__ import annotations

import struct

MAGIC = b"\xffRK\x01"
NO_KEY = 0xFFFFFFFF
_LENGTH = struct.Struct(">I")
_HEADER = len(MAGIC) + _LENGTH.size


def wrap(key: bytes | None, value: bytes) -> bytes:
    if key is None:
        if not value.startswith(MAGIC):
            return value
        return MAGIC + _LENGTH.pack(NO_KEY) + value
    return b"".join((MAGIC, _LENGTH.pack(len(key)), key, value))


def unwrap(content: bytes) -> tuple[bytes | None, bytes]:
    """(key, value) of a record's content; a malformed envelope is taken as a value."""
    if not content.startswith(MAGIC) or len(content) < _HEADER:
        return None, content
    (length,) = _LENGTH.unpack_from(content, len(MAGIC))
    if length == NO_KEY:
        return None, content[_HEADER:]
    end = _HEADER + length
    if end > len(content):
        return None, content
    return content[_HEADER:end], content[end:]
