"""Sans-IO RESP protocol: request bytes -> commands, reply values -> RESP2/RESP3 bytes.

No sockets and no asyncio here (modelled on h11): a parser is fed bytes and hands back
complete commands, an encoder turns reply values into bytes. Everything is testable with
byte strings alone.

Requests
--------
A command starting with ``*`` is a multibulk request; anything else is an inline
(telnet) line. The visible error texts are those of Rafka's parser (secmask/go-redisproto),
sent by the server as ``-<text>\\r\\n`` before it closes the connection:

``Expect Number``
    a count or length field (after ``*`` or ``$``, and one optional ``+``/``-``) does not
    start with a digit: ``*x\\r\\n``, ``*\\r\\n``, ``*-\\r\\n``, ``$\\r\\n``, ``$abc\\r\\n``.
``Expect Newline``
    the digits of a field are followed by anything but ``\\r\\n`` (``*2x\\r\\n``,
    ``*2\\n``, ``*2\\r\\r\\n``), or the data of a bulk is not followed by ``\\r\\n``
    (``$3\\r\\nfoobar\\r\\n``). As in go-redisproto the two bytes after bulk data are
    judged once both have arrived.
``Expect TypeChar``
    an argument of a multibulk does not start with ``$``: a missing ``$``
    (``*1\\r\\n3\\r\\nfoo\\r\\n``), inline text where an argument was announced
    (``*2\\r\\nfoo``), an empty line inside a multibulk (``*1\\r\\n\\r\\n``), or a nested
    type (``*1\\r\\n*1\\r\\n…``, ``*1\\r\\n:1\\r\\n``).
``TooManyArg``
    a multibulk count above ``max_arguments`` or below -1, or one whose smallest possible
    encoding (5 bytes per argument) exceeds ``max_query_buffer``.
``Invalid bulk size``
    a bulk length above ``max_bulk_length`` or below -1, or a bulk that would take the
    unfinished command beyond ``max_query_buffer``.
``LineTooLong``
    an inline line (counting a trailing ``\\r``, not the ``\\n``) longer than
    ``max_inline_length``.
``Protocol error: unbalanced quotes in request``
    Redis's text for an inline line that its quoting rules reject.

Where we deliberately differ from go-redisproto:

* Errors are raised as soon as the bytes seen so far cannot start a valid command (the
  digits check reads the field left to right), instead of blocking for more input. The
  decision only depends on the bytes, never on how they were split into reads.
* A count or length field with more than 20 digits (longer than any 64-bit number, so
  never a valid size) is rejected with that field's range error (``TooManyArg`` or
  ``Invalid bulk size``) as soon as the 21st digit arrives; go-redisproto reads digits for
  ever and lets the number wrap. This bounds what one header line can make us buffer.
* ``*-1\\r\\n`` (null multibulk) is skipped without a command and without an error, as
  in Redis (Rafka crashed on it). ``$-1\\r\\n`` inside a multibulk is accepted and reads
  as ``b""`` (Rafka's null-bulk-as-empty). Both use the standard RESP framing, with no
  extra ``\\r\\n`` after them (go-redisproto wanted one more ``\\r\\n`` after each).
* ``*0\\r\\n`` gives the empty command ``[]``; the server answers
  ``-Command not supported: `` as Rafka did.
* Inline commands use Redis's rules instead of Rafka's (which split on single spaces,
  dropped the byte before a bare LF and ignored pipelined lines): CRLF or bare LF ends a
  line; arguments are split on runs of blanks with Redis's ``sdssplitargs`` quoting
  (``"…"`` with ``\\n \\r \\t \\b \\a \\\\ \\" \\xHH`` escapes, ``'…'`` with ``\\'`` only,
  a closing quote must be followed by a blank or the end of the line); a NUL byte is an
  ordinary byte (Redis 7 stalls on it); an empty or blank line is ignored; every
  pipelined line is parsed.
* Numbers may carry a ``+`` sign or leading zeros (go-redisproto accepts them), so
  ``*01\\r\\n$+1\\r\\na\\r\\n`` is ``[b"a"]``.

Bounded buffering: one unfinished command never makes the parser hold more than
``max_query_buffer`` bytes plus the last read. Sizes are checked when a header line is
complete, before any of the data it announces is awaited, and header lines themselves
are at most 23 bytes.

Two implementations give identical results for identical byte streams, however they are
split into reads: ``PythonRequestParser`` (pure Python) and ``HiredisRequestParser``,
which lets ``hiredis.Reader`` parse runs of complete multibulk commands and accepts a
command only when its canonical encoding matches the input bytes exactly and it is within
the limits. Everything else (inline lines, unfinished commands, anything hiredis rejects
or parses differently) goes through the same Python state machine, so the two cannot
disagree. hiredis only ever sees the bytes already received.

Replies
-------
``encode`` turns a reply value into RESP2 or RESP3 bytes (see its docstring);
``encode_many`` joins the replies of one read into one buffer for one write;
``encode_into`` appends one reply's parts to a list, for a caller that joins them.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

try:  # hiredis is a dependency, but the pure-Python parser must work without it
    import hiredis
except ImportError:  # pragma: no cover - exercised only on machines without hiredis
    hiredis = None  # type: ignore[assignment]

__all__ = [
    "NULL_ARRAY",
    "ErrorReply",
    "HiredisRequestParser",
    "ParserLimits",
    "ProtocolError",
    "PythonRequestParser",
    "Reply",
    "RequestParser",
    "SimpleString",
    "encode",
    "encode_into",
    "encode_many",
    "make_parser",
    "split_inline",
]

# The exact error texts (go-redisproto's, plus Redis's for unbalanced quotes).
EXPECT_NUMBER: Final = "Expect Number"
EXPECT_NEWLINE: Final = "Expect Newline"
EXPECT_TYPECHAR: Final = "Expect TypeChar"
TOO_MANY_ARG: Final = "TooManyArg"
INVALID_BULK_SIZE: Final = "Invalid bulk size"
LINE_TOO_LONG: Final = "LineTooLong"
UNBALANCED_QUOTES: Final = "Protocol error: unbalanced quotes in request"

# A count/length field holds an optional sign and at most this many digits.
MAX_DIGITS: Final = 20
# Bytes after the type char in which a valid field must end: sign + digits + CRLF.
_FIELD_WINDOW: Final = 1 + MAX_DIGITS + 2
# Smallest encoding of one multibulk argument: "$-1\r\n".
_MIN_ARG_BYTES: Final = 5

_STAR: Final = 42  # ord("*")
_DOLLAR: Final = 36  # ord("$")
# hiredis is fed at most this much at a time (it memmoves its buffer as it consumes it).
_HIREDIS_STEP: Final = 64 * 1024


@dataclass(frozen=True, slots=True)
class ParserLimits:
    """Limits a client cannot exceed; they keep a hostile client from exhausting memory."""

    max_arguments: int = 1024 * 1024  # Redis-like; Rafka used 20 (configurable)
    max_bulk_length: int = 32_768_000  # Rafka's "32MB"
    max_inline_length: int = 64 * 1024  # Redis's inline limit
    max_query_buffer: int = 64 * 1024 * 1024  # bytes buffered for one unfinished command


class ProtocolError(Exception):
    """A request that breaks the protocol. ``str(e)`` is the exact RESP error text."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


