"""Request bytes -> commands: multibulk framing, limits, and the two parsers agreeing.

Every parser test runs over both implementations (pure Python and hiredis-backed), and
most feed the input whole, byte by byte and split in two at every position: the results
must not depend on how the bytes arrive.
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.resp import (
    HiredisRequestParser,
    ParserLimits,
    ProtocolError,
    PythonRequestParser,
    encode_many,
    make_parser,
)
from tests.gateway.resp.parsing import (
    DEFAULT_LIMITS,
    HIREDIS,
    PARSERS,
    RAFKA_LIMITS,
    MakeParser,
    commands_of,
    error_of,
    feed_pieces,
    multibulk,
    parse,
)

# --------------------------------------------------------------------------- multibulk


def test_multibulk_commands_pipelined(make: MakeParser) -> None:
    data = multibulk(b"RPUSHX", b"topics:t", b"hello") + multibulk(b"PING") + multibulk(b"DUMP")
    assert commands_of(make, data) == [[b"RPUSHX", b"topics:t", b"hello"], [b"PING"], [b"DUMP"]]


def test_bulk_arguments_are_binary_safe(make: MakeParser) -> None:
    value = b"a\r\nb\x00\xff*$\r\n"
    data = multibulk(b"RPUSHX", value, b"")
    assert commands_of(make, data) == [[b"RPUSHX", value, b""]]


def test_get_command_returns_none_until_the_command_is_complete(make: MakeParser) -> None:
    parser = make()
    data = multibulk(b"PING")
    parser.feed(data[:-1])
    assert parser.get_command() is None
    assert parser.get_command() is None
    parser.feed(data[-1:])
    assert parser.get_command() == [b"PING"]
    assert parser.get_command() is None


@pytest.mark.parametrize("name", list(PARSERS))
def test_a_backlog_is_parsed_one_step_a_call_even_when_it_gives_no_command(name: str) -> None:
    """Each get_command goes through at most one step of bytes (and the command across
    its end): a backlog of commands comes a step at a time, and a step of blank lines
    (no command) returns None with `more` set, for the next call, instead of going on
    through the whole backlog in one call (8 MB of them: seconds of every client's
    time)."""
    parser = PARSERS[name](DEFAULT_LIMITS, step=64)
    ping = multibulk(b"PING")  # 14 bytes
    parser.feed(ping * 10 + b"\n" * 200 + ping)
    taken = [parser.get_command()]
    assert parser.parsed <= 64 // len(ping) + 1
    while (command := parser.get_command()) is not None:
        taken.append(command)
    assert taken == [[b"PING"]] * 10
    assert parser.more
    calls = 1  # the None that ended the loop above
    while (command := parser.get_command()) is None:
        assert parser.more, "blank lines left unparsed with nothing to say so"
        calls += 1
    assert command == [b"PING"]
    assert calls >= 200 // 64, f"200 blank lines parsed in {calls} calls of 64 bytes"
    assert parser.get_command() is None and not parser.more


def test_feed_accepts_a_reused_bytearray(make: MakeParser) -> None:
    # The server may recycle its read buffer: the parser must keep its own copy.
    parser = make()
    buffer = bytearray(b"*1\r\n$4\r\nPI")
    parser.feed(buffer)
    buffer[:] = b"XXXXXXXXXXX"
    parser.feed(bytearray(b"NG\r\n"))
    assert parser.get_command() == [b"PING"]


def test_empty_multibulk_is_an_empty_command(make: MakeParser) -> None:
    assert commands_of(make, b"*0\r\n" + multibulk(b"PING")) == [[], [b"PING"]]


def test_null_multibulk_is_ignored(make: MakeParser) -> None:
    # The original Rafka crashed on "*-1"; Redis ignores it.
    assert commands_of(make, b"*-1\r\n" + multibulk(b"PING") + b"*-1\r\n") == [[b"PING"]]


def test_null_bulk_reads_as_empty_argument(make: MakeParser) -> None:
    assert commands_of(make, b"*3\r\n$6\r\nRPUSHX\r\n$-1\r\n$1\r\nx\r\n") == [
        [b"RPUSHX", b"", b"x"]
    ]


def test_signs_and_leading_zeros_are_accepted_like_go_redisproto(make: MakeParser) -> None:
    data = b"*+02\r\n$+4\r\nPING\r\n$0001\r\nx\r\n*-0\r\n*1\r\n$00000000000000000001\r\ny\r\n"
    assert commands_of(make, data) == [[b"PING", b"x"], [], [b"y"]]


@pytest.mark.parametrize(
    ("data", "text"),
    [
        (b"*x\r\n", "Expect Number"),
        (b"*\r\n", "Expect Number"),
        (b"*-\r\n", "Expect Number"),
        (b"*+-1\r\n", "Expect Number"),
        (b"* 1\r\n", "Expect Number"),
        (b"*1\r\n$\r\n", "Expect Number"),
        (b"*1\r\n$abc\r\n", "Expect Number"),
        (b"*2x\r\n", "Expect Newline"),
        (b"*-2x\r\n", "Expect Newline"),  # go-redisproto checks the newline before the range
        (b"*2\n$1\r\na\r\n$1\r\nb\r\n", "Expect Newline"),
        (b"*1\r\r\n", "Expect Newline"),
        (b"*1 \r\n", "Expect Newline"),
        (b"*1\r\n$3\n", "Expect Newline"),
        (b"*1\r\n$3\r\nfoobar\r\n", "Expect Newline"),  # bulk longer than announced
        (b"*1\r\n$3\r\nfo\r\n$1\r\n", "Expect Newline"),  # shorter: "\r" eaten as data
        (b"*1\r\n$3\r\nfoo\n\r\n", "Expect Newline"),
        (b"*1\r\n$3\r\nfoo\rx", "Expect Newline"),
        (b"*2\r\nfoo\r\n", "Expect TypeChar"),  # inline text where an argument belongs
        (b"*1\r\n3\r\nfoo\r\n", "Expect TypeChar"),  # missing "$"
        (b"*1\r\n\r\n", "Expect TypeChar"),  # empty line inside a multibulk
        (b"*1\r\n*1\r\n$1\r\na\r\n", "Expect TypeChar"),  # nested array
        (b"*1\r\n:1\r\n", "Expect TypeChar"),
        (b"*1\r\n+OK\r\n", "Expect TypeChar"),
        (b"*1\r\n%1\r\n$1\r\na\r\n$1\r\nb\r\n", "Expect TypeChar"),
        (b"*-2\r\n", "TooManyArg"),
        (b"*-100\r\n", "TooManyArg"),
        (b"*1\r\n$-2\r\n", "Invalid bulk size"),
        (b"*1\r\n$-100\r\n", "Invalid bulk size"),
    ],
)
def test_malformed_multibulk_gives_rafka_error_text(
    make: MakeParser, data: bytes, text: str
) -> None:
    assert error_of(make, data) == text


def test_commands_before_an_error_are_delivered_first(make: MakeParser) -> None:
    data = multibulk(b"PING") + b"PING\r\n" + b"*1\r\n$3\r\nfoobar\r\n" + multibulk(b"DUMP")
    assert parse(make, data) == ([[b"PING"], [b"PING"]], "Expect Newline")


def test_parser_is_unusable_after_an_error(make: MakeParser) -> None:
    parser = make()
    parser.feed(b"*x\r\n")
    for _ in range(2):
        with pytest.raises(ProtocolError, match=r"^Expect Number$"):
            parser.get_command()
    parser.feed(multibulk(b"PING"))
    with pytest.raises(ProtocolError, match=r"^Expect Number$"):
        parser.get_command()


def test_errors_are_raised_without_waiting_for_more_input(make: MakeParser) -> None:
    # Go's parser blocks for another byte before judging "*2x"; we decide at once.
    for data, text in [
        (b"*2x", "Expect Newline"),
        (b"*x", "Expect Number"),
        (b"*1\r\nfoo", "Expect TypeChar"),
        (b"*1\r\n$1\r\na\rx", "Expect Newline"),
    ]:
        parser = make()
        parser.feed(data)
        with pytest.raises(ProtocolError) as raised:
            parser.get_command()
        assert str(raised.value) == text


# --------------------------------------------------------------------------- limits


def test_argument_count_limit(make: MakeParser) -> None:
    args = [b"a"] * 20
    assert commands_of(make, multibulk(*args), RAFKA_LIMITS) == [args]
    assert error_of(make, multibulk(*args, b"a"), RAFKA_LIMITS) == "TooManyArg"


def test_bulk_length_limit(make: MakeParser) -> None:
    limits = ParserLimits(max_bulk_length=10)
    assert commands_of(make, multibulk(b"x" * 10), limits) == [[b"x" * 10]]
    assert error_of(make, multibulk(b"x" * 11), limits) == "Invalid bulk size"


def test_default_limits_match_the_brief() -> None:
    limits = ParserLimits()
    assert limits.max_bulk_length == 32_768_000  # Rafka's "32MB"
    assert limits.max_arguments == 1024 * 1024
    assert limits.max_inline_length == 64 * 1024
    assert limits.max_query_buffer == 64 * 1024 * 1024


def test_oversized_bulk_header_is_rejected_before_its_data(make: MakeParser) -> None:
    # A 1 GB bulk must fail on its header, not after the parser has buffered it.
    for header in (b"$1000000000\r\n", b"$32768001\r\n"):
        parser = make()
        parser.feed(b"*2\r\n$6\r\nRPUSHX\r\n" + header + b"xxxx")
        with pytest.raises(ProtocolError, match=r"^Invalid bulk size$"):
            parser.get_command()


def test_maximal_bulk_is_accepted_when_announced(make: MakeParser) -> None:
    parser = make()
    parser.feed(b"*1\r\n$32768000\r\n")
    assert parser.get_command() is None  # waits for the data: it is within the limit


def test_oversized_multibulk_count_is_rejected_at_once(make: MakeParser) -> None:
    parser = make()
    parser.feed(b"*1048577\r\n")
    with pytest.raises(ProtocolError, match=r"^TooManyArg$"):
        parser.get_command()


def test_command_that_cannot_fit_the_query_buffer_is_rejected_at_its_header(
    make: MakeParser,
) -> None:
    limits = ParserLimits(max_query_buffer=100)
    # 4 + (5 + 42) + (5 + 42) = 98 bytes fit; a third bulk of 1 byte (+6) does not.
    head = b"*3\r\n$40\r\n" + b"a" * 40 + b"\r\n$40\r\n" + b"b" * 40 + b"\r\n"
    assert error_of(make, head + b"$1\r\n", limits) == "Invalid bulk size"
    assert commands_of(make, multibulk(b"a" * 40, b"b" * 40), limits) == [[b"a" * 40, b"b" * 40]]
    # 21 arguments need at least 4 + 21 * 5 bytes.
    assert error_of(make, b"*21\r\n", limits) == "TooManyArg"
    assert error_of(make, b"*3\r\n$95\r\n", limits) == "Invalid bulk size"


def test_runaway_number_fields_are_cut_at_20_digits(make: MakeParser) -> None:
    # Never a valid size, and never buffered without bound.
    assert error_of(make, b"*" + b"9" * 21) == "TooManyArg"
    assert error_of(make, b"*" + b"0" * 21) == "TooManyArg"
    assert error_of(make, b"*1\r\n$" + b"0" * 30) == "Invalid bulk size"
    assert error_of(make, b"*-" + b"1" * 21 + b"\r\n") == "TooManyArg"


def test_huge_counts_and_lengths_give_range_errors(make: MakeParser) -> None:
    assert error_of(make, b"*99999999999999999999\r\n") == "TooManyArg"
    assert error_of(make, b"*1\r\n$99999999999999999999\r\n") == "Invalid bulk size"


def test_large_bulk_in_small_reads(make: MakeParser) -> None:
    value = bytes(range(256)) * 4096  # 1 MiB
    data = multibulk(b"RPUSHX", b"topics:t", value) + multibulk(b"PING")
    pieces = [data[i : i + 4096] for i in range(0, len(data), 4096)]
    assert feed_pieces(make(), pieces) == ([[b"RPUSHX", b"topics:t", value], [b"PING"]], None)


def test_many_pipelined_commands_in_one_read(make: MakeParser) -> None:
    # More than hiredis is fed at once (8 KiB), with reads ending mid-command; values
    # longer than the fast path's cached headers (4096) and than one step among them.
    commands = [[b"RPUSHX", b"topics:t", b"%06d" % i + b"x" * 100] for i in range(3000)]
    commands[1000][2] = b"y" * 5000
    commands[2000][2] = b"z" * 20000
    data = b"".join(multibulk(*c) for c in commands)
    assert feed_pieces(make(), [data]) == (commands, None)
    pieces = [data[i : i + 65536] for i in range(0, len(data), 65536)]
    assert feed_pieces(make(), pieces) == (commands, None)


# --------------------------------------------------------------------------- both kinds


def test_pipelined_mix_of_multibulk_and_inline(make: MakeParser) -> None:
    data = (
        multibulk(b"CLIENT", b"SETNAME", b"grp:a")
        + b"PING\r\n"
        + multibulk(b"RPUSHX", b"topics:t", b"v")
        + b'RPUSH acks "t:0:1"\n'
        + b"*0\r\n"
        + b"\r\n"
        + multibulk(b"DUMP", b"10")
        + b"*-1\r\n"
        + b"QUIT\r\n"
    )
    assert commands_of(make, data) == [
        [b"CLIENT", b"SETNAME", b"grp:a"],
        [b"PING"],
        [b"RPUSHX", b"topics:t", b"v"],
        [b"RPUSH", b"acks", b"t:0:1"],
        [],
        [b"DUMP", b"10"],
        [b"QUIT"],
    ]


def test_inline_lines_starting_with_reply_type_bytes(make: MakeParser) -> None:
    # Only "*" starts a multibulk; hiredis must not read these lines as replies.
    assert commands_of(make, b"$5 x\r\n+OK\r\n:1\r\n-ERR\r\n") == [
        [b"$5", b"x"],
        [b"+OK"],
        [b":1"],
        [b"-ERR"],
    ]


# --------------------------------------------------------------------------- make_parser


def test_make_parser_prefers_hiredis_and_honours_the_choice() -> None:
    assert isinstance(make_parser(), HiredisRequestParser)
    assert type(make_parser(use_hiredis=False)) is PythonRequestParser
    assert isinstance(make_parser(RAFKA_LIMITS, use_hiredis=True), HiredisRequestParser)


def test_encoded_commands_parse_back(make: MakeParser) -> None:
    commands = [[b"RPUSHX", b"topics:t:key", b"\x00\r\n"], [b"PING"], [b""]]
    data = encode_many(commands, 2)
    assert commands_of(make, data) == commands


# ------------------------------------------------------- runs repeating one header
# The hiredis parser takes commands that repeat the first argument of the last 3-argument
# command (a pipeline of RPUSHX to one key, or round-robin over topics) without hiredis,
# remembering that header from one read to the next; everything else must still come out
# as the state machine gives it.


def test_the_c_fast_path_of_runs_is_built_on_linux() -> None:
    """Else every pipelined command costs the event loop 0.3-0.5 us more, and the tests
    of the `hiredis` parser fail: `pip install -e .` builds it with a C compiler (gcc)."""
    if sys.platform == "linux":
        assert importlib.util.find_spec("gateway.resp._repeat"), "_repeat.c is not built"
        importlib.import_module("gateway.resp._repeat")


@pytest.mark.parametrize("limit", [2**63 - 1, 2**63, 2**64 + 5])
def test_a_run_under_limits_past_any_buffer_parses_as_the_state_machine_does(
    make: MakeParser, limit: int
) -> None:
    """Limits may be configured as large as one likes: a run's length fields of 19 digits
    (up to 2^63 - 1) then announce commands that no buffer holds; the run stops before
    them and the state machine decides (adding such a length to a position in C
    overflowed, and a limit past 2^63 did not fit a C integer)."""
    limits = ParserLimits(max_bulk_length=limit, max_query_buffer=limit)
    first = multibulk(b"RPUSHX", b"t:k", b"v")
    for length in (b"%d" % (2**63 - 1), b"%d" % (2**62)):
        for tail in (
            b"*3\r\n$6\r\nRPUSHX\r\n$" + length + b"\r\n",  # the key's length
            b"*3\r\n$6\r\nRPUSHX\r\n$1\r\nk\r\n$" + length + b"\r\n",  # the value's
            b"*3\r\n$6\r\nRPUSHX\r\n$1\r\nk\r\n$" + length + b"\r\nvalue",
        ):
            data = first * 2 + tail
            reference = feed_pieces(PythonRequestParser(limits), [data])
            assert reference[0] == [[b"RPUSHX", b"t:k", b"v"]] * 2
            assert feed_pieces(make(limits), [data]) == reference


def test_a_run_of_rpushx_to_one_key_with_values_of_any_length(make: MakeParser) -> None:
    values = [b"", b"a", b"bb", b"x" * 100, b"\r\n", b"y" * 100, b"z" * 10_000, b"q"]
    commands = [[b"RPUSHX", b"topics:t", v] for v in values] + [[b"PING"]]
    commands += [[b"RPUSHX", b"topics:u", b"v"], [b"RPUSHX", b"topics:t", b"w"]]
    assert commands_of(make, b"".join(multibulk(*c) for c in commands)) == commands


def test_a_remembered_header_does_not_take_what_is_not_canonical(make: MakeParser) -> None:
    # Each read has one command: the second and later are compared with the header the
    # first left; a leading zero, a sign or a missing CRLF must reach the state machine.
    head = b"*3\r\n$6\r\nRPUSHX\r\n$8\r\ntopics:t\r\n$"
    reads = [
        head + b"1\r\na\r\n",
        head + b"01\r\nb\r\n",
        head + b"+1\r\nc\r\n",
        head + b"1\r\nd\r\n",
    ]
    parser = make()
    got, error = feed_pieces(parser, reads)
    assert error is None
    assert [c[2] for c in got] == [b"a", b"b", b"c", b"d"]
    assert error_of(make, head + b"1\r\na\r\n" + head + b"1\r\nbXY") == "Expect Newline"


def test_a_repeat_over_the_limits_is_refused_as_by_the_state_machine(make: MakeParser) -> None:
    small = ParserLimits(max_arguments=4, max_bulk_length=30, max_query_buffer=60)
    first = multibulk(b"RPUSHX", b"topics:t", b"v")
    over_bulk = multibulk(b"RPUSHX", b"topics:t", b"x" * 31)
    over_query = multibulk(b"RPUSHX", b"topics:t", b"x" * 30)
    commands, error = parse(make, first + over_bulk, small)
    assert (commands, error) == ([[b"RPUSHX", b"topics:t", b"v"]], "Invalid bulk size")
    commands, error = parse(make, first + over_query, small)
    assert (commands, error) == ([[b"RPUSHX", b"topics:t", b"v"]], "Invalid bulk size")


REPEATS = st.lists(
    st.tuples(
        st.booleans(),  # a command encoded canonically, else a header with the fields below
        st.sampled_from([b"t:k", b"t:k", b"t:j", b"t:kk", b""]),  # runs and changes of key
        st.sampled_from([b"", b"", b"0", b"+"]),  # before the key's length: canonical or not
        st.binary(max_size=35),
        st.sampled_from([b"0", b"1", b"3", b"03", b"+3", b"-1", b"31", b"3x", b"9" * 21]),
        st.sampled_from([b"\r\n", b"\n", b"xx", b""]),
    ),
    max_size=8,
).map(
    lambda parts: b"".join(
        multibulk(b"RPUSHX", key, value)
        if canonical
        else b"*3\r\n$6\r\nRPUSHX\r\n$%b%d\r\n%b\r\n$" % (sign, len(key), key)
        + size
        + b"\r\n"
        + value
        + tail
        for canonical, key, sign, value, size, tail in parts
    )
)


def hiredis_agrees_with_the_state_machine(data: bytes, cuts: list[int], small: bool) -> None:
    """The hiredis parser, its runs of one command parsed in C and in Python, gives what
    the state machine gives for `data` whole, split at `cuts` and byte by byte."""
    limits = SMALL_LIMITS if small else ParserLimits()
    reference = feed_pieces(PythonRequestParser(limits), [data])
    for pieces in ([data], split_at(data, cuts), [data[i : i + 1] for i in range(len(data))]):
        for name in HIREDIS:
            assert feed_pieces(PARSERS[name](limits), pieces) == reference, name


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=REPEATS, cuts=st.lists(st.integers(min_value=0), max_size=10), small=st.booleans())
def test_property_runs_of_one_header_parse_as_the_state_machine_does(
    data: bytes, cuts: list[int], small: bool
) -> None:
    hiredis_agrees_with_the_state_machine(data, cuts, small)


def test_a_run_of_rpushx_round_robin_over_keys_of_any_length(make: MakeParser) -> None:
    keys = [b"topics:a", b"topics:b", b"topics:cc", b"", b"topics:a", b"k" * 5000, b"topics:b"]
    values = [b"v", b"w" * 100, b"", b"x" * 100, b"\r\n", b"y" * 10_000]
    commands = [[b"RPUSHX", k, v] for k, v in itertools.product(keys, values)]
    commands += [[b"RPUSHX", b"topics:a", b"v"]] * 3 + [[b"BLPOP", b"topics:a", b"1"]]
    commands += [[b"RPUSHX", b"topics:b", b"v"], [b"RPUSHX", b"topics:b", b"v"], [b"PING"]]
    assert commands_of(make, b"".join(multibulk(*c) for c in commands)) == commands


def test_a_parser_keeps_no_copy_of_a_long_key_once_its_commands_are_taken() -> None:
    # A run of commands is remembered (their first two arguments, for the next read) only
    # when short: a connection that once sent a run to an 8 MB key kept 24 MB.
    key = b"k" * 1_000_000
    data = multibulk(b"RPUSHX", b"t:a", b"v") * 2 + multibulk(b"RPUSHX", key, b"v") * 2
    tracemalloc.start()
    try:
        parser = HiredisRequestParser()
        before = tracemalloc.get_traced_memory()[0]
        commands, error = feed_pieces(parser, [data])
        assert (len(commands), error) == (4, None)
        del commands  # the commands taken hold the key: only the parser's copies count
        parser.feed(multibulk(b"PING"))
        assert parser.get_command() == [b"PING"]
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 100_000, f"the parser keeps {kept:,} bytes after a long key's commands"


def test_another_key_is_refused_over_the_limits_as_by_the_state_machine(
    make: MakeParser,
) -> None:
    small = ParserLimits(max_arguments=4, max_bulk_length=30, max_query_buffer=70)
    first = multibulk(b"RPUSHX", b"topics:t", b"v")
    over_bulk = multibulk(b"RPUSHX", b"k" * 31, b"v")
    over_query = multibulk(b"RPUSHX", b"k" * 25, b"x" * 20)
    for after in (over_bulk, over_query, multibulk(b"RPUSHX", b"k", b"x" * 31)):
        commands, error = parse(make, first + first + after, small)
        assert (commands, error) == ([[b"RPUSHX", b"topics:t", b"v"]] * 2, "Invalid bulk size")
        # The lengths of the last other key are remembered: refused all the same.
        other = multibulk(b"RPUSHX", b"topics:u", b"v")
        commands, error = parse(make, first + other + after, small)
        assert error == "Invalid bulk size"
        assert commands == [[b"RPUSHX", b"topics:t", b"v"], [b"RPUSHX", b"topics:u", b"v"]]


# A length field: its right value (most often), that value with a leading zero or a sign,
# or another one.
LENGTH_FIELDS = st.sampled_from([b"", b"", b"", b"0", b"+", b"-1", b"31", b"3x", b"9" * 21])


def length_field(data: bytes, variant: bytes) -> bytes:
    right = b"%d" % len(data)
    return right if variant == b"" else variant + right if variant in b"0+" else variant


OtherKeyParts = tuple[bool, bytes, bytes, bytes, bytes, bytes, bytes]


def other_keys_stream(parts: list[OtherKeyParts]) -> bytes:
    """After a command the hiredis parser surely takes (the others are compared with it),
    each command encoded canonically, or with the length fields, the bytes between the
    key and the value's length and the tail given."""
    stream = [multibulk(b"RPUSHX", b"t:k", b"v")]
    for canonical, key, value, key_size, between, size, tail in parts:
        if canonical:
            stream.append(multibulk(b"RPUSHX", key, value))
            continue
        stream += [b"*3\r\n$6\r\nRPUSHX\r\n$", length_field(key, key_size), b"\r\n", key]
        stream += [between, length_field(value, size), b"\r\n", value, tail]
    return b"".join(stream)


