"""Hostile bytes: whatever a client sends, however it is split into reads, both parsers
give the same commands or the same protocol error, raise nothing but ProtocolError, and
never hold more than the query-buffer limit plus the last read for an unfinished command.

test_requests.py holds the agreement property over streams biased towards syntax; these
properties aim at the limits (counts and lengths around them, runaway numbers, huge
announced sizes, long inline lines, quoting) with limits drawn at random, and check the
buffering bound after every read. Examples are bounded (short streams, small limits) so
the file runs in a few seconds on a 2-core machine.
"""

from __future__ import annotations

import itertools
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.resp import (
    ParserLimits,
    ProtocolError,
    PythonRequestParser,
    RequestParser,
    encode_many,
)
from tests.gateway.resp.parsing import HIREDIS, PARSERS, Outcome, feed_pieces

HOSTILE = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

LIMITS = st.builds(
    ParserLimits,
    max_arguments=st.integers(1, 6),
    max_bulk_length=st.integers(0, 40),
    max_inline_length=st.integers(1, 80),  # sometimes above the query buffer
    max_query_buffer=st.integers(8, 80),
)

NUMBER = st.one_of(
    st.integers(-3, 12),
    st.integers(0, 100),
    st.sampled_from([2**31, 2**63 - 1, 2**63, 2**64, 10**20, 10**21]),
).map(lambda n: str(n).encode())
FIELD = st.one_of(
    NUMBER,
    st.sampled_from([b"", b"-", b"+", b"+1", b"-0", b"01", b"1x", b"9" * 25, b" 1", b"1 "]),
)
HEADER = st.tuples(
    st.sampled_from([b"*", b"$"]), FIELD, st.sampled_from([b"\r\n", b"\n", b"\r", b""])
)
BULK = st.binary(max_size=45).map(lambda data: b"$%d\r\n%b\r\n" % (len(data), data))
INLINE = st.lists(
    st.sampled_from([b"PING", b"a", b" ", b"\t", b'"', b"'", b"\\", b"\\x4", b"\\x41", b"\x00",
                     b"\xff", b"x" * 30, b"\r"]),
    max_size=12,
).map(lambda parts: b"".join(parts) + b"\r\n")  # fmt: skip
PIECE = st.one_of(
    HEADER.map(b"".join),
    BULK,
    INLINE,
    st.binary(max_size=20),
    st.lists(st.lists(st.binary(max_size=20), min_size=1, max_size=7), max_size=3).map(
        lambda commands: encode_many(commands, 2)
    ),
)
STREAM = st.lists(PIECE, max_size=12).map(b"".join)
CUTS = st.lists(st.integers(min_value=0), max_size=12)


# A count or length line (type char, sign, 20 digits, CRLF) is judged once complete,
# whatever the limits: its first 23 bytes may be held on top of a command that fills the
# query buffer (found by this property: 33 bytes of arguments, then "$0" of the next).
HEADER_LINE = 23


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if a < b]


def feed_checked(parser: RequestParser, pieces: list[bytes], limits: ParserLimits) -> Outcome:
    """Feed the reads one by one, take every complete command after each, and check the
    bytes held for the unfinished command against the bound after each read. Any
    exception but ProtocolError propagates and fails the test."""
    bound = max(limits.max_query_buffer, limits.max_inline_length) + HEADER_LINE

    def check(piece: bytes) -> None:
        assert parser.buffered <= bound + len(piece), (
            f"{parser.buffered} bytes held, bound {bound} + read {len(piece)}"
        )
        assert parser.pending == (parser.buffered > 0)

    outcome = feed_pieces(parser, pieces, check)
    if outcome[1] is not None:
        assert parser.buffered == 0, "a failed parser keeps no bytes"
    return outcome


@HOSTILE
@given(data=STREAM, cuts=CUTS, limits=LIMITS)
def test_property_any_split_same_outcome_bounded_buffer(
    data: bytes, cuts: list[int], limits: ParserLimits
) -> None:
    reference = feed_checked(PythonRequestParser(limits), [data], limits)
    for name, make in PARSERS.items():
        for pieces in (split_at(data, cuts), [data[i : i + 1] for i in range(len(data))]):
            outcome = feed_checked(make(limits), pieces, limits)
            assert outcome == reference, f"{name} on {len(pieces)} reads"


