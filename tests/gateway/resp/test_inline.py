"""Inline (telnet) commands: Redis's splitting and quoting rules, through both parsers."""

from __future__ import annotations

import pytest

from gateway.resp import ParserLimits, ProtocolError
from tests.gateway.resp.parsing import MakeParser, commands_of, error_of, feed_pieces


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
    assert error_of(make, line) == "ERR Protocol error: unbalanced quotes in request"


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
