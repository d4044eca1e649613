"""The gateway against a real redis-server, byte for byte, over raw sockets.

The same request bytes go to both (in RESP2, and in RESP3 after `HELLO 3`); the client
then half-closes its side and reads everything until the server closes. The replies
must be identical, or the difference must be one of those listed below, each of which
docs/gateway.md ("Where we differ from Redis") names with its reason. Most reasons are
that the Rafka spec fixes the text (specs/rafka-protocol.md): Rafka's texts win.

Numbers that differ by nature (client ids, the server's name and version in HELLO) are
masked before comparing.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.runner import ServerThread
from tests.support.fixtures import GatewayConfig
from tests.support.gateway import Raw, running
from tests.support.redis_server import RedisServer

DOCS = Path(__file__).resolve().parents[2] / "docs" / "gateway.md"

# Served the same, byte for byte.
SAME: dict[str, bytes] = {
    "PING multibulk": b"*1\r\n$4\r\nPING\r\n",
    "PING inline": b"PING\r\n",
    "CLIENT ID": b"CLIENT ID\r\n",
    "HELLO 2": b"HELLO 2\r\n",
    "HELLO 3": b"HELLO 3\r\n",
    "HELLO 4": b"HELLO 4\r\n",
    "HELLO not a number": b"HELLO x\r\n",
    "HELLO bad option": b"HELLO 3 FOO\r\n",
    "COMMAND INFO of an unknown command": b"COMMAND INFO nosuch\r\n",
    "ECHO": b"ECHO hi\r\n",
    "ECHO wrong arity": b"ECHO\r\n",
    "SELECT 0": b"SELECT 0\r\n",
    "SELECT 16": b"SELECT 16\r\n",
    "SELECT not a number": b"SELECT x\r\n",
    "SELECT wrong arity": b"SELECT\r\n",
    "inline double quotes": b'SELECT "0"\r\n',
    "inline single quotes": b"SELECT '0'\r\n",
    "inline hex escape": b'SELECT "\\x30"\r\n',
    "inline text after a closing quote": b'SELECT "0"x\r\n',
    "inline unclosed quote": b'SELECT "0\r\n',
    "inline blank lines": b"\r\n\r\n  \r\nPING\r\n",
    "inline bare LF": b"PING\nPING\n",
    "null multibulk *-1": b"*-1\r\nPING\r\n",
    "pipeline": b"PING\r\n*1\r\n$4\r\nPING\r\nSELECT 0\r\n",
}


@dataclass(frozen=True)
class Difference:
    """A documented difference: `doc` appears in docs/gateway.md's Redis section; the
    replies are regular expressions (RESP3's where they differ from RESP2's)."""

    request: bytes
    rafka: bytes
    redis: bytes
    doc: str
    rafka3: bytes | None = None
    redis3: bytes | None = None


DIFFERENT: dict[str, Difference] = {
    "PING with an argument": Difference(
        b"PING hello\r\n", rb"\+PONG\r\n", rb"\$5\r\nhello\r\n", "`PING <arg>`"
    ),
    "PING wrong arity": Difference(
        b"PING a b\r\n",
        rb"\+PONG\r\n",
        rb"-ERR wrong number of arguments for 'ping' command\r\n",
        "`PING <arg>`",
    ),
    "unknown command": Difference(
        b"FOO a b\r\n",
        rb"-Command not supported: FOO\r\n",
        rb"-ERR unknown command 'FOO', with args beginning with: 'a' 'b' \r\n",
        "unknown command",
    ),
    "CLIENT SETNAME": Difference(
        b"CLIENT SETNAME g:c\r\n", rb"\$2\r\nOK\r\n", rb"\+OK\r\n", "`CLIENT SETNAME`"
    ),
    "CLIENT GETNAME after SETNAME": Difference(
        b"CLIENT SETNAME g:c\r\nCLIENT GETNAME\r\n",
        rb"\$2\r\nOK\r\n\$3\r\ng:c\r\n",
        rb"\+OK\r\n\$3\r\ng:c\r\n",
        "`CLIENT SETNAME`",
    ),
    "CLIENT SETNAME without a colon": Difference(
        b"CLIENT SETNAME foo\r\n",
        rb"-CONS Cannot parse group.id\r\n",
        rb"\+OK\r\n",
        "`CLIENT SETNAME`",
    ),
    "CLIENT SETNAME wrong arity": Difference(
        b"CLIENT SETNAME\r\n",
        rb"-CONS Cannot parse group.id\r\n",
        rb"-ERR wrong number of arguments for 'client\|setname' command\r\n",
        "`CLIENT SETNAME`",
    ),
    "CLIENT GETNAME before SETNAME": Difference(
        b"CLIENT GETNAME\r\n",
        rb"\$\d+\r\n127\.0\.0\.1:\d+\r\n",
        rb"\$-1\r\n",
        "`CLIENT GETNAME`",
        redis3=rb"_\r\n",
    ),
    "CLIENT SETINFO": Difference(
        b"CLIENT SETINFO lib-name x\r\n",
        rb"\+OK\r\n",
        rb"-ERR unknown subcommand 'SETINFO'\. Try CLIENT HELP\.\r\n",
        "`CLIENT SETINFO`",
    ),
    "CLIENT without a subcommand": Difference(
        b"CLIENT\r\n",
        rb"-Command not supported: \r\n",
        rb"-ERR wrong number of arguments for 'client' command\r\n",
        "other `CLIENT` subcommands",
    ),
    "CLIENT LIST": Difference(
        b"CLIENT LIST\r\n",
        rb"-Command not supported: LIST\r\n",
        rb"\$\d+\r\nid=.*\n\r\n",
        "other `CLIENT` subcommands",
        redis3=rb"=\d+\r\ntxt:id=.*\n\r\n",
    ),
    "COMMAND COUNT": Difference(b"COMMAND COUNT\r\n", rb":20\r\n", rb":\d{3}\r\n", "`COMMAND`"),
    "COMMAND INFO": Difference(
        b"COMMAND INFO PING\r\n",
        rb"\*1\r\n\*10\r\n\$4\r\nping\r\n:-1\r\n\*1\r\n\+fast\r\n:0\r\n:0\r\n:0\r\n"
        rb"\*0\r\n\*0\r\n\*0\r\n\*0\r\n",
        rb"\*1\r\n\*10\r\n\$4\r\nping\r\n:-1\r\n\*1\r\n\+fast\r\n:0\r\n:0\r\n:0\r\n"
        rb"\*2\r\n\+@fast\r\n\+@connection\r\n\*2\r\n.*",
        "`COMMAND INFO <ours>`",
        redis3=rb"\*1\r\n\*10\r\n\$4\r\nping\r\n:-1\r\n~1\r\n\+fast\r\n:0\r\n:0\r\n:0\r\n~2\r\n.*",
    ),
    "SELECT 1": Difference(
        b"SELECT 1\r\n", rb"-ERR DB index is out of range\r\n", rb"\+OK\r\n", "`SELECT <n>`"
    ),
    "empty multibulk *0": Difference(
        b"*0\r\nPING\r\n",
        rb"-Command not supported: \r\n\+PONG\r\n",
        rb"\+PONG\r\n",
        "`*0`",
    ),
    "null bulk $-1 as an argument": Difference(
        b"*1\r\n$-1\r\n",
        rb"-Command not supported: \r\n",
        rb"-ERR Protocol error: invalid bulk length\r\n",
        "`$-1`",
    ),
    "multibulk count not a number": Difference(
        b"*x\r\n",
        rb"-Expect Number\r\n",
        rb"-ERR Protocol error: invalid multibulk length\r\n",
        "protocol errors",
    ),
    "negative multibulk count": Difference(
        b"*-5\r\nPING\r\n",
        rb"-TooManyArg\r\n",
        rb"\+PONG\r\n",
        "negative multibulk count",
    ),
    "huge multibulk count": Difference(
        b"*99999999999\r\n",
        rb"-TooManyArg\r\n",
        rb"-ERR Protocol error: invalid multibulk length\r\n",
        "protocol errors",
    ),
    "multibulk count over max_arguments": Difference(
        b"*2000000\r\n", rb"-TooManyArg\r\n", rb"", "`max_arguments`"
    ),
    "bulk length not a number": Difference(
        b"*1\r\n$x\r\n",
        rb"-Expect Number\r\n",
        rb"-ERR Protocol error: invalid bulk length\r\n",
        "protocol errors",
    ),
    "negative bulk length": Difference(
        b"*1\r\n$-5\r\n",
        rb"-Invalid bulk size\r\n",
        rb"-ERR Protocol error: invalid bulk length\r\n",
        "protocol errors",
    ),
    "huge bulk length": Difference(
        b"*1\r\n$600000000\r\n",
        rb"-Invalid bulk size\r\n",
        rb"-ERR Protocol error: invalid bulk length\r\n",
        "protocol errors",
    ),
    "missing $": Difference(
        b"*1\r\nfoo\r\n",
        rb"-Expect TypeChar\r\n",
        rb"-ERR Protocol error: expected '\$', got 'f'\r\n",
        "protocol errors",
    ),
    "nested type": Difference(
        b"*2\r\n$4\r\nPING\r\n:1\r\n",
        rb"-Expect TypeChar\r\n",
        rb"-ERR Protocol error: expected '\$', got ':'\r\n",
        "protocol errors",
    ),
    "bulk data longer than announced": Difference(
        b"*1\r\n$4\r\nPINGxx\r\n",
        rb"-Expect Newline\r\n",
        rb"\+PONG\r\n",
        "bulk data longer than announced",
    ),
    "inline line too long": Difference(
        b"PING " + b"x" * 70_000,
        rb"-LineTooLong\r\n",
        rb"-ERR Protocol error: too big inline request\r\n",
        "protocol errors",
    ),
}


def exchange(port: int, request: bytes, protocol: int) -> bytes:
    """Send `request` (after `HELLO 3` for RESP3), half-close, read until closed."""
    with Raw(port) as raw:
        if protocol == 3:
            raw.command("HELLO", "3")
            raw.read_reply()
        raw.send(request)
        raw.sock.shutdown(socket.SHUT_WR)
        received = [raw.read_exact(0)]
        try:
            while chunk := raw.sock.recv(65536):
                received.append(chunk)
        except ConnectionResetError:
            pass  # the server closed with our bytes unread: what it sent came first
        return b"".join(received)


def masked(reply: bytes) -> bytes:
    """Client ids, and HELLO's server name and version, replaced by placeholders."""
    reply = re.sub(rb"^:\d+\r\n$", b":<id>\r\n", reply)  # CLIENT ID
    reply = re.sub(rb"(\$2\r\nid\r\n|\+id\r\n):\d+", rb"\1:<id>", reply)
    reply = re.sub(rb"(\$6\r\nserver\r\n)\$\d+\r\n\w+", rb"\1<server>", reply)
    return re.sub(rb"(\$7\r\nversion\r\n)\$\d+\r\n[\d.]+", rb"\1<version>", reply)