OTHER_KEYS = st.lists(
    st.tuples(
        st.booleans(),
        st.sampled_from([b"t:k", b"t:j", b"u:kk", b"", b"x" * 31]),
        st.binary(max_size=35),
        LENGTH_FIELDS,
        st.sampled_from([b"\r\n$", b"\r\n$", b"\r\n", b"\r\n!", b"\n$", b"xx$"]),
        LENGTH_FIELDS,
        st.sampled_from([b"\r\n", b"\r\n", b"\n", b""]),
    ),
    max_size=10,
).map(other_keys_stream)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=OTHER_KEYS, cuts=st.lists(st.integers(min_value=0), max_size=10), small=st.booleans())
def test_property_runs_over_changing_keys_parse_as_the_state_machine_does(
    data: bytes, cuts: list[int], small: bool
) -> None:
    hiredis_agrees_with_the_state_machine(data, cuts, small)


# --------------------------------------------------------------------------- properties

COMMANDS = st.lists(st.lists(st.binary(max_size=40), min_size=1, max_size=6), max_size=8)

# Streams biased towards protocol syntax, to reach the parsers' corners.
FRAGMENTS = st.sampled_from(
    [b"*", b"$", b"\r\n", b"\n", b"\r", b"0", b"1", b"2", b"3", b"-1", b"-", b"+", b"x",
     b" ", b'"', b"'", b"\\", b"*1\r\n", b"$1\r\n", b"$3\r\nfoo\r\n", b"*2\r\n$1\r\na\r\n",
     b"PING", b"*0\r\n", b"*-1\r\n", b":1\r\n", b"\x00"]
)  # fmt: skip
STREAMS = st.one_of(
    st.lists(FRAGMENTS, max_size=30).map(b"".join),
    st.binary(max_size=60),
    COMMANDS.map(lambda commands: encode_many(commands, 2)),
)
SMALL_LIMITS = ParserLimits(
    max_arguments=4, max_bulk_length=30, max_inline_length=20, max_query_buffer=60
)


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(commands=COMMANDS, cuts=st.lists(st.integers(min_value=0), max_size=10))
def test_property_encode_then_parse_round_trips(
    commands: list[list[bytes]], cuts: list[int]
) -> None:
    data = encode_many(commands, 2)
    for name, make in PARSERS.items():
        assert feed_pieces(make(), split_at(data, cuts)) == (commands, None), name


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=STREAMS,
    cuts=st.lists(st.integers(min_value=0), max_size=10),
    small=st.booleans(),
)
def test_property_both_parsers_agree_on_any_split(
    data: bytes, cuts: list[int], small: bool
) -> None:
    limits = SMALL_LIMITS if small else ParserLimits()
    reference = feed_pieces(PythonRequestParser(limits), [data])
    for name, make in PARSERS.items():
        for pieces in ([data], split_at(data, cuts), [data[i : i + 1] for i in range(len(data))]):
            assert feed_pieces(make(limits), pieces) == reference, name


