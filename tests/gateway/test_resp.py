"""The sans-IO RESP layer: request bytes -> commands, reply values -> bytes.

Every parser test runs over both implementations (pure Python and hiredis-backed), and
most feed the input whole, byte by byte and split in two at every position: the results
must not depend on how the bytes arrive.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.resp import (
    NULL_ARRAY,
    ErrorReply,
    HiredisRequestParser,
    ParserLimits,
    ProtocolError,
    PythonRequestParser,
    Reply,
    RequestParser,
    SimpleString,
    encode,
    encode_many,
    make_parser,
)

Outcome = tuple[list[list[bytes]], str | None]  # commands, then the error text if any
MakeParser = Callable[..., RequestParser]

DEFAULT_LIMITS = ParserLimits()
RAFKA_LIMITS = ParserLimits(max_arguments=20)  # the original Rafka's argument limit


@pytest.fixture(params=["python", "hiredis"])
def make(request: pytest.FixtureRequest) -> MakeParser:
    use_hiredis = request.param == "hiredis"

    def factory(limits: ParserLimits = DEFAULT_LIMITS) -> RequestParser:
        parser = make_parser(limits, use_hiredis=use_hiredis)
        assert isinstance(parser, HiredisRequestParser if use_hiredis else PythonRequestParser)
        return parser

    return factory


def feed_pieces(parser: RequestParser, pieces: list[bytes]) -> Outcome:
    """Feed the pieces one read at a time, taking every complete command after each."""
    commands: list[list[bytes]] = []
    try:
        for piece in pieces:
            parser.feed(piece)
            while (command := parser.get_command()) is not None:
                commands.append(command)
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
    # More than hiredis is fed at once (64 KiB), with reads ending mid-command.
    commands = [[b"RPUSHX", b"topics:t", b"%06d" % i + b"x" * 100] for i in range(3000)]
    data = b"".join(multibulk(*c) for c in commands)
    assert feed_pieces(make(), [data]) == (commands, None)
    pieces = [data[i : i + 65536] for i in range(0, len(data), 65536)]
    assert feed_pieces(make(), pieces) == (commands, None)


# --------------------------------------------------------------------------- inline


def test_inline_crlf_and_bare_lf(make: MakeParser) -> None:
    assert commands_of(make, b"PING\r\nDUMP 100\nCLIENT GETNAME\r\n") == [
        [b"PING"],
        [b"DUMP", b"100"],
        [b"CLIENT", b"GETNAME"],
    ]


def test_inline_splits_on_runs_of_blanks(make: MakeParser) -> None:
    assert commands_of(make, b"  RPUSHX \t topics:t   hello  \r\n") == [
        [b"RPUSHX", b"topics:t", b"hello"]
    ]


def test_inline_empty_and_blank_lines_are_ignored(make: MakeParser) -> None:
    assert commands_of(make, b"\r\n\n   \r\n\t\nPING\r\n\r\n") == [[b"PING"]]


def test_inline_quoting(make: MakeParser) -> None:
    data = (
        b'RPUSHX "topics:a b" "\\n\\r\\t\\b\\a\\\\\\"\\x41\\x7a\\xZZ\\q" '
        b"'single \\' \\n' \"\" ''\r\n"
    )
    assert commands_of(make, data) == [
        [b"RPUSHX", b"topics:a b", b'\n\r\t\b\a\\"AzxZZq', b"single ' \\n", b"", b""]
    ]


def test_inline_quotes_follow_redis_corner_cases(make: MakeParser) -> None:
    # Checked against redis-server 7.0: quotes may open mid-argument; \v and \f are
    # blanks between arguments but do not end one; a raw CR splits arguments.
    assert commands_of(make, b'ECHO a"b c"\r\n') == [[b"ECHO", b"ab c"]]
    assert commands_of(make, b"\x0bECHO\x0cx a\x0bb\r\n") == [[b"ECHO\x0cx", b"a\x0bb"]]
    assert commands_of(make, b"ECHO a\rb\r\n") == [[b"ECHO", b"a", b"b"]]
    assert commands_of(make, b'ECHO "\\x4"\r\n') == [[b"ECHO", b"x4"]]


def test_inline_nul_is_an_ordinary_byte(make: MakeParser) -> None:
    assert commands_of(make, b'ECHO a\x00b "c\x00d"\r\n') == [[b"ECHO", b"a\x00b", b"c\x00d"]]


@pytest.mark.parametrize(
    "line",
    [b'SET "abc\r\n', b"SET 'abc\n", b'SET "a"b\r\n', b"SET 'a'b\r\n", b'SET "abc\\"\r\n'],
)
def test_inline_unbalanced_quotes(make: MakeParser, line: bytes) -> None:
    assert error_of(make, line) == "Protocol error: unbalanced quotes in request"


def test_inline_line_length_limit(make: MakeParser) -> None:
    limits = ParserLimits(max_inline_length=16)
    assert commands_of(make, b"ECHO 12345678901\n", limits) == [[b"ECHO", b"12345678901"]]
    assert error_of(make, b"ECHO 123456789012\n", limits) == "LineTooLong"
    # The \r counts: the line is judged without its "\n" only.
    assert error_of(make, b"ECHO 12345678901\r\n", limits) == "LineTooLong"
    # Without a newline the error comes as soon as the line is too long.
    parser = make(limits)
    parser.feed(b"x" * 16)
    assert parser.get_command() is None
    parser.feed(b"x")
    with pytest.raises(ProtocolError, match=r"^LineTooLong$"):
        parser.get_command()


def test_inline_default_limit_is_64k(make: MakeParser) -> None:
    line = b"ECHO " + b"x" * (64 * 1024 - 5)
    assert feed_pieces(make(), [line + b"\n"]) == ([[b"ECHO", line[5:]]], None)
    assert feed_pieces(make(), [line + b"x"]) == ([], "LineTooLong")


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


# --------------------------------------------------------------------------- encoders


@pytest.mark.parametrize(
    ("reply", "resp2", "resp3"),
    [
        (b"OK", b"$2\r\nOK\r\n", b"$2\r\nOK\r\n"),
        (b"", b"$0\r\n\r\n", b"$0\r\n\r\n"),
        (b"a\r\nb", b"$4\r\na\r\nb\r\n", b"$4\r\na\r\nb\r\n"),
        ("h\u00e9", b"$3\r\nh\xc3\xa9\r\n", b"$3\r\nh\xc3\xa9\r\n"),
        (bytearray(b"ab"), b"$2\r\nab\r\n", b"$2\r\nab\r\n"),
        (0, b":0\r\n", b":0\r\n"),
        (-12, b":-12\r\n", b":-12\r\n"),
        (2**63, b":9223372036854775808\r\n", b":9223372036854775808\r\n"),
        (None, b"$-1\r\n", b"_\r\n"),
        (NULL_ARRAY, b"*-1\r\n", b"_\r\n"),
        (True, b":1\r\n", b"#t\r\n"),
        (False, b":0\r\n", b"#f\r\n"),
        (1.5, b"$3\r\n1.5\r\n", b",1.5\r\n"),
        (float("inf"), b"$3\r\ninf\r\n", b",inf\r\n"),
        (float("-inf"), b"$4\r\n-inf\r\n", b",-inf\r\n"),
        (float("nan"), b"$3\r\nnan\r\n", b",nan\r\n"),
        (SimpleString("PONG"), b"+PONG\r\n", b"+PONG\r\n"),
        (
            ErrorReply("CONS Server shutdown"),
            b"-CONS Server shutdown\r\n",
            b"-CONS Server shutdown\r\n",
        ),
        ([], b"*0\r\n", b"*0\r\n"),
        ((b"a", 1), b"*2\r\n$1\r\na\r\n:1\r\n", b"*2\r\n$1\r\na\r\n:1\r\n"),
        ({}, b"*0\r\n", b"%0\r\n"),
        (
            {b"produced": 3, "acks": None},
            b"*4\r\n$8\r\nproduced\r\n:3\r\n$4\r\nacks\r\n$-1\r\n",
            b"%2\r\n$8\r\nproduced\r\n:3\r\n$4\r\nacks\r\n_\r\n",
        ),
    ],
)
def test_encode_each_reply_type(reply: object, resp2: bytes, resp3: bytes) -> None:
    assert encode(reply, 2) == resp2  # type: ignore[arg-type]
    assert encode(reply) == resp2  # type: ignore[arg-type]
    assert encode(reply, 3) == resp3  # type: ignore[arg-type]


def test_encode_nested_arrays_and_maps() -> None:
    reply = [[b"a", [1, None]], {b"k": [True, NULL_ARRAY]}, ErrorReply("ERR x")]
    assert encode(reply, 2) == (
        b"*3\r\n*2\r\n$1\r\na\r\n*2\r\n:1\r\n$-1\r\n*2\r\n$1\r\nk\r\n*2\r\n:1\r\n*-1\r\n-ERR x\r\n"
    )
    assert encode(reply, 3) == (
        b"*3\r\n*2\r\n$1\r\na\r\n*2\r\n:1\r\n_\r\n%1\r\n$1\r\nk\r\n*2\r\n#t\r\n_\r\n-ERR x\r\n"
    )


def test_encode_rafka_blpop_message_example() -> None:
    # Spec section 2.3, byte for byte.
    reply = [b"topic", b"greetings", b"partition", 2, b"offset", 10, b"value", b"hello there!"]
    expected = (
        b"*8\r\n$5\r\ntopic\r\n$9\r\ngreetings\r\n$9\r\npartition\r\n:2\r\n"
        b"$6\r\noffset\r\n:10\r\n$5\r\nvalue\r\n$12\r\nhello there!\r\n"
    )
    assert encode(reply, 2) == expected
    assert encode(reply, 3) == expected  # no RESP3-specific type in it


def test_encode_rafka_reply_shapes() -> None:
    assert encode(b"OK") == b"$2\r\nOK\r\n"  # CLIENT SETNAME / QUIT answer a bulk "OK"
    assert encode(SimpleString("OK")) == b"+OK\r\n"
    assert encode(ErrorReply("Command not supported: ")) == b"-Command not supported: \r\n"
    assert encode(NULL_ARRAY) == b"*-1\r\n"  # BLPOP timeout


def test_status_and_error_lines_cannot_break_the_framing() -> None:
    # Error texts can echo client input (a BLPOP key); CR/LF become spaces, as in Redis.
    assert encode(ErrorReply("CONS Cannot parse topics from `a\r\nb`")) == (
        b"-CONS Cannot parse topics from `a  b`\r\n"
    )
    assert encode(SimpleString("a\nb")) == b"+a b\r\n"


def test_encode_rejects_unknown_types() -> None:
    with pytest.raises(TypeError, match="cannot encode set"):
        encode({1, 2})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cannot encode object"):
        encode([b"ok", object()])


def test_encode_many_is_one_buffer_in_order() -> None:
    replies: list[Reply] = [SimpleString("PONG"), 1, None, [b"x"], {b"a": 1.0}]
    assert encode_many(replies, 2) == b"".join(encode(r, 2) for r in replies)
    assert (
        encode_many(replies, 3) == b"+PONG\r\n:1\r\n_\r\n*1\r\n$1\r\nx\r\n%1\r\n$1\r\na\r\n,1.0\r\n"
    )
    assert encode_many([], 3) == b""


def test_encoded_commands_parse_back(make: MakeParser) -> None:
    commands = [[b"RPUSHX", b"topics:t:key", b"\x00\r\n"], [b"PING"], [b""]]
    data = encode_many(commands, 2)
    assert commands_of(make, data) == commands


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
    for use_hiredis in (False, True):
        parser = make_parser(use_hiredis=use_hiredis)
        assert feed_pieces(parser, split_at(data, cuts)) == (commands, None)


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
    for parser_class in (PythonRequestParser, HiredisRequestParser):
        for pieces in ([data], split_at(data, cuts), [data[i : i + 1] for i in range(len(data))]):
            assert feed_pieces(parser_class(limits), pieces) == reference