@pytest.fixture(scope="module")
def gateway(gateway_config: GatewayConfig) -> Iterator[ServerThread]:
    with running(gateway_config("memory")) as server:
        yield server


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("case", list(SAME))
def test_same_reply_bytes_as_redis(
    gateway: ServerThread, redis_server: RedisServer, case: str, protocol: int
) -> None:
    request = SAME[case]
    ours = masked(exchange(gateway.port, request, protocol))
    theirs = masked(exchange(redis_server.port, request, protocol))
    assert ours == theirs, f"{case} (RESP{protocol}): rafka {ours!r}, redis {theirs!r}"


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("case", list(DIFFERENT))
def test_documented_differences_from_redis(
    gateway: ServerThread, redis_server: RedisServer, case: str, protocol: int
) -> None:
    difference = DIFFERENT[case]
    ours = exchange(gateway.port, difference.request, protocol)
    theirs = exchange(redis_server.port, difference.request, protocol)
    expected_ours = (protocol == 3 and difference.rafka3) or difference.rafka
    expected_theirs = (protocol == 3 and difference.redis3) or difference.redis
    assert re.fullmatch(expected_ours, ours, re.S), f"rafka answered {ours!r}"
    assert re.fullmatch(expected_theirs, theirs, re.S), f"redis answered {theirs!r}"


def test_every_difference_is_documented() -> None:
    text = DOCS.read_text()
    section = text.split("## Where we differ from Redis", 1)[1].split("\n## ", 1)[0]
    missing = sorted({d.doc for d in DIFFERENT.values() if d.doc not in section})
    assert not missing, f"differences not listed in docs/gateway.md: {missing}"


def test_max_clients_answered_as_redis_does(gateway_config: GatewayConfig) -> None:
    """One client admitted, the next refused: the same bytes, then the close."""
    with (
        RedisServer(10.0, "--maxclients", "1") as redis,
        running(gateway_config("memory", max_clients=1)) as ours,
    ):
        refusals = []
        for port in (ours.port, redis.port):
            with Raw(port) as first:
                first.command("PING")
                first.expect(b"+PONG\r\n")
                with Raw(port) as second:
                    second.sock.settimeout(5)
                    refusals.append(second.sock.recv(65536))
                    second.assert_closed()
        assert refusals == [b"-ERR max number of clients reached\r\n"] * 2
