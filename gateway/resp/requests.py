"""Request bytes -> commands: the pure-Python parser, and the grammar it accepts.

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
``ERR Protocol error: unbalanced quotes in request``
    Redis's text (with its ``ERR`` prefix, byte for byte) for an inline line that its
    quoting rules reject.

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
``max(max_query_buffer, max_inline_length)`` bytes, plus one unfinished header line, plus
the last read. Sizes are checked when a header line is complete, before any of the data
it announces is awaited, and header lines themselves are at most 23 bytes (so the
bytes of a command that fit the limit can be followed by the start of a header that
will take it past the limit, judged once that header is complete).

Two implementations give identical results for identical byte streams, however they are
split into reads: ``PythonRequestParser`` (pure Python) and ``HiredisRequestParser``,
which lets ``hiredis.Reader`` parse runs of complete multibulk commands and accepts a
command only when its canonical encoding matches the input bytes exactly and it is within
the limits. Everything else (inline lines, unfinished commands, anything hiredis rejects
or parses differently) goes through the same Python state machine, so the two cannot
disagree. hiredis only ever sees the bytes already received, and never an aggregate
header (``*``, ``%``, ``~``, ``>``, ``|``) whose count is above ``max_arguments``: it
allocates the list as soon as it reads the header.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from gateway.resp.errors import (
    EXPECT_NEWLINE,
    EXPECT_NUMBER,
    EXPECT_TYPECHAR,
    INVALID_BULK_SIZE,
    LINE_TOO_LONG,
    TOO_MANY_ARG,
    ProtocolError,
)
from gateway.resp.inline import split_inline

# A count/length field holds an optional sign and at most this many digits.
MAX_DIGITS: Final = 20
# Bytes after the type char in which a valid field must end: sign + digits + CRLF.
_FIELD_WINDOW: Final = 1 + MAX_DIGITS + 2
# Smallest encoding of one multibulk argument: "$-1\r\n".
_MIN_ARG_BYTES: Final = 5

# Bytes one parse goes through before it stops at the next command boundary: the rest
# is parsed by the next get_command(). Bytes read behind a waiting command (up to
# max_query_buffer) used to be parsed in one go, every other client stalled meanwhile
# (16 MB of PING: about 2 s); a step is one read's worth.
PARSE_STEP: Final = 256 * 1024

_STAR: Final = 42  # ord("*")
_DOLLAR: Final = 36  # ord("$")


@dataclass(frozen=True, slots=True)
class ParserLimits:
    """Limits a client cannot exceed; they keep a hostile client from exhausting memory."""

    max_arguments: int = 1024 * 1024  # Redis-like; Rafka used 20 (configurable)
    max_bulk_length: int = 32_768_000  # Rafka's "32MB"
    max_inline_length: int = 64 * 1024  # Redis's inline limit
    max_query_buffer: int = 64 * 1024 * 1024  # bytes buffered for one unfinished command


DEFAULT_LIMITS: Final = ParserLimits()


class RequestParser(ABC):
    """Feed bytes, take complete commands.

    After a ``ProtocolError`` the parser is unusable: ``get_command`` raises the same
    error again and ``feed`` ignores its data (the server closes the connection).
    """

    @abstractmethod
    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Add received bytes (the parser keeps its own copy of a bytearray/memoryview)."""

    @abstractmethod
    def get_command(self) -> list[bytes] | None:
        """The next complete command, or None when more data is needed."""

    @property
    @abstractmethod
    def buffered(self) -> int:
        """Bytes received and not parsed into commands yet: the unfinished command's
        (headers and data so far), and while ``more`` is set the complete ones past the
        last step as well (not the parsed commands waiting in the parser). Once
        ``get_command`` has returned None without ``more``, at most
        ``max(max_query_buffer, max_inline_length)`` + 23 (one header line) plus the
        last read."""

    @property
    @abstractmethod
    def pending(self) -> bool:
        """True while bytes received are not parsed into commands yet: part of a
        command, or (``more``) a backlog past the last step."""

    @property
    @abstractmethod
    def parsed(self) -> int:
        """Complete commands parsed and not yet taken: at most about one `PARSE_STEP`
        of them, plus those given back."""

    @property
    @abstractmethod
    def more(self) -> bool:
        """After ``get_command`` returned None: bytes received are left to parse (a
        step gave no command, as blank lines do), for another call, in a later turn."""

    def next_named(self, name: bytes) -> list[bytes] | None:
        """Take the next command if it is parsed already and is `name` with at least two
        arguments; else None, and nothing is taken."""
        return None

    def give_back(self, commands: Sequence[list[bytes]]) -> None:
        """Put commands taken by next_named back, in their order, ahead of
        the others: the next ones taken again."""
        if commands:
            raise NotImplementedError("this parser hands out no command before its turn")


