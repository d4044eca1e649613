"""The RESP surface over real sockets: framing, pipelining, limits, HELLO/AUTH, MONITOR.

None of these tests depends on what the engine does, and the gateway must not depend on
which engine it runs: each runs on the in-memory engine and on the Kafka engine (Tansu).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from backends.base import Stats
from gateway import __version__
from gateway.runner import ServerThread
from gateway.stats import ServerStats
from tests.support.engines import GATEWAY_ENGINES
from tests.support.fixtures import GatewayConfig
from tests.support.gateway import Raw, client, running
from tests.support.waiting import wait_until


@pytest.fixture(scope="module", params=["memory", *GATEWAY_ENGINES])
def engine_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def test_ping_ignores_arguments_and_inline_works(server: ServerThread) -> None:  # A1
    with Raw(server.port) as raw:
        raw.command("PING")
        raw.expect(b"+PONG\r\n")
        raw.command("ping", "hello")
        raw.expect(b"+PONG\r\n")
        raw.send(b"PING\r\n")
        raw.expect(b"+PONG\r\n")


def test_pipelined_commands_come_back_in_one_write(server: ServerThread) -> None:
    with Raw(server.port) as raw:
        raw.send(b"*1\r\n$4\r\nPING\r\n" * 100)
        # One read on the server, one write back: the first recv holds every reply.
        raw.sock.settimeout(10)
        first = raw.sock.recv(65536)
        assert first == b"+PONG\r\n" * 100


def test_pipeline_mixes_replies_in_order(server: ServerThread) -> None:
    with Raw(server.port) as raw:
        raw.send(
            b"PING\r\nCLIENT SETNAME pipe:line\r\nCLIENT GETNAME\r\nHGETALL nope\r\n*0\r\n"
            b"*-1\r\nDEL stats x\r\n"
        )
        raw.expect(
            b"+PONG\r\n$2\r\nOK\r\n$9\r\npipe:line\r\n"
            b"-ERR Expected key to be 'stats', got NOPE\r\n-Command not supported: \r\n:1\r\n"
        )


def test_quit_answers_bulk_ok_then_closes(server: ServerThread) -> None:  # A2
    with Raw(server.port) as raw:
        raw.send(b"QUIT\r\nPING\r\n")
        raw.expect(b"$2\r\nOK\r\n")
        raw.assert_closed()


def test_unsupported_commands_keep_the_connection(server: ServerThread) -> None:  # A3
    with Raw(server.port) as raw:
        raw.command("GET", "x")
        raw.expect(b"-Command not supported: GET\r\n")
        raw.command("client", "list")
        raw.expect(b"-Command not supported: LIST\r\n")
        raw.command("CLIENT")
        raw.expect(b"-Command not supported: \r\n")
        raw.command("lpush", "a", "b")
        raw.expect(b"-Command not supported: LPUSH\r\n")
        # SELECT is served now (redis-py/redis-rb may send SELECT 0).
        raw.command("SELECT", "1")
        raw.expect(b"-ERR DB index is out of range\r\n")
        raw.command("SELECT", "0")
        raw.expect(b"+OK\r\n")
        raw.command("SELECT", "x")
        raw.expect(b"-ERR value is not an integer or out of range\r\n")
        raw.command("PING")
        raw.expect(b"+PONG\r\n")


def test_client_subcommands(server: ServerThread) -> None:  # A4, A5
    with Raw(server.port) as raw:
        local_port = raw.sock.getsockname()[1]
        raw.command("CLIENT", "GETNAME")
        peer = f"127.0.0.1:{local_port}".encode()
        raw.expect(b"$%d\r\n%b\r\n" % (len(peer), peer))
        raw.command("CLIENT", "SETINFO", "LIB-NAME", "x")
        raw.expect(b"+OK\r\n")
        raw.command("CLIENT", "ID")
        assert re.fullmatch(rb":\d+\r\n", raw.read_line())
        raw.command("CLIENT", "SETNAME", "nocolon")
        raw.expect(b"-CONS Cannot parse group.id\r\n")
        raw.command("CLIENT", "SETNAME")
        raw.expect(b"-CONS Cannot parse group.id\r\n")
        raw.command("CLIENT", "SETNAME", "grp:a5:extra")
        raw.expect(b"$2\r\nOK\r\n")
        raw.command("CLIENT", "SETNAME", "grp:a5:extra")
        raw.expect(b"-CONS id grp:a5:extra is already taken\r\n")
        raw.command("CLIENT", "SETNAME", "grp:other")
        raw.expect(b"-CONS Client ID is already set to grp:a5:extra\r\n")
        raw.command("CLIENT", "GETNAME")
        raw.expect(b"$12\r\ngrp:a5:extra\r\n")
        with Raw(server.port) as second:
            second.command("CLIENT", "SETNAME", "grp:a5:extra")
            second.expect(b"-CONS id grp:a5:extra is already taken\r\n")


def test_setid_twice_and_concurrent_ids(server: ServerThread) -> None:  # G2, G8
    first = client(server)
    assert first.client_setname("foobar:foo2")
    with pytest.raises(redis.ResponseError, match="CONS Client ID is already set to foobar:foo2"):
        first.client_setname("foobar:foo3")
    first.close()

    def named(n: int) -> str:
        c = client(server, client_name=f"foo:bar-{n}")
        try:
            return str(c.client_getname())
        finally:
            c.close()

    with ThreadPoolExecutor(max_workers=20) as pool:
        names = list(pool.map(named, range(100)))
    assert names == [f"foo:bar-{n}" for n in range(100)]


def test_protocol_error_closes_only_that_connection(server: ServerThread) -> None:
    with Raw(server.port) as bystander, Raw(server.port) as bad:
        bad.send(b"PING\r\n*2\r\nfoo\r\n")
        bad.expect(b"+PONG\r\n-Expect TypeChar\r\n")
        bad.assert_closed()
        bystander.command("PING")
        bystander.expect(b"+PONG\r\n")


def test_too_many_arguments_with_rafka_limit(  # A14
    engine_name: str, gateway_config: GatewayConfig
) -> None:
    config = gateway_config(engine_name, max_arguments=20)
    with running(config) as limited, Raw(limited.port) as raw:
        raw.command(*(["PING"] * 20))
        raw.expect(b"+PONG\r\n")
        raw.command(*(["PING"] * 21))
        raw.expect(b"-TooManyArg\r\n")
        raw.assert_closed()


def test_max_clients(engine_name: str, gateway_config: GatewayConfig) -> None:
    with running(gateway_config(engine_name, max_clients=2)) as small:
        first, second = Raw(small.port), Raw(small.port)
        for raw in (first, second):
            raw.command("PING")
            raw.expect(b"+PONG\r\n")
        with Raw(small.port) as third:
            third.expect(b"-ERR max number of clients reached\r\n")
            third.assert_closed()
        first.close()
        wait_until(lambda: small.server.connections == 1, 5, "the first connection to end")
        with Raw(small.port) as fourth:
            fourth.command("PING")
            fourth.expect(b"+PONG\r\n")
        second.close()


def test_idle_timeout_closes_silent_connections(
    engine_name: str, gateway_config: GatewayConfig
) -> None:
    with running(gateway_config(engine_name, idle_timeout=0.3)) as idle, Raw(idle.port) as raw:
        raw.command("PING")
        raw.expect(b"+PONG\r\n")
        started = time.monotonic()
        raw.assert_closed(timeout=5)
        assert time.monotonic() - started >= 0.25


def test_hello_3_switches_every_reply_to_resp3(server: ServerThread) -> None:
    with Raw(server.port) as raw:
        raw.command("CLIENT", "ID")
        number = raw.read_line()[1:-2]
        raw.command("HELLO", "3")
        version = __version__.encode()
        raw.expect(
            b"%7\r\n$6\r\nserver\r\n$5\r\nrafka\r\n$7\r\nversion\r\n$"
            + str(len(version)).encode()
            + b"\r\n"
            + version
            + b"\r\n$5\r\nproto\r\n:3\r\n$2\r\nid\r\n:"
            + number
            + b"\r\n$4\r\nmode\r\n$10\r\nstandalone\r\n$4\r\nrole\r\n$6\r\nmaster\r\n"
            b"$7\r\nmodules\r\n*0\r\n"
        )
        raw.command("HGETALL", "stats")
        names = Stats.COUNTERS + ServerStats.COUNTERS + ServerStats.GAUGES
        raw.expect(b"%%%d\r\n" % len(names))  # a RESP3 map
        for _ in range(len(names) * 2):
            raw.read_reply()
        raw.command("HELLO", "4")
        raw.expect(b"-NOPROTO unsupported protocol version\r\n")
        raw.command("HELLO", "x")
        raw.expect(b"-ERR Protocol version is not an integer or out of range\r\n")
        raw.command("HELLO", "3", "BOGUS")
        raw.expect(b"-ERR Syntax error in HELLO option 'BOGUS'\r\n")


def test_hello_setname_and_hello_2(server: ServerThread) -> None:
    with Raw(server.port) as raw:
        raw.command("HELLO", "2", "SETNAME", "hello:named")
        reply = raw.read_reply()  # RESP2: a flat array of 7 pairs
        assert len(reply) == 14
        assert reply[4:6] == [b"proto", 2]
        raw.command("CLIENT", "GETNAME")
        raw.expect(b"$11\r\nhello:named\r\n")


def test_redis_py_both_protocols(server: ServerThread) -> None:
    for protocol in (2, 3):
        c = client(server, protocol=protocol)
        assert c.ping() is True
        stats = c.hgetall("stats")
        assert list(stats)[:3] == [
            b"producer.unflushed.messages",
            b"producer.delivery.errors",
            b"producer.unknown.events",
        ]
        assert all(int(value) >= 0 for value in stats.values())
        assert c.delete("stats") == 1
        c.close()


def test_command_introspection(server: ServerThread) -> None:
    with Raw(server.port) as raw:
        raw.command("COMMAND", "COUNT")
        raw.expect(b":20\r\n")
        raw.command("COMMAND", "INFO", "rpushx", "nosuch")
        raw.expect(
            b"*2\r\n*10\r\n$6\r\nrpushx\r\n:-3\r\n*2\r\n+write\r\n+fast\r\n"
            b":1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n$-1\r\n"
        )
        raw.command("COMMAND", "DOCS", "blpop")
        raw.expect(b"*2\r\n$5\r\nblpop\r\n*10\r\n$7\r\nsummary\r\n")
        assert raw.read_line().startswith(b"$")
        assert raw.read_line().startswith(b"Consume one record")
    with Raw(server.port) as raw:
        raw.command("COMMAND", "DOCS", "blmpop")
        docs = raw.read_reply()
        assert docs[0] == b"blmpop" and docs[1][1].startswith(b"Consume up to n records")


def test_redis_cli_talks_to_the_gateway(server: ServerThread) -> None:
    redis_cli = shutil.which("redis-cli")
    assert redis_cli, "redis-cli is installed by `make test` (redis-tools)"
    out = subprocess.run(
        [redis_cli, "-p", str(server.port), "PING"],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    assert out.stdout.strip() == "PONG"
    out = subprocess.run(
        [redis_cli, "-p", str(server.port), "HGETALL", "stats"],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    assert out.stdout.splitlines()[0] == "producer.unflushed.messages"


def test_auth_not_configured(server: ServerThread) -> None:
    with Raw(server.port) as raw:
        raw.command("AUTH", "pw")
        raw.expect(
            b"-ERR AUTH <password> called without any password configured for the default "
            b"user. Are you sure your configuration is correct?\r\n"
        )


def test_auth_flow(engine_name: str, gateway_config: GatewayConfig) -> None:
    with running(gateway_config(engine_name, password="s3cret")) as locked:
        with Raw(locked.port) as raw:
            raw.command("PING")
            raw.expect(b"-NOAUTH Authentication required.\r\n")
            raw.command("HELLO", "3")
            assert raw.read_line().startswith(b"-NOAUTH HELLO must be called with the client")
            raw.command("AUTH", "wrong")
            raw.expect(b"-WRONGPASS invalid username-password pair or user is disabled.\r\n")
            raw.command("AUTH", "someone", "s3cret")
            raw.expect(b"-WRONGPASS invalid username-password pair or user is disabled.\r\n")
            raw.command("AUTH", "s3cret")
            raw.expect(b"+OK\r\n")
            raw.command("PING")
            raw.expect(b"+PONG\r\n")
        with Raw(locked.port) as raw:
            raw.command("QUIT")
            raw.expect(b"$2\r\nOK\r\n")
        for protocol in (2, 3):  # AUTH (RESP2) and HELLO 3 AUTH default ... (RESP3)
            good = client(locked, protocol=protocol, password="s3cret")
            assert good.ping() is True
            good.close()
            # No retries: redis-py would otherwise reconnect with back-off for seconds.
            wrong = client(locked, protocol=protocol, password="nope", retry=Retry(NoBackoff(), 0))
            with pytest.raises(redis.AuthenticationError):
                wrong.ping()


def test_monitor_sees_other_clients(server: ServerThread) -> None:  # A13
    with Raw(server.port) as monitor, Raw(server.port) as other:
        monitor.command("MONITOR", "x")
        monitor.expect(b"-ERR command 'monitor' does not accept any extra arguments\r\n")
        monitor.command("MONITOR")
        monitor.expect(b"+OK\r\n")
        other_id = f"127.0.0.1:{other.sock.getsockname()[1]}"
        other.command("Ping", 'a"b')
        other.expect(b"+PONG\r\n")
        line = monitor.read_line().decode()
        assert re.fullmatch(rf'\+\d+\.\d{{6}} \[0 {re.escape(other_id)}\] "Ping" "a"b"\r\n', line)
        # Keyed by connection: a later SETNAME shows the new id.
        other.command("CLIENT", "SETNAME", "mon:renamed")
        other.expect(b"$2\r\nOK\r\n")
        assert other_id in monitor.read_line().decode()
        other.command("PING")
        other.expect(b"+PONG\r\n")
        assert '[0 mon:renamed] "PING"' in monitor.read_line().decode()
        # The monitor itself can still send commands.
        monitor.command("PING")
        lines = [monitor.read_line(), monitor.read_line()]
        assert b"+PONG\r\n" in lines
        lines.remove(b"+PONG\r\n")
        assert lines[0].endswith(b'"PING"\r\n')  # its own command is published too


def test_connection_counters(engine_name: str, gateway_config: GatewayConfig) -> None:
    # A server of its own: other tests' connections would move the gauge meanwhile.
    with running(gateway_config(engine_name)) as server:
        _check_connection_counters(server)


def _check_connection_counters(server: ServerThread) -> None:
    c = client(server, protocol=2)
    before = int(c.hgetall("stats")[b"server.connections.current"])
    extra = Raw(server.port)
    extra.command("PING")
    extra.expect(b"+PONG\r\n")
    stats = c.hgetall("stats")
    assert int(stats[b"server.connections.current"]) == before + 1
    extra.close()

    def back() -> bool:
        return int(c.hgetall("stats")[b"server.connections.current"]) == before

    wait_until(back, 5, "the connection gauge to drop")
    assert c.delete("stats") == 1
    # DEL stats zeroes counters, not the gauge.
    stats = c.hgetall("stats")
    assert int(stats[b"server.connections.current"]) == before
    c.close()
