"""Reply values -> RESP2 and RESP3 bytes."""

from __future__ import annotations

import pytest

from gateway.resp import NULL_ARRAY, ErrorReply, Reply, SimpleString, encode, encode_many


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
