"""Reply values -> RESP2/RESP3 bytes.

``encode`` turns a reply value into RESP2 or RESP3 bytes (see its docstring);
``encode_many`` joins the replies of one read into one buffer for one write;
``encode_into`` appends one reply's parts to a list, for a caller that joins them.
Error replies are framed here only (never by hand elsewhere), so that every one follows
the same rules. (MONITOR's lines are the monitor's own format: gateway/monitor.py.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, TypeAlias


class SimpleString(str):
    """A status reply: ``+<text>\\r\\n`` (e.g. ``SimpleString("OK")``, ``"PONG"``)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """An error reply ``-<text>\\r\\n``; the text carries its own prefix (``CONS …``)."""

    text: str


@dataclass(slots=True)
class Encoded:
    """A reply already in RESP, framed for the connection's protocol by the one who made
    it (e.g. a batch of consumed records, encoded in one pass): written as it is.

    It holds the bytes rather than being a bytes subclass: making a subclass instance
    copies the data, and joining a lone one into a write copies it again (bytes.join
    hands back only an exact bytes object as it is). Not frozen: a frozen dataclass's
    __init__ sets its field through object.__setattr__, 0.1 us more per BLPOP."""

    data: bytes


class _NullArray:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NULL_ARRAY"

    def __reduce__(self) -> str:
        return "NULL_ARRAY"


NULL_ARRAY: Final = _NullArray()
"""The null array: ``*-1`` in RESP2 (Rafka's BLPOP timeout), ``_`` in RESP3."""

Reply: TypeAlias = (
    bool
    | int
    | float
    | bytes
    | str
    | SimpleString
    | Encoded
    | ErrorReply
    | list[Any]
    | tuple[Any, ...]
    | dict[Any, Any]
    | _NullArray
    | None
)


def _line(text: str) -> bytes:
    # A status or error line must not break the framing: Redis also turns CR and LF
    # into spaces (error texts can echo client input, e.g. a BLPOP key).
    return text.replace("\r", " ").replace("\n", " ").encode("utf-8", "surrogateescape")


def _float_text(value: float) -> bytes:
    # repr() is the shortest round-trip form; "inf", "-inf", "nan" are RESP3's spellings.
    return repr(value).encode("ascii")


_CACHED_INTS = 1024
_SMALL_INTS: tuple[bytes, ...] = tuple(b":%d\r\n" % n for n in range(_CACHED_INTS))


def _encode_into(reply: Any, protocol: int, out: list[bytes]) -> None:
    # Dispatch on the exact type first: bytes, int and list are the hot cases.
    kind = type(reply)
    if kind is bytes:
        out.append(b"$%d\r\n%b\r\n" % (len(reply), reply))
    elif kind is int:
        # RPUSHX's and RPUSH acks' counts: small, and one per pipelined command.
        out.append(_SMALL_INTS[reply] if 0 <= reply < _CACHED_INTS else b":%d\r\n" % reply)
    elif kind is Encoded:
        out.append(reply.data)
    elif kind is list or kind is tuple:
        out.append(b"*%d\r\n" % len(reply))
        for item in reply:
            _encode_into(item, protocol, out)
    elif reply is None:
        out.append(b"_\r\n" if protocol >= 3 else b"$-1\r\n")
    elif isinstance(reply, SimpleString):
        out.append(b"+%b\r\n" % _line(reply))
    elif isinstance(reply, str):
        data = reply.encode("utf-8", "surrogateescape")
        out.append(b"$%d\r\n%b\r\n" % (len(data), data))
    elif isinstance(reply, bool):
        if protocol >= 3:
            out.append(b"#t\r\n" if reply else b"#f\r\n")
        else:
            out.append(b":1\r\n" if reply else b":0\r\n")
    elif isinstance(reply, int):  # int subclasses (IntEnum, …)
        out.append(b":%d\r\n" % reply)
    elif isinstance(reply, ErrorReply):
        out.append(b"-%b\r\n" % _line(reply.text))
    elif reply is NULL_ARRAY:
        out.append(b"_\r\n" if protocol >= 3 else b"*-1\r\n")
    elif isinstance(reply, float):
        text = _float_text(reply)
        if protocol >= 3:
            out.append(b",%b\r\n" % text)
        else:
            out.append(b"$%d\r\n%b\r\n" % (len(text), text))
    elif isinstance(reply, dict):
        if protocol >= 3:
            out.append(b"%%%d\r\n" % len(reply))
        else:
            out.append(b"*%d\r\n" % (2 * len(reply)))
        for key, value in reply.items():
            _encode_into(key, protocol, out)
            _encode_into(value, protocol, out)
    elif isinstance(reply, bytes | bytearray | memoryview):
        data = bytes(reply)
        out.append(b"$%d\r\n%b\r\n" % (len(data), data))
    elif isinstance(reply, list | tuple):
        out.append(b"*%d\r\n" % len(reply))
        for item in reply:
            _encode_into(item, protocol, out)
    else:
        raise TypeError(f"cannot encode {kind.__name__} as a RESP reply: {reply!r}")


def encode(reply: Reply, protocol: int = 2) -> bytes:
    """Encode one reply value for RESP2 (``protocol=2``) or RESP3 (``protocol=3``).

    bytes/str -> bulk ``$`` (str as UTF-8); int -> ``:``; None -> RESP2 ``$-1`` /
    RESP3 ``_``; NULL_ARRAY -> RESP2 ``*-1`` / RESP3 ``_``; SimpleString -> ``+``;
    ErrorReply -> ``-``; list/tuple -> ``*`` array; dict -> RESP3 map ``%`` / RESP2 flat
    array of key, value; bool -> RESP3 ``#t``/``#f`` / RESP2 ``:1``/``:0``; float ->
    RESP3 double ``,`` / RESP2 bulk of the same text. Values nest.
    """
    out: list[bytes] = []
    _encode_into(reply, protocol, out)
    return out[0] if len(out) == 1 else b"".join(out)


# encode_into(reply, protocol, out): append the encoding of `reply` to `out` (join the
# parts for one write). The implementation itself: one call per pipelined reply.
encode_into: Callable[[Reply, int, list[bytes]], None] = _encode_into


def encode_many(replies: Iterable[Reply], protocol: int) -> bytes:
    """Encode several replies into one buffer, for one write."""
    out: list[bytes] = []
    for reply in replies:
        _encode_into(reply, protocol, out)
    return b"".join(out)