class FastPath(ABC):
    """A faster reader of runs of complete multibulk commands, in front of the state
    machine of ``PythonRequestParser``.

    What keeps the parsers identical: take a command only when the state machine would
    give exactly that command for exactly those bytes, within the limits; stop at the
    first one you are unsure of and leave it, and all after it, to the state machine.
    """

    @abstractmethod
    def take(self, buf: bytes, pos: int, end: int, ready: deque[list[bytes]]) -> int:
        """Append the complete commands starting at ``buf[pos:end]`` to ``ready``; return
        the index after the last one taken (``pos`` when none)."""


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


class PythonRequestParser(RequestParser):
    """Pure-Python incremental parser (a resumable state machine over a bytes buffer),
    with an optional fast path that takes the common case off its hands."""

    def __init__(
        self,
        limits: ParserLimits = DEFAULT_LIMITS,
        fast_path: FastPath | None = None,
        *,
        step: int = PARSE_STEP,
    ) -> None:
        """`step`: bytes one parse goes through (PARSE_STEP; smaller in tests)."""
        self._limits = limits
        self._fast_path = fast_path
        self._step = step
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
        # The last parse stopped after `step` bytes, at a command boundary: the next
        # one goes on from there (joining the reads that came since only once it is done,
        # or each step would copy the rest of a large backlog).
        self._stepped = False
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

    @property
    def buffered(self) -> int:
        return self._cmd_bytes + len(self._buf) - self._pos + self._chunked

    @property
    def pending(self) -> bool:
        return self._args is not None or self._pos < len(self._buf) or self._chunked > 0

    @property
    def parsed(self) -> int:
        return len(self._ready)

    @property
    def more(self) -> bool:
        return self._stepped

    def next_named(self, name: bytes) -> list[bytes] | None:
        ready = self._ready
        if ready:
            command = ready[0]
            if len(command) > 2 and command[0] == name:
                return ready.popleft()
        return None

    def give_back(self, commands: Sequence[list[bytes]]) -> None:
        self._ready.extendleft(reversed(commands))

    def get_command(self) -> list[bytes] | None:
        # Again after a parse that gave no command when reads came during the steps
        # before it (joined now); a step that gives none returns None: `more`.
        while True:
            if self._ready:
                return self._ready.popleft()
            if self._error is not None:
                raise self._error
            if not self._fresh:
                return None
            if self._chunks and not self._stepped:
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
            self._fresh = self._stepped = False
            self._need = 0
            self._need_newline = self._newline_arrived = False
            self._parse()
            if self._stepped:
                if self._ready:
                    return self._ready.popleft()
                return None  # the rest in another call: one step each
            if self._chunks:
                # Reads that came while the steps before this one were parsed: judged now,
                # as feed() judges a read.
                self._fresh = True
                self._newline_arrived = self._need_newline and any(
                    b"\n" in chunk for chunk in self._chunks
                )

    def _parse(self) -> None:
        """Parse the complete commands in _buf[_pos:] into _ready, up to the first
        command boundary `step` bytes on; keep the rest."""
        buf = self._buf
        end = len(buf)
        pos = self._pos
        step_end = pos + self._step
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
                    if pos >= step_end:
                        self._fresh = self._stepped = True
                        break
                    if buf[pos] != _STAR:
                        nxt = self._inline(buf, pos, end)
                        if nxt < 0:
                            self._need_newline = True
                            break
                        pos = nxt
                        continue
                    if fast is not None:
                        # Up to the step's end: a command across it is left to the state
                        # machine, the last of this step.
                        nxt = fast.take(buf, pos, min(end, step_end), ready)
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
            self._chunked = 0
            self._cmd_bytes = 0
            return
        if self._stepped:
            self._pos = pos  # not a copy of the rest at each step: parsed from here next
        else:
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
