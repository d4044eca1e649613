"""The command surface at its edges (RPUSH acks parsed as Go does, CLIENT SETNAME with
CR/LF under MONITOR, BLMPOP syntax errors in Redis's order, a refused BLPOP on Dafka):
each test failed on the code before its fix, for the reason its docstring gives."""

from __future__ import annotations

import secrets
import socket
from collections.abc import Callable, Iterator

import pytest

from gateway.runner import ServerThread
from tests.support.fixtures import GatewayConfig
from tests.support.gateway import Raw, running
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_until


def group() -> str:
    return f"g{secrets.token_hex(4)}"


# --- RPUSH acks: Go's ParseInt for the 32-bit partition ------------------------------------


@pytest.mark.parametrize(
    ("ack", "error"),
    [
        # Go's ParseUint checks each digit against 1<<bitSize - 1: past 4294967295 the
        # partition is out of range at that digit, before the bad byte after it is seen.
        ("t:99999999999x:5", 'CONS strconv.ParseInt: parsing "99999999999x": value out of range'),
        ("t:-4294967296z:5", 'CONS strconv.ParseInt: parsing "-4294967296z": value out of range'),
        # Below that bound the bad byte is met first: a syntax error (already right).
        ("t:4294967295x:5", 'CONS strconv.ParseInt: parsing "4294967295x": invalid syntax'),
    ],
)
def test_ack_partition_range_error_comes_at_go_s_32_bit_bound(
    server: ServerThread, ack: str, error: str
) -> None:
    """Spec §2.4/#13: the partition is `strconv.ParseInt(s, 10, 32)`. Go's ParseUint stops
    with ErrRange as soon as the value passes 1<<32 - 1 (maxVal for bitSize 32), so
    `99999999999x` is 'value out of range'; gateway/goparse.py checks every digit
    against 1<<64 - 1 instead and reports 'invalid syntax'."""
    with Raw(server.port) as raw:
        raw.command("RPUSH", "acks", ack)  # parse errors come before the consumer check
        got = raw.read_line()
        assert got == f"-{error}\r\n".encode(), f"RPUSH acks {ack}: expected {error!r}, got {got!r}"


# --- CLIENT SETNAME with CR/LF and MONITOR --------------------------------------------------


def test_a_client_name_with_crlf_cannot_break_a_monitor_s_stream(server: ServerThread) -> None:
    """docs/gateway.md: MONITOR escapes CR and LF so that a value cannot break the
    monitor's RESP framing. The client id in `[0 <id>]` is written raw, and CLIENT
    SETNAME (a multibulk argument) takes CR/LF: any client can then inject lines, e.g.
    a fake error, into every monitor's stream."""
    name = f"{group()}:x\r\n-ERR injected"
    with Raw(server.port) as monitor, Raw(server.port) as other:
        monitor.command("MONITOR")
        monitor.expect(b"+OK\r\n")
        other.command("CLIENT", "SETNAME", name)
        other.expect(b"$2\r\nOK\r\n")
        other.command("PING")
        other.expect(b"+PONG\r\n")
        lines = []
        while True:  # the SETNAME line, then the PING line
            line = monitor.read_line()
            lines.append(line)
            if b'"PING"' in line:
                break
            if len(lines) > 10:
                break
        for line in lines:
            assert line.startswith(b"+"), f"a monitor line that is not a status reply: {lines!r}"


# --- BLMPOP: "the syntax errors are Redis's" ------------------------------------------------


@pytest.fixture(scope="module")
def memory_gateway(gateway_config: GatewayConfig) -> Iterator[ServerThread]:
    with running(gateway_config("memory")) as gateway:
        yield gateway


def _exchange(port: int, request: bytes) -> bytes:
    with Raw(port) as raw:
        raw.sock.settimeout(5)
        raw.send(request)
        raw.sock.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := raw.sock.recv(65536):
            received += chunk
        return received


@pytest.mark.parametrize(
    "request_bytes",
    [
        # Redis reads numkeys, the direction and COUNT first, the timeout last.
        b"BLMPOP abc 0 k LEFT\r\n",
        b"BLMPOP -1 x k LEFT\r\n",
        # Redis's integers (string2ll): no leading zero, no '_' (Python's int() takes both).
        b"BLMPOP 0.1 01 k LEFT\r\n",
        b"BLMPOP 0.1 1 k LEFT COUNT 1_000\r\n",
        b"BLMPOP 0.1 1_0 k LEFT\r\n",
        # Redis's float (string2ld): no leading space.
        b'BLMPOP " 1" 1 k LEFT\r\n',
    ],
)
def test_blmpop_syntax_errors_are_redis_s(
    memory_gateway: ServerThread, redis_server: RedisServer, request_bytes: bytes
) -> None:
    """docs/gateway.md, BLMPOP: 'The syntax errors are Redis's'. For these bytes Redis 7
    answers a syntax error; the gateway answers another one, or none (it accepts
    `COUNT 1_000`, `01`, `" 1"` and goes on to the key)."""
    ours = _exchange(memory_gateway.port, request_bytes)
    theirs = _exchange(redis_server.port, request_bytes)
    assert theirs.startswith(b"-ERR "), f"redis-server did not refuse {request_bytes!r}: {theirs!r}"
    assert ours == theirs, f"{request_bytes!r}: rafka {ours!r}, redis {theirs!r}"


# --- BLPOP: a refused consumer leaves nothing behind ----------------------------------------


def test_a_refused_consumer_is_refused_again_and_leaves_no_group(
    server: ServerThread, new_topic: Callable[[int], str], engine_name: str
) -> None:
    """A key with an empty topic (`topics:<t>,`, a typo) cannot make a consumer: the
    first BLPOP answers `CONS Failed to register Consumer ...`. The same BLPOP again on
    the same connection must answer the same, and once the connection is gone the engine
    must hold nothing for the group. On Dafka the failed join has already added the
    topics to the group (and subscribed the valid one): the second BLPOP 'succeeds' with
    a consumer of an invalid topic list, and the group stays in the engine for good,
    subscribed and fetching records for no one (one per hostile group name)."""
    topic = new_topic(1)
    name = f"{group()}:typo"
    key = f"topics:{topic},"
    expected = f"-CONS Failed to register Consumer '{name}|{topic},' for Client '{name}'\r\n"
    with Raw(server.port, timeout=20) as raw:
        raw.command("CLIENT", "SETNAME", name)
        raw.expect(b"$2\r\nOK\r\n")
        for attempt in (1, 2):
            raw.command("BLPOP", key, "0.2")
            got = raw.read_line()
            assert got == expected.encode(), f"BLPOP {key} attempt {attempt}: {got!r}"
    gateway_name = name.split(":")[0]
    engine = server.server.ctx.engine
    groups = getattr(engine, "_groups", None)
    if groups is not None:  # Dafka keeps its groups in the engine
        wait_until(
            lambda: name not in server.server.ctx.clients, 10, "the connection to be released"
        )
        assert gateway_name not in groups, (
            f"group {gateway_name} of a refused consumer is still held by the engine, "
            f"subscribed to {sorted(groups[gateway_name].topics)!r}"
        )
