"""Pure functions of the gateway: Go number parsing, BLPOP key and timeout, MONITOR lines,
the texts of engine errors."""

from __future__ import annotations

import pytest

from backends.base import (
    AckError,
    ConsumeError,
    ConsumerCreationError,
    EngineError,
    MetadataClientError,
    MetadataError,
    ProduceError,
    ProducerCreationError,
)
from gateway.commands.consume import parse_timeout, parse_topics_key
from gateway.errors import RespError, from_engine
from gateway.goparse import GoParseError, go_quote, parse_int, wrap_int64
from gateway.monitor import format_line


@pytest.mark.parametrize(
    ("raw", "base", "bits", "value"),
    [
        (b"7", 10, 32, 7),
        (b"-2147483648", 10, 32, -(2**31)),
        (b"+12", 10, 32, 12),
        (b"0x1f", 0, 64, 31),
        (b"0X1F", 0, 64, 31),
        (b"010", 0, 64, 8),
        (b"0", 0, 64, 0),
        (b"-1", 0, 64, -1),
        (b"9223372036854775807", 0, 64, 2**63 - 1),
        (b"-9223372036854775808", 0, 64, -(2**63)),
    ],
)
def test_go_parse_int_accepts_what_go_accepts(raw: bytes, base: int, bits: int, value: int) -> None:
    assert parse_int(raw, base, bits) == value


@pytest.mark.parametrize(
    ("raw", "base", "bits", "message"),
    [
        (b"foo", 10, 32, 'strconv.ParseInt: parsing "foo": invalid syntax'),
        (b"", 10, 32, 'strconv.ParseInt: parsing "": invalid syntax'),
        (b"-", 10, 32, 'strconv.ParseInt: parsing "-": invalid syntax'),
        (b"2147483648", 10, 32, 'strconv.ParseInt: parsing "2147483648": value out of range'),
        (b"0x10", 10, 32, 'strconv.ParseInt: parsing "0x10": invalid syntax'),
        (b"08", 0, 64, 'strconv.ParseInt: parsing "08": invalid syntax'),
        (b"0x", 0, 64, 'strconv.ParseInt: parsing "0x": invalid syntax'),
        (b"1_000", 0, 64, 'strconv.ParseInt: parsing "1_000": invalid syntax'),
        (b"0b1", 0, 64, 'strconv.ParseInt: parsing "0b1": invalid syntax'),
        (
            b"9223372036854775808",
            0,
            64,
            'strconv.ParseInt: parsing "9223372036854775808": value out of range',
        ),
        (
            b"99999999999999999999x",
            0,
            64,
            'strconv.ParseInt: parsing "99999999999999999999x": value out of range',
        ),
        (b'a"b', 10, 32, 'strconv.ParseInt: parsing "a\\"b": invalid syntax'),
    ],
)
def test_go_parse_int_error_texts(raw: bytes, base: int, bits: int, message: str) -> None:
    with pytest.raises(GoParseError) as caught:
        parse_int(raw, base, bits)
    assert str(caught.value) == message


def test_go_quote_escapes_like_strconv_quote() -> None:
    assert go_quote(b"tab\there") == '"tab\\there"'
    assert go_quote(b"\xff") == '"\\xff"'
    assert go_quote("é".encode()) == '"é"'
    assert go_quote(b"\x01") == '"\\x01"'


def test_int64_wraps_like_go() -> None:
    assert wrap_int64(2**63) == -(2**63)
    assert wrap_int64(5) == 5


# G11 / G12 (Rafka's TestParseTopics and TestParseConfig)
@pytest.mark.parametrize(
    ("key", "topics"),
    [
        ("topics:bar", ["bar"]),
        ("topics:foo,bar", ["foo", "bar"]),
        ("topics:baz:", ["baz"]),
        ("topics:baz,foo:", ["baz", "foo"]),
        ("topics:", [""]),
        ("topics:a,a", ["a", "a"]),
    ],
)
def test_parse_topics(key: str, topics: list[str]) -> None:
    assert parse_topics_key(key) == (topics, None)