# --------------------------------------------------------------------------- requests


class RequestParser:
    """Interface: feed bytes, take complete commands.

    After a ``ProtocolError`` the parser is unusable: ``get_command`` raises the same
    error again and ``feed`` ignores its data (the server closes the connection).
    """

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Add received bytes (the parser keeps its own copy of a bytearray/memoryview)."""
        raise NotImplementedError

    def get_command(self) -> list[bytes] | None:
        """The next complete command, or None when more data is needed."""
        raise NotImplementedError


def _field_error(field: bytes, range_error: str) -> str | None:
    """Judge a count/length field read so far (the bytes after ``*``/``$``).

    ``field`` may end anywhere, possibly including its ``\\r\\n``. Returns the error text
    once the bytes already decide it, None while they are a valid field or prefix of one.
    The checks go left to right like go-redisproto's readNumber + discardNewLine.
    """
    size = len(field)
    i = 1 if field[:1] in (b"-", b"+") else 0
    if i >= size:
        return None
    if not 48 <= field[i] <= 57:
        return EXPECT_NUMBER
    j = i
    while j < size and 48 <= field[j] <= 57:
        j += 1
    if j - i > MAX_DIGITS:
        return range_error
    if j == size:
        return None
    if field[j] != 13 or (j + 1 < size and field[j + 1] != 10):
        return EXPECT_NEWLINE
    return None


def _read_field(buf: bytes, start: int, end: int, range_error: str) -> tuple[int, int] | None:
    """Read the field starting at ``start`` (just after the type char).

    Returns (value, index after its CRLF), None when more bytes are needed, or raises.
    """
    nl = buf.find(b"\r\n", start, start + _FIELD_WINDOW)
    if nl < 0:
        # Unfinished (or broken) header: the window always decides once it is full.
        error = _field_error(buf[start : min(end, start + _FIELD_WINDOW)], range_error)
        if error is None and end >= start + _FIELD_WINDOW:
            error = range_error  # cannot happen (a full window always decides); never wait
        if error is not None:
            raise ProtocolError(error)
        return None
    digits = buf[start:nl]
    if not digits.isdigit() or len(digits) > MAX_DIGITS:
        error = _field_error(buf[start : nl + 2], range_error)
        if error is not None:
            raise ProtocolError(error)
    return int(digits), nl + 2


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
        in_double = in_single = done = False
        current = bytearray()
        while not done:
            c = at(p)
            if in_double:
                if c == 0x5C and at(p + 1) == 0x78 and at(p + 2) in _HEX and at(p + 3) in _HEX:
                    current.append(int(line[p + 2 : p + 4], 16))
                    p += 3
                elif c == 0x5C and p + 1 < size:
                    p += 1
                    current.append(_ESCAPES.get(line[p], line[p]))
                elif c == 0x22:
                    if p + 1 < size and line[p + 1] not in _C_SPACE:
                        raise ProtocolError(UNBALANCED_QUOTES)
                    done = True
                elif c == _EOL:
                    raise ProtocolError(UNBALANCED_QUOTES)
                else:
                    current.append(c)
            elif in_single:
                if c == 0x5C and at(p + 1) == 0x27:
                    p += 1
                    current.append(0x27)
                elif c == 0x27:
                    if p + 1 < size and line[p + 1] not in _C_SPACE:
                        raise ProtocolError(UNBALANCED_QUOTES)
                    done = True
                elif c == _EOL:
                    raise ProtocolError(UNBALANCED_QUOTES)
                else:
                    current.append(c)
            elif c == _EOL or c in _ARG_END:
                done = True
            elif c == 0x22:
                in_double = True
            elif c == 0x27:
                in_single = True
            else:
                current.append(c)
            p += 1
        args.append(bytes(current))


class PythonRequestParser(RequestParser):
    """Pure-Python incremental parser (a resumable state machine over a bytes buffer)."""

    # The hiredis subclass sets this: parse complete multibulk commands from buf[pos:end],
    # append them to the ready queue and return the position after the last one.
    _fast_path: Callable[[bytes, int, int], int] | None = None

    def __init__(self, limits: ParserLimits = ParserLimits()) -> None:
        self._limits = limits
        self._buf = b""
        self._pos = 0  # start of the first unparsed item in _buf
        # Reads not yet joined to _buf: joining on every read would copy a large
        # unfinished bulk over and over (quadratic), so we wait until it is complete.
        self._chunks: list[bytes] = []
        self._chunked = 0
        self._need = 0  # bytes from _pos needed before parsing can progress
        self._need_newline = False  # an inline line waits for its "\n"
        self._newline_arrived = False
        self._fresh = False  # data arrived since the last parse
        self._args: list[bytes] | None = None  # arguments of an unfinished multibulk
        self._left = 0  # arguments still to read
        self._cmd_bytes = 0  # bytes of the unfinished multibulk before _pos
        self._ready: deque[list[bytes]] = deque()
        self._error: ProtocolError | None = None

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._error is not None or not data:
            return
        data = bytes(data)  # no copy for bytes; a private copy of a bytearray/memoryview
        self._fresh = True
        if not self._chunks and self._pos >= len(self._buf):
            self._buf = data
            self._pos = 0
            return
        self._chunks.append(data)
        self._chunked += len(data)
        if self._need_newline and not self._newline_arrived and b"\n" in data:
            self._newline_arrived = True

    def get_command(self) -> list[bytes] | None:
        if self._ready:
            return self._ready.popleft()
        if self._error is not None:
            raise self._error
        if not self._fresh:
            return None
        if self._chunks:
            available = len(self._buf) - self._pos + self._chunked
            if available < self._need:
                return None
            if (
                self._need_newline
                and not self._newline_arrived
                and available <= self._limits.max_inline_length
            ):
                return None
            self._buf = b"".join([memoryview(self._buf)[self._pos :], *self._chunks])
            self._pos = 0
            self._chunks.clear()
            self._chunked = 0
        self._fresh = False
        self._need = 0
        self._need_newline = self._newline_arrived = False
        self._parse()
        if self._ready:
            return self._ready.popleft()
        if self._error is not None:
            raise self._error
        return None

    def _parse(self) -> None:
        """Parse every complete command in _buf[_pos:] into _ready; keep the rest."""
        buf = self._buf
        end = len(buf)
        pos = self._pos
        limits = self._limits
        max_bulk = limits.max_bulk_length
        max_query = limits.max_query_buffer
        ready = self._ready
        fast = self._fast_path
        args = self._args
        left = self._left
        cmd_start = pos - self._cmd_bytes  # so pos - cmd_start = bytes of this command
        try:
            while True:
                if args is None:  # at a command boundary
                    if pos >= end:
                        break
                    if buf[pos] != _STAR:
                        nxt = self._inline(buf, pos, end)
                        if nxt < 0:
                            self._need_newline = True
                            break
                        pos = nxt
                        continue
                    if fast is not None:
                        nxt = fast(buf, pos, end)
                        if nxt != pos:
                            pos = nxt
                            continue
                        fast = None  # it cannot take the next command: not again this read
                    field = _read_field(buf, pos + 1, end, TOO_MANY_ARG)
                    if field is None:
                        break
                    count, body = field
                    if (
                        count < -1
                        or count > limits.max_arguments
                        or body - pos + _MIN_ARG_BYTES * count > max_query
                    ):
                        raise ProtocolError(TOO_MANY_ARG)
                    if count <= 0:  # *0 is an empty command, *-1 is skipped
                        if count == 0:
                            ready.append([])
                        pos = body
                        continue
                    cmd_start = pos
                    args = []
                    left = count
                    pos = body
                    continue
                if not left:
                    ready.append(args)
                    args = None
                    continue
                if pos >= end:
                    break
                if buf[pos] != _DOLLAR:
                    raise ProtocolError(EXPECT_TYPECHAR)
                # The common case inline (plain digits), else the full rules.
                nl = buf.find(b"\r\n", pos + 1, pos + 1 + _FIELD_WINDOW)
                if nl > 0 and (digits := buf[pos + 1 : nl]).isdigit() and len(digits) <= MAX_DIGITS:
                    size = int(digits)
                    data = nl + 2
                else:
                    field = _read_field(buf, pos + 1, end, INVALID_BULK_SIZE)
                    if field is None:
                        break
                    size, data = field
                if size < -1 or size > max_bulk:
                    raise ProtocolError(INVALID_BULK_SIZE)
                if size == -1:  # null bulk: reads as an empty argument
                    args.append(b"")
                    left -= 1
                    pos = data
                    continue
                data_end = data + size
                if data_end + 2 - cmd_start > max_query:
                    raise ProtocolError(INVALID_BULK_SIZE)
                if data_end + 2 > end:
                    self._need = data_end + 2 - pos  # counted from the start of the header
                    break
                if buf[data_end] != 13 or buf[data_end + 1] != 10:
                    raise ProtocolError(EXPECT_NEWLINE)
                args.append(buf[data:data_end])
                left -= 1
                pos = data_end + 2
        except ProtocolError as error:
            self._error = error
            self._args = None
            self._buf = b""  # nothing more will be parsed: release the memory
            self._pos = 0
            self._chunks.clear()
            return
        # Keep only the unparsed tail: arguments already read were copied out of buf.
        self._buf = buf[pos:] if pos < end else b""
        self._pos = 0
        self._args = args
        self._left = left
        self._cmd_bytes = pos - cmd_start if args is not None else 0

    def _inline(self, buf: bytes, pos: int, end: int) -> int:
        """Parse one inline line at pos; return the index after it, or -1 if unfinished."""
        max_line = self._limits.max_inline_length
        nl = buf.find(b"\n", pos, pos + max_line + 1)
        if nl < 0:
            if end - pos > max_line:
                raise ProtocolError(LINE_TOO_LONG)
            return -1
        if nl > pos and buf[nl - 1] == 13:
            args = split_inline(buf[pos : nl - 1])
        else:
            args = split_inline(buf[pos:nl])
        if args:  # an empty line is ignored, as in Redis
            self._ready.append(args)
        return nl + 1


class HiredisRequestParser(PythonRequestParser):
    """``PythonRequestParser`` with hiredis.Reader parsing runs of complete multibulks."""

    def __init__(self, limits: ParserLimits = ParserLimits()) -> None:
        if hiredis is None:
            raise ImportError("hiredis is not installed")
        super().__init__(limits)
        self._fast_path = self._hiredis_run

    def _hiredis_run(self, buf: bytes, pos: int, end: int) -> int:
        """Take complete multibulk commands from buf[pos:end] with hiredis.

        A command is accepted only if its canonical encoding is exactly the input bytes
        (hiredis does not check the CRLF after bulk data, and accepts nested and non-bulk
        types) and it respects the limits. The first command that fails this, or that is
        unfinished, is left to the Python state machine, which then decides exactly as
        PythonRequestParser would. The reader is dropped afterwards, and it only ever
        holds bytes we already hold.
        """
        reader = hiredis.Reader()
        fed = min(end, pos + _HIREDIS_STEP)
        reader.feed(buf, pos, fed - pos)
        gets = reader.gets
        ready = self._ready
        max_args = self._limits.max_arguments
        max_bulk = self._limits.max_bulk_length
        max_query = self._limits.max_query_buffer
        while pos < end and buf[pos] == _STAR:
            try:
                command = gets()
            except hiredis.ProtocolError:
                break
            if command is False:
                if fed < end:  # small steps: hiredis memmoves its buffer as it consumes it
                    step = min(end, fed + _HIREDIS_STEP)
                    reader.feed(buf, fed, step - fed)
                    fed = step
                    continue
                break
            if command is None:  # *-1
                if buf.startswith(b"*-1\r\n", pos):
                    pos += 5
                    continue
                break
            try:
                encoded = _canonical(command)
            except TypeError:  # an element that is not a bulk string (integer, array, …)
                break
            size = len(encoded)
            if (
                not buf.startswith(encoded, pos)
                or len(command) > max_args
                or size > max_query
                or (size > max_bulk and max(map(len, command)) > max_bulk)
            ):
                break
            ready.append(command)
            pos += size
        return pos


def _canonical(command: list[bytes]) -> bytes:
    """The one encoding of ``command`` that hiredis and our parser agree on.

    Raises TypeError when an element is not bytes. The short arities (PING, DUMP,
    RPUSHX, RPUSH acks, BLPOP, CLIENT SETNAME) are spelled out: one formatting operation
    with a literal tuple costs a third of the generic join.
    """
    count = len(command)
    if count == 3:
        a, b, c = command
        return b"*3\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n" % (
            len(a), a, len(b), b, len(c), c,
        )  # fmt: skip
    if count == 2:
        a, b = command
        return b"*2\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n" % (len(a), a, len(b), b)
    if count == 1:
        (a,) = command
        return b"*1\r\n$%d\r\n%b\r\n" % (len(a), a)
    return b"*%d\r\n%b" % (count, b"".join([b"$%d\r\n%b\r\n" % (len(x), x) for x in command]))


def make_parser(
    limits: ParserLimits = ParserLimits(), *, use_hiredis: bool | None = None
) -> RequestParser:
    """A request parser: hiredis-backed when ``use_hiredis`` is True, or None and hiredis
    is importable; pure Python otherwise. Both give identical results."""
    if use_hiredis is None:
        use_hiredis = hiredis is not None
    if use_hiredis:
        return HiredisRequestParser(limits)
    return PythonRequestParser(limits)


# --------------------------------------------------------------------------- replies


class SimpleString(str):
    """A status reply: ``+<text>\\r\\n`` (e.g. ``SimpleString("OK")``, ``"PONG"``)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """An error reply ``-<text>\\r\\n``; the text carries its own prefix (``CONS …``)."""

    text: str


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


