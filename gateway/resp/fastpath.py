"""The hiredis fast path: hiredis.Reader parses runs of complete multibulk commands.

Everything it is unsure of goes on through the Python state machine (see FastPath), so
``HiredisRequestParser`` and ``PythonRequestParser`` give the same commands and errors for
the same bytes, however they are split into reads.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections import deque
from itertools import chain
from typing import Final

from gateway.resp.requests import (
    _STAR,
    DEFAULT_LIMITS,
    MAX_DIGITS,
    PARSE_STEP,
    FastPath,
    ParserLimits,
    PythonRequestParser,
    RequestParser,
)

try:  # hiredis is a dependency, but the pure-Python parser must work without it
    import hiredis
except ImportError:  # pragma: no cover - exercised only on machines without hiredis
    hiredis = None  # type: ignore[assignment]

try:  # the C fast path of _Repeat (setup.py builds it where a C compiler is)
    from gateway.resp import _repeat  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - exercised only where it was not built
    _repeat = None

# hiredis is fed at most this much at a time: after every 1 KiB it consumes, it memmoves
# what is left of its buffer to the front. With 64 KiB steps that moved ~32 bytes per byte
# parsed (11% of a pipelined RPUSHX's instructions); with 8 KiB, 4.
_HIREDIS_STEP: Final = 8 * 1024
# hiredis allocates the list of an aggregate (`*`, `%`, `~`, `>`, `|`) as soon as it reads
# its header: `*2147483647\r\n` (13 bytes) cost it 5 s of CPU. Bytes from such a header
# with a count above max_arguments on are never fed to it.
_LOOKBACK: Final = 24  # a header cut by a step boundary: its start was fed already
# Every digit to "0", aggregate char and sign to "A", every other byte to " ": the headers
# of huge counts are found with bytes.find (a regular expression over the data was 3 to
# 5 times slower).
_HEADER_MARKS: Final = bytes(
    48 if 48 <= i <= 57 else 65 if i in b"*%~>|+-" else 32 for i in range(256)
)
_AGGREGATES: Final = frozenset(b"*%~>|")
_AGGREGATE_BYTES: Final = tuple(bytes([c]) for c in b"*%~>|")
_DIGITS: Final = re.compile(rb"[0-9]*")
# _safe_end judges aggregate chars one by one when two `*` are at least this far apart
# and the window holds at most _SPARSE_HITS aggregate chars; else _marked_headers.
_SPARSE_GAP: Final = 1024
_SPARSE_HITS: Final = 16


class HiredisFastPath(FastPath):
    """Complete multibulk commands checked against their canonical encoding."""

    def __init__(self, limits: ParserLimits, repeat_in_c: bool | None = None) -> None:
        """`repeat_in_c`: runs of one command parsed by `_repeat.c` (True), by Python
        (False), or by C where it was built (None)."""
        if hiredis is None:
            raise ImportError("hiredis is not installed")
        if repeat_in_c is None:
            repeat_in_c = _repeat is not None
        if repeat_in_c and _repeat is None:
            raise ImportError("gateway.resp._repeat is not built")
        self._repeat_class: type[_Run] = _CRepeat if repeat_in_c else _Repeat
        self._limits = limits
        # A count above max_arguments has at least this many digits: an aggregate char
        # (and a sign) before that many, as marked by _HEADER_MARKS.
        self._long_run = b"0" * len(str(limits.max_arguments))
        self._header = b"A" + self._long_run
        self._repeat: _Run | None = None  # of the last 3-argument command taken

    def take(self, buf: bytes, pos: int, end: int, ready: deque[list[bytes]]) -> int:
        """Take complete multibulk commands from buf[pos:end] with hiredis.

        A command is accepted only if its canonical encoding is exactly the input bytes
        (hiredis does not check the CRLF after bulk data, and accepts nested and non-bulk
        types) and it respects the limits. The first command that fails this, or that is
        unfinished, is left to the Python state machine, which then decides exactly as
        PythonRequestParser would. The reader is dropped afterwards, and it only ever
        holds bytes we already hold.

        Commands that repeat the first argument of the last 3-argument command taken (in
        this read or an earlier one) are taken by `_Repeat` without hiredis.
        """
        limits = self._limits
        max_args, max_bulk, max_query = (
            limits.max_arguments, limits.max_bulk_length, limits.max_query_buffer,
        )  # fmt: skip
        fed = pos  # what the reader holds ends here (none yet)
        gets = None
        while pos < end and buf[pos] == _STAR:
            if gets is None:
                repeat = self._repeat
                if repeat is not None and buf.startswith(repeat.named, pos):
                    after = repeat.take(buf, pos, end, ready)
                    if after != pos:
                        pos = after
                        continue
                reader = hiredis.Reader()
                fed = self._safe_end(buf, pos, pos, min(end, pos + _HIREDIS_STEP))
                reader.feed(buf, pos, fed - pos)
                gets = reader.gets
            try:
                command = gets()
            except hiredis.ProtocolError:
                break
            if command is False:
                if fed < end:  # small steps: hiredis memmoves its buffer as it consumes it
                    step = self._safe_end(buf, pos, fed, min(end, fed + _HIREDIS_STEP))
                    if step > fed:
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
                or (size > max_bulk and max(map(len, command), default=0) > max_bulk)
            ):
                break
            ready.append(command)
            pos += size
            if len(command) == 3 and size <= _REMEMBERED:
                repeat = self._repeat
                if repeat is None or repeat.first != command[0]:
                    # A new first argument: remembered when the next command repeats it,
                    # or for the next read when this one ends here; a pipeline of mixed
                    # commands pays one comparison.
                    if pos < end:
                        # Where the next command's first argument stands: only a guess
                        # (the repeat's take() checks the whole header).
                        first = command[0]
                        if len(first) > 9 or not buf.startswith(first, pos + 8):
                            continue
                    self._repeat = repeat = self._repeat_class(command, encoded, self._limits)
                after = repeat.take(buf, pos, end, ready)
                if after != pos:
                    pos = after
                    gets = None  # the reader holds bytes taken since: a new one from here
        return pos

    def _safe_end(self, buf: bytes, pos: int, start: int, stop: int) -> int:
        """How far from `start` hiredis may be fed: up to `stop`, or to the start of the
        first aggregate header whose count is above max_arguments (`start` itself when a
        header begun before it, so already fed, is one). A match inside bulk data only
        ends the run early; the state machine takes over from there.

        Where aggregate chars are sparse (a BLPOP naming 1,000 topics is 12 KB of names
        and digits with one `*`), each is judged where bytes.find (memchr) puts it: the
        scan of the whole window (then by runs of digits) cost ~21 us per such BLPOP, 85%
        of its parse. Where they are
        dense (pipelined small commands, one `*` each), or the window is short (one small
        command per read), the scan of marked headers is faster."""
        base = max(pos, start - _LOOKBACK)
        if stop - base <= _SPARSE_GAP:  # a short window: one scan (~0.3 us, 1.3 us the other)
            return self._marked_headers(buf, base, start, stop)
        first = buf.find(b"*", base, stop)
        if first >= 0 and 0 <= buf.find(b"*", first + 1, stop) < first + _SPARSE_GAP:
            return self._marked_headers(buf, base, start, stop)
        found = stop  # the first huge header's start, if any
        budget = _SPARSE_HITS
        run_length = len(self._long_run)
        max_count = self._limits.max_arguments
        for char in _AGGREGATE_BYTES:
            at = buf.find(char, base, found)
            while at >= 0:
                budget -= 1
                if budget < 0:
                    return self._marked_headers(buf, base, start, stop)
                digits = at + 1
                if digits < stop and buf[digits] in b"+-":
                    digits += 1
                if buf[digits : digits + run_length].isdigit() and digits + run_length <= stop:
                    run = _DIGITS.match(buf, digits, stop)
                    last = run.end() if run is not None else digits
                    if last - digits > MAX_DIGITS or int(buf[digits:last]) > max_count:
                        found = at
                        break
                at = buf.find(char, at + 1, found)
        return max(start, found) if found < stop else stop

    def _marked_headers(self, buf: bytes, base: int, start: int, stop: int) -> int:
        """_safe_end by the aggregate chars followed (after a sign, if any) by a run of
        digits long enough for a huge count: each found by one bytes.find over the window
        with aggregate chars and signs marked alike (a sign then counts only after an
        aggregate char). Judging every long run of digits by the byte before it cost
        ~0.5 us for each key with a 12-digit id in a pipeline of RPUSHX."""
        marks = buf[base:stop].translate(_HEADER_MARKS)
        header = self._header
        max_count = self._limits.max_arguments
        head = marks.find(header)
        while head >= 0:
            first = base + head + 1
            run = _DIGITS.match(buf, first, stop)
            last = run.end() if run is not None else first
            if buf[base + head] in b"+-":
                head -= 1
            if (
                head >= 0
                and buf[base + head] in _AGGREGATES
                and (last - first > MAX_DIGITS or int(buf[first:last]) > max_count)
            ):
                return max(start, base + head)
            head = marks.find(header, last - base)
        return stop


# A 3-argument command at most this long is remembered for _Repeat (which keeps its
# first two arguments and headers as long as the connection lasts).
_REMEMBERED: Final = 64 * 1024


class _Run(ABC):
    """Takes commands that repeat the first argument of one 3-argument command (a run of
    RPUSHX, of RPUSH acks, of BLPOP) without hiredis: each must be canonical (its encoding
    is exactly its bytes) and within the limits, else it and all after it are left to
    hiredis and the state machine. In Python (`_Repeat`) or in C (`_CRepeat`)."""

    __slots__ = ("first", "max_bulk", "max_query", "named")

    def __init__(self, command: list[bytes], encoded: bytes, limits: ParserLimits) -> None:
        """`command`, taken, as `encoded`."""
        self.first = command[0]
        self.max_bulk = limits.max_bulk_length
        self.max_query = limits.max_query_buffer
        # Up to the second argument's length: the header of every command taken here.
        self.named = b"*3\r\n$%d\r\n%b\r\n$" % (len(self.first), self.first)

    @abstractmethod
    def take(self, buf: bytes, pos: int, end: int, ready: deque[list[bytes]]) -> int:
        """Append the repeats starting at buf[pos:end] to `ready`; return the index after
        the last one taken (`pos` when none)."""


class _Repeat(_Run):
    """`_Run` in Python, from the headers it remembers. A command that also repeats the
    second argument, with a last argument of the same length, is told by one comparison of
    its whole header; one with another second argument, by two when its lengths are those
    of the last such command. One RPUSHX per read cost ~3.2 us through hiredis (a reader,
    the scan for huge headers, the canonical check), ~0.4 us here; in a pipeline ~0.84
    against ~0.35 us to one key, and ~1.2 against ~0.6 us round-robin over topics."""

    __slots__ = (
        "head", "key_length", "length", "other", "second", "sized", "value_field",
        "value_length",
    )  # fmt: skip

    def __init__(self, command: list[bytes], encoded: bytes, limits: ParserLimits) -> None:
        super().__init__(command, encoded, limits)
        _, second, last = command
        key_start = encoded.index(b"\r\n", len(self.named)) + 2
        key_end = key_start + len(second)
        value_start = len(encoded) - len(last) - 2
        self._remember(encoded, 0, key_start, key_end, value_start, len(last))
        self._measure(encoded, 0, key_start, key_end, value_start, len(last))

    def _remember(
        self, buf: bytes, pos: int, key_start: int, key_end: int, value_start: int, length: int
    ) -> None:
        """The command at buf[pos:] as the one whose header repeats."""
        self.second = buf[key_start:key_end]
        # Up to the last argument's `$`, and with its length: the header of a last
        # argument of that length.
        self.head = buf[pos : key_end + 3]
        self.sized = buf[pos:value_start]
        self.length = length

    def _measure(
        self, buf: bytes, pos: int, key_start: int, key_end: int, value_start: int, length: int
    ) -> None:
        """The command at buf[pos:] as the last taken with another second argument: the
        next such command is compared with its header up to that argument's data, the
        argument's length, the field after it and the last argument's length."""
        self.other, self.key_length = buf[pos:key_start], key_end - key_start
        self.value_field, self.value_length = buf[key_end:value_start], length

    def take(self, buf: bytes, pos: int, end: int, ready: deque[list[bytes]]) -> int:
        """Append the repeats starting at buf[pos:end] to `ready`; return the index after
        the last one taken (`pos` when none)."""
        first, second, head, sized, length = (
            self.first, self.second, self.head, self.sized, self.length,
        )  # fmt: skip
        other, key_length, value_field, value_length = (
            self.other, self.key_length, self.value_field, self.value_length,
        )  # fmt: skip
        max_query = self.max_query
        append = ready.append
        # The second argument of the command before, when it was another one: the next is
        # then compared with its lengths first (round-robin over topics).
        previous = None
        while True:
            if previous is None and buf.startswith(sized, pos):
                start = pos + len(sized)
                key, size = second, length
            elif previous is None and buf.startswith(head, pos):
                field = _length_field(buf, pos + len(head))
                if field is None:
                    break
                start, length = field
                if length > self.max_bulk or start + length + 2 - pos > max_query:
                    break
                # Within the limits: so is every command with this header and length.
                sized = self.sized = buf[pos:start]
                self.length = length
                key, size = second, length
            else:  # another second argument
                key_start = pos + len(other)
                key_end = key_start + key_length
                if buf.startswith(other, pos) and buf.startswith(value_field, key_end):
                    # The lengths, so the size, of a command taken before: within the limits.
                    start = key_end + len(value_field)
                    size = value_length
                else:
                    fields = self._other(buf, pos)
                    if fields is None:
                        break
                    key_start, key_end, start, size = fields
                    other, key_length, value_field, value_length = (
                        self.other, self.key_length, self.value_field, self.value_length,
                    )  # fmt: skip
                key = buf[key_start:key_end]
                if key == previous and start + size + 2 - pos <= _REMEMBERED:
                    # A run of another key: its header repeats from here.
                    self._remember(buf, pos, key_start, key_end, start, size)
                    second, head, sized, length = key, self.head, self.sized, size
                    previous = None
                else:
                    previous = key
            stop = start + size
            if stop + 2 > end or buf[stop] != 13 or buf[stop + 1] != 10:
                break
            append([first, key, buf[start:stop]])
            pos = stop + 2
        return pos

    def _other(self, buf: bytes, pos: int) -> tuple[int, int, int, int] | None:
        """The fields of a command at buf[pos:] with the first argument and another second
        one, read and checked one by one: (second's start, its end, the last argument's
        start, its length), remembered as the lengths to compare the next such command
        with; None when they are not canonical or not within the limits."""
        named = self.named
        if not buf.startswith(named, pos):
            return None
        field = _length_field(buf, pos + len(named))
        if field is None or field[1] > self.max_bulk:
            return None
        key_start, key_length = field
        key_end = key_start + key_length
        if not buf.startswith(b"\r\n$", key_end):
            return None
        field = _length_field(buf, key_end + 3)
        if field is None or field[1] > self.max_bulk:
            return None
        start, length = field
        if start + length + 2 - pos > self.max_query:
            return None
        self._measure(buf, pos, key_start, key_end, start, length)
        return key_start, key_end, start, length


class _CRepeat(_Run):
    """`_Run` in C (`_repeat.c`), which reads every header in full: 0.15-0.16 us a
    command whatever the keys, against 0.41-0.61 in Python (`bench/parse_cost.py`)."""

    __slots__ = ()

    def take(self, buf: bytes, pos: int, end: int, ready: deque[list[bytes]]) -> int:
        after: int
        after, taken = _repeat.take(
            buf, pos, end, self.first, self.named, self.max_bulk, self.max_query
        )
        ready.extend(taken)
        return after


def _length_field(buf: bytes, at: int) -> tuple[int, int] | None:
    """A bulk length in canonical form (plain digits, no sign, no leading zero: the
    encoder's "%d") and its CRLF at buf[at:]: (where its data starts, the length)."""
    newline = buf.find(b"\r\n", at, at + MAX_DIGITS + 1)
    if newline < 0:
        return None
    digits = buf[at:newline]
    if not digits.isdigit() or (digits[0] == 48 and len(digits) > 1):
        return None
    return newline + 2, int(digits)


class HiredisRequestParser(PythonRequestParser):
    """``PythonRequestParser`` with hiredis.Reader parsing runs of complete multibulks."""

    def __init__(
        self,
        limits: ParserLimits = DEFAULT_LIMITS,
        *,
        repeat_in_c: bool | None = None,
        step: int = PARSE_STEP,
    ) -> None:
        """`repeat_in_c`: see HiredisFastPath; `step`: see PythonRequestParser."""
        super().__init__(limits, HiredisFastPath(limits, repeat_in_c), step=step)


# The framing before the first argument of a 3-argument command, and between two
# arguments, for each length below _TABLED (RPUSHX's key and value are usually short).
_TABLED: Final = 4096
_FIRST_OF_3: Final = tuple(b"*3\r\n$%d\r\n" % n for n in range(_TABLED))
_NEXT: Final = tuple(b"\r\n$%d\r\n" % n for n in range(_TABLED))


def _canonical(command: list[bytes]) -> bytes:
    """The one encoding of ``command`` that hiredis and our parser agree on.

    Raises TypeError when an element is not bytes. The short arities (PING, DUMP,
    RPUSHX, RPUSH acks, BLPOP, CLIENT SETNAME) are spelled out: one formatting operation
    with a literal tuple costs a third of the generic join.
    """
    count = len(command)
    if count == 3:
        a, b, c = command
        try:  # joining cached headers costs half of formatting three lengths
            return b"".join((_FIRST_OF_3[len(a)], a, _NEXT[len(b)], b, _NEXT[len(c)], c, b"\r\n"))
        except IndexError:  # a length past the tables
            return b"*3\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n" % (
                len(a), a, len(b), b, len(c), c,
            )  # fmt: skip
    if count == 2:
        a, b = command
        return b"*2\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n" % (len(a), a, len(b), b)
    if count == 1:
        (a,) = command
        return b"*1\r\n$%d\r\n%b\r\n" % (len(a), a)
    try:  # RPUSHX with many values: cached headers, not one formatting per value
        heads = [_NEXT[len(x)] for x in command]
    except IndexError:  # a length past the tables
        return b"*%d\r\n%b" % (count, b"".join([b"$%d\r\n%b\r\n" % (len(x), x) for x in command]))
    parts = [b"*%d" % count]  # each head starts with the CRLF that ends what precedes it
    parts.extend(chain.from_iterable(zip(heads, command, strict=True)))
    parts.append(b"\r\n")
    return b"".join(parts)


def make_parser(
    limits: ParserLimits = DEFAULT_LIMITS,
    *,
    use_hiredis: bool | None = None,
    repeat_in_c: bool | None = None,
    step: int = PARSE_STEP,
) -> RequestParser:
    """A request parser: hiredis-backed when ``use_hiredis`` is True, or None and hiredis
    is importable (``repeat_in_c``: see HiredisFastPath); pure Python otherwise. All give
    identical results. ``step``: see PythonRequestParser."""
    if use_hiredis is None:
        use_hiredis = hiredis is not None
    if use_hiredis:
        return HiredisRequestParser(limits, repeat_in_c=repeat_in_c, step=step)
    return PythonRequestParser(limits, step=step)