def test_batches_are_taken_by_name_and_given_back_in_order(make: MakeParser) -> None:
    """What the connection's RPUSHX batches take from the parser behind the first
    command: next_named only the next command if its name matches and it has a value
    (any first argument); what give_back returns comes next, in its order, before the
    rest."""
    parser = make()
    parser.feed(
        multibulk(b"RPUSHX", b"topics:a", b"1")
        + multibulk(b"RPUSHX", b"topics:a", b"2")
        + multibulk(b"RPUSHX", b"topics:b", b"3", b"4")
        + multibulk(b"rpushx", b"topics:b", b"5")
        + multibulk(b"RPUSHX", b"topics:b")
        + multibulk(b"PING")
    )
    first = parser.get_command()
    assert first == [b"RPUSHX", b"topics:a", b"1"]
    second = parser.next_named(b"RPUSHX")
    third = parser.next_named(b"RPUSHX")
    assert [second, third] == [[b"RPUSHX", b"topics:a", b"2"], [b"RPUSHX", b"topics:b", b"3", b"4"]]
    assert parser.next_named(b"RPUSHX") is None, "another spelling"
    assert second is not None and third is not None
    parser.give_back([second, third])
    assert parser.next_named(b"RPUSHX") == second
    assert parser.next_named(b"RPUSHX") == third
    assert parser.next_named(b"rpushx") == [b"rpushx", b"topics:b", b"5"]
    assert parser.next_named(b"RPUSHX") is None, "no value: left to dispatch"
    assert parser.get_command() == [b"RPUSHX", b"topics:b"]
    assert parser.get_command() == [b"PING"]
    assert parser.get_command() is None