@HOSTILE
@given(data=st.binary(max_size=200), cuts=CUTS, limits=LIMITS)
def test_property_random_bytes_only_protocol_errors(
    data: bytes, cuts: list[int], limits: ParserLimits
) -> None:
    reference = feed_checked(PythonRequestParser(limits), [data], limits)
    for name in HIREDIS:
        outcome = feed_checked(PARSERS[name](limits), split_at(data, cuts), limits)
        assert outcome == reference, name


def feed_taking_some(
    parser: RequestParser, pieces: list[bytes], takes: list[int], step: int
) -> Outcome:
    """Feed the reads one by one, taking at most `takes[i]` commands after read i (then
    all that is left): reads come while what came before is still parsed in steps.
    After each command taken, the parser holds at most one step of parsed commands (a
    command is at least 2 bytes: `a\\n`)."""
    commands: list[list[bytes]] = []

    def take() -> bool:
        command = parser.get_command()
        assert parser.parsed <= step // 2 + 1, f"{parser.parsed} commands parsed ahead"
        if command is None:
            return parser.more  # a step gave no command: call again
        commands.append(command)
        return True

    try:
        for piece, most in zip(pieces, itertools.cycle(takes), strict=False):
            parser.feed(piece)
            for _ in range(most):
                if not take():
                    break
        while take():
            pass
    except ProtocolError as error:
        return commands, str(error)
    return commands, None