def _encode_into(reply: Any, resp3: bool, out: list[bytes]) -> None:
    # Dispatch on the exact type first: bytes, int and list are the hot cases.
    kind = type(reply)
    if kind is bytes:
        out.append(b"$%d\r\n%b\r\n" % (len(reply), reply))
    elif kind is int:
        out.append(b":%d\r\n" % reply)
    elif kind is list or kind is tuple:
        out.append(b"*%d\r\n" % len(reply))
        for item in reply:
            _encode_into(item, resp3, out)
    elif reply is None:
        out.append(b"_\r\n" if resp3 else b"$-1\r\n")
    elif isinstance(reply, SimpleString):
        out.append(b"+%b\r\n" % _line(reply))
    elif isinstance(reply, str):
        data = reply.encode("utf-8", "surrogateescape")
        out.append(b"$%d\r\n%b\r\n" % (len(data), data))
    elif isinstance(reply, bool):
        if resp3:
            out.append(b"#t\r\n" if reply else b"#f\r\n")
        else:
            out.append(b":1\r\n" if reply else b":0\r\n")
    elif isinstance(reply, int):  # int subclasses (IntEnum, …)
        out.append(b":%d\r\n" % reply)
    elif isinstance(reply, ErrorReply):
        out.append(b"-%b\r\n" % _line(reply.text))
    elif reply is NULL_ARRAY:
        out.append(b"_\r\n" if resp3 else b"*-1\r\n")
    elif isinstance(reply, float):
        text = _float_text(reply)
        if resp3:
            out.append(b",%b\r\n" % text)
        else:
            out.append(b"$%d\r\n%b\r\n" % (len(text), text))
    elif isinstance(reply, dict):
        if resp3:
            out.append(b"%%%d\r\n" % len(reply))
        else:
            out.append(b"*%d\r\n" % (2 * len(reply)))
        for key, value in reply.items():
            _encode_into(key, resp3, out)
            _encode_into(value, resp3, out)
    elif isinstance(reply, bytes | bytearray | memoryview):
        data = bytes(reply)
        out.append(b"$%d\r\n%b\r\n" % (len(data), data))
    elif isinstance(reply, list | tuple):
        out.append(b"*%d\r\n" % len(reply))
        for item in reply:
            _encode_into(item, resp3, out)
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
    _encode_into(reply, protocol >= 3, out)
    return out[0] if len(out) == 1 else b"".join(out)


def encode_into(reply: Reply, protocol: int, out: list[bytes]) -> None:
    """Append the encoding of ``reply`` to ``out`` (join the parts for one write)."""
    _encode_into(reply, protocol >= 3, out)


def encode_many(replies: Iterable[Reply], protocol: int) -> bytes:
    """Encode several replies into one buffer, for one write."""
    out: list[bytes] = []
    resp3 = protocol >= 3
    for reply in replies:
        _encode_into(reply, resp3, out)
    return b"".join(out)