def test_parse_config() -> None:
    assert parse_topics_key('topics:bar:{"cfg":"foo"}') == (["bar"], {"cfg": "foo"})
    _, settings = parse_topics_key('topics:bar:{"a":"b","c":"d","e":"f"}')
    assert settings == {"a": "b", "c": "d", "e": "f"}
    # Colons inside the JSON, numbers as literal text, trailing bytes ignored, null = none.
    _, settings = parse_topics_key('topics:t:{"x":"a:b","n":1.50,"big":12345678901234567890} x')
    assert settings == {"x": "a:b", "n": "1.50", "big": "12345678901234567890"}
    assert parse_topics_key("topics:t:null") == (["t"], None)


@pytest.mark.parametrize(
    ("key", "text"),
    [
        ("foo", "CONS Cannot parse topics from `foo`"),
        ("topic:foo", "CONS Cannot parse topics from `topic:foo`"),
        ("Topics:foo", "CONS Cannot parse topics from `Topics:foo`"),
        ("topics:t:{", "CONS Error parsing configuration from '{'; "),
        ("topics:t: ", "CONS Error parsing configuration from ' '; EOF"),
        (
            'topics:t:"x"',
            "CONS Error parsing configuration from '\"x\"'; json: cannot unmarshal string "
            "into Go value of type map[string]interface {}",
        ),
    ],
)
def test_parse_topics_errors(key: str, text: str) -> None:
    with pytest.raises(RespError) as caught:
        parse_topics_key(key)
    assert caught.value.text.startswith(text)


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [
        (b"1", 1.0),
        (b"0.3", 0.3),
        (b".5", 0.5),
        (b"0", None),
        (b"0.0", None),
        (b"topics:x", 5.0),
        (b"abc", 5.0),
        (b"nan", 5.0),
        (b"", 5.0),
    ],
)
def test_parse_timeout(raw: bytes, seconds: float | None) -> None:
    assert parse_timeout(raw, 5.0) == seconds
    assert parse_timeout(raw, 5.0) == seconds, "the second time (a look-up)"
    # Another default (another configuration) is another answer for what is no number.
    assert parse_timeout(raw, 7.0) == (7.0 if seconds == 5.0 else seconds)


def test_negative_timeout_is_refused_with_redis_text() -> None:
    for _ in range(2):  # the second time too: a refusal is not remembered as an answer
        with pytest.raises(RespError) as caught:
            parse_timeout(b"-1", 5.0)
        assert caught.value.text == "ERR timeout is negative"


def test_monitor_line_format() -> None:
    line = format_line("g:c", [b"rpushx", b"topics:t", b'say "hi"'], 1234.5)
    assert line == b'+1234.500000 [0 g:c] "rpushx" "topics:t" "say "hi""\r\n'
    # CR/LF would end a simple string early: escaped. Passwords never reach monitors.
    assert format_line("x", [b"PING", b"a\r\nb"], 1.0) == b'+1.000000 [0 x] "PING" "a\\r\\nb"\r\n'
    assert b"secret" not in format_line("x", [b"AUTH", b"secret"], 1.0)
    hello = format_line("x", [b"HELLO", b"3", b"AUTH", b"default", b"secret"], 1.0)
    assert b"secret" not in hello
    assert hello.startswith(b'+1.000000 [0 x] "HELLO" "3" "AUTH"')


@pytest.mark.parametrize(
    ("error", "text"),
    [
        (ProduceError("Local: Queue full"), "PROD Local: Queue full"),
        (ProducerCreationError("bad"), "PROD Error spawning producer: bad"),
        (ConsumeError("Broker: x"), "CONS Poll Broker: x"),
        (AckError("Unknown partition"), "CONS Unknown partition"),
        (MetadataError("Local: Timed out"), "ERR Error getting metadata: Local: Timed out"),
        (MetadataClientError("bad"), "ERR Error spawning producer: bad"),
    ],
)
def test_each_engine_error_has_its_rafka_text(error: EngineError, text: str) -> None:
    assert from_engine(error).text == text


@pytest.mark.parametrize("error", [EngineError("x"), ConsumerCreationError("x")])
def test_an_engine_error_without_a_text_is_a_bug_not_a_reply(error: EngineError) -> None:
    with pytest.raises(TypeError):
        from_engine(error)