# Streams of well-formed commands, for steps to cut between: runs of one 3-argument
# command (the fast path's), other multibulks and inline lines.
WELL_FORMED = st.lists(
    st.one_of(
        st.tuples(st.sampled_from([b"t:k", b"t:j"]), st.binary(max_size=8)).map(
            lambda kv: encode_many([[b"RPUSHX", *kv]], 2)
        ),
        st.lists(st.binary(max_size=8), min_size=1, max_size=4).map(
            lambda command: encode_many([command], 2)
        ),
        INLINE,
    ),
    min_size=1,
    max_size=20,
).map(b"".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.one_of(WELL_FORMED, WELL_FORMED, STREAM),
    cuts=CUTS,
    limits=st.one_of(st.just(ParserLimits()), LIMITS),
    step=st.integers(1, 40),
    takes=st.lists(st.integers(0, 3), min_size=1, max_size=6),
)
def test_property_parsing_in_steps_changes_nothing(
    data: bytes, cuts: list[int], limits: ParserLimits, step: int, takes: list[int]
) -> None:
    """A parse stops at the first command boundary `step` bytes on (so that a large
    backlog does not hold the event loop): with steps of a few bytes, and reads that
    arrive while earlier ones are parsed a step at a time, every parser gives the
    commands and the error of one parse of the whole stream, and never holds more than
    a step of parsed commands."""
    reference = feed_checked(PythonRequestParser(limits), [data], limits)
    for name, make in PARSERS.items():
        for pieces in ([data], split_at(data, cuts)):
            outcome = feed_taking_some(make(limits, step=step), pieces, takes, step)
            assert outcome == reference, f"{name}, step {step}, {len(pieces)} reads"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prefix=st.binary(max_size=30),
    count=st.integers(1, 3),
    chunk=st.integers(1, 4096),
)
def test_property_a_stream_that_never_ends_a_command_is_cut(
    prefix: bytes, count: int, chunk: int
) -> None:
    """Endless data with no command boundary in sight (an endless inline line, or bulk
    data past its announced size) is refused once it passes the limits: the parser
    never holds more than the bound plus one read, however long the client goes on."""
    limits = ParserLimits(max_arguments=4, max_bulk_length=1000, max_inline_length=2000,
                          max_query_buffer=3000)  # fmt: skip
    for start in (b"", b"*%d\r\n$1000\r\n" % count):
        for make in PARSERS.values():
            parser = make(limits)
            endless = itertools.chain(
                [start + prefix.replace(b"\n", b"")], itertools.repeat(b"x" * chunk)
            )
            with_error = False
            for piece in itertools.islice(endless, 20_000 // chunk + 3):
                try:
                    parser.feed(piece)
                    while parser.get_command() is not None:
                        pass
                except ProtocolError:
                    with_error = True
                    break
                assert parser.buffered <= 3000 + HEADER_LINE + len(piece)
            assert with_error, "the endless command was never refused"


_RPUSHX = b"*3\r\n$6\r\nRPUSHX\r\n$8\r\ntopics:t\r\n$100\r\n" + b"x" * 100 + b"\r\n"
_BLPOP_1000 = encode_many(
    [[b"BLPOP", ("topics:" + ",".join(f"growth-{i:04d}" for i in range(1000))).encode(), b"5"]],
    2,
)
HUGE_AGGREGATES = [
    b"*2147483647\r\n",  # a command announcing 2^31 - 1 arguments
    b"*1\r\n$4\r\nPING\r\n*2147483647\r\n",  # behind a command hiredis takes
    b"*1\r\n*2147483647\r\n",  # nested
    b"*2\r\n$4\r\nPING\r\n%2147483647\r\n",  # a RESP3 map where a bulk belongs
    b"*1\r\n$4\r\nPING\r\n" * 5000 + b"*-2147483647\r\n",  # past hiredis's first step
    # Commands of ordinary size (aggregate chars sparse: judged one by one) ...
    _RPUSHX * 200 + b"*2147483647\r\n",
    _RPUSHX * 200 + b"*2\r\n$4\r\nPING\r\n%+2147483647\r\n",
    # ... and data dense with aggregate chars (every run of digits is looked at instead).
    _RPUSHX.replace(b"x" * 100, b"*%~>|" * 20) * 200 + b"*2147483647\r\n",
    # Keys with long ids, signs and digits that are no header, then a signed huge one.
    _RPUSHX.replace(b"$8\r\ntopics:t", b"$19\r\ntopics:000000000042").replace(
        b"x" * 30, b"+12345678901 -99999999999 ~+12", 1
    )
    * 200
    + b"*2\r\n$4\r\nPING\r\n%-99999999999\r\n",
    # Long commands, one `*` in kilobytes (each aggregate char found by memchr and judged):
    # a BLPOP naming 1,000 topics, then a huge header, in and past hiredis's first step.
    _BLPOP_1000 + b"*2147483647\r\n",
    _BLPOP_1000 * 3 + b"*2\r\n$4\r\nPING\r\n~-2147483647\r\n",
    _BLPOP_1000[:4000] + b"|+99999999999999999999999\r\n",
]


@pytest.mark.parametrize("data", HUGE_AGGREGATES, ids=range(len(HUGE_AGGREGATES)))
def test_huge_aggregate_counts_never_reach_hiredis(data: bytes) -> None:
    """hiredis allocates an aggregate's list when it reads its header: fed
    `*2147483647\\r\\n` it spent 5 s of CPU (17 s under load) before we refused the
    command, blocking every connection. The fast path now stops before such a header,
    and the state machine refuses it at once, as the pure-Python parser does."""
    expected = feed_checked(PythonRequestParser(), [data], ParserLimits())
    for pieces in ([data], [data[:7], data[7:]], split_at(data, [len(data) - 9])):
        for name in HIREDIS:
            started = time.monotonic()
            outcome = feed_checked(PARSERS[name](), pieces, ParserLimits())
            elapsed = time.monotonic() - started
            assert outcome == expected, name
            assert elapsed < 0.5, f"{name}: {elapsed:.2f}s to refuse {data[-16:]!r}"


def test_long_digit_runs_in_bulk_data_do_not_trouble_the_fast_path() -> None:
    """Data that looks like a huge count (an aggregate char and thousands of digits,
    more than int() accepts) is only data: it parses back."""
    commands = [[b"RPUSHX", b"topics:t", b"*" + b"9" * 5000], [b"PING"]]
    data = encode_many(commands, 2)
    for pieces in ([data], [data[i : i + 1000] for i in range(0, len(data), 1000)]):
        for name in HIREDIS:
            outcome = feed_checked(PARSERS[name](), pieces, ParserLimits())
            assert outcome == (commands, None), name


@pytest.mark.parametrize(
    "value",
    [
        b"*" + b"9" * 5000,  # more digits than int() takes
        b"topics:a,%2147483647,~+2147483647,b" + b"," * 3000,  # huge counts inside data
        b"*%~>|" * 5 + b"x" * 4000 + b">99999999",  # past the sparse path's first finds
    ],
)
def test_aggregate_chars_in_long_values_are_only_data(value: bytes) -> None:
    """A long argument (a BLPOP key naming many topics) whose bytes look like a huge
    count after an aggregate char parses back whole, the same on every parser, however
    it is split."""
    commands = [[b"BLPOP", value, b"5"], [b"PING"]] * 3
    data = encode_many(commands, 2)
    expected = feed_checked(PythonRequestParser(), [data], ParserLimits())
    assert expected == (commands, None)
    for pieces in ([data], [data[i : i + 1000] for i in range(0, len(data), 1000)]):
        for name in HIREDIS:
            assert feed_checked(PARSERS[name](), pieces, ParserLimits()) == expected, name
