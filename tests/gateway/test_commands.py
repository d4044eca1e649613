"""Every command's replies and error texts (spec §2, §3, §11: G2-G13, A6-A12), driven
over real sockets against a gateway on each real engine (Dafka on a network of its own,
Kafka on the Tansu fixture); tests of one engine's own behaviour say so."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from backends.ports import free_port
from gateway.config import from_dict
from gateway.runner import ServerThread
from tests.support.fixtures import GatewayConfig
from tests.support.gateway import Raw, client, running
from tests.support.resp import command as resp_command
from tests.support.tansu import TansuBroker
from tests.support.waiting import wait_until

# Short default so that "non-numeric timeout -> default" is quick to observe.
DEFAULT_TIMEOUT = 1.0


@pytest.fixture(scope="module")
def server(engine_name: str, gateway_config: GatewayConfig) -> Iterator[ServerThread]:
    config = gateway_config(engine_name, blpop_default_timeout=DEFAULT_TIMEOUT)
    with running(config) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def topic(new_topic: Callable[[int], str]) -> str:
    return new_topic(4)


def group() -> str:
    return f"g{secrets.token_hex(4)}"


def named(server: ServerThread, name: str) -> Raw:
    raw = Raw(server.port, timeout=20)
    raw.command("CLIENT", "SETNAME", name)
    raw.expect(b"$2\r\nOK\r\n")
    return raw


def consume(raw: Raw, key: str, timeout: str, attempts: int = 10) -> bytes:
    """BLPOP until a record arrives (the first ones may time out during the group join)."""
    for _ in range(attempts):
        raw.command("BLPOP", key, timeout)
        head = raw.read_line()
        if head == b"*8\r\n":
            return head + b"".join(raw.read_line() for _ in range(14))
        assert head == b"*-1\r\n", f"unexpected {head!r}"
    raise AssertionError(f"no record from {key} after {attempts} BLPOPs")


# --- BLPOP ---------------------------------------------------------------------------------


def test_blpop_needs_topics_key_then_setname(server: ServerThread) -> None:  # A6
    with Raw(server.port) as raw:
        raw.command("BLPOP", "foo", "1")
        raw.expect(b"-CONS Cannot parse topics from `foo`\r\n")
        raw.command("BLPOP")
        raw.expect(b"-CONS Cannot parse topics from ``\r\n")
        raw.command("BLPOP", "topics:foo", "1")
        raw.expect(
            b"-CONS Connection not ready. Identify yourself using `CLIENT SETNAME` first\r\n"
        )
        raw.command("BLPOP", 'topics:foo:{"a":', "1")
        line = raw.read_line()
        assert line.startswith(b"-CONS Error parsing configuration from '{\"a\":'; ")
        raw.command("BLPOP", "topics:foo", "-1")
        raw.expect(b"-ERR timeout is negative\r\n")


def test_exclusive_consumer_and_timeouts(server: ServerThread, topic: str) -> None:  # G3, A7
    name = f"{group()}:baz"
    with named(server, name) as raw:
        started = time.monotonic()
        raw.command("BLPOP", f"topics:{topic}", "0.5")
        raw.expect(b"*-1\r\n")  # nothing produced to this topic
        assert 0.4 < time.monotonic() - started < 5
        raw.command("BLPOP", f"topics:{topic},other", "0.2")
        raw.expect(
            f"-CONS Client '{name}' has Consumer '{name}|{topic}' registered "
            f"(new consID: '{name}|{topic},other')\r\n".encode()
        )
        # Not a number: the configured default (Rafka's 5 s, 1 s here).
        started = time.monotonic()
        raw.command("BLPOP", f"topics:{topic}", "abc")
        raw.expect(b"*-1\r\n")
        assert DEFAULT_TIMEOUT * 0.8 < time.monotonic() - started < DEFAULT_TIMEOUT + 3
        # Pipelined commands behind a waiting BLPOP wait their turn.
        raw.send(f"BLPOP topics:{topic} 0.2\r\nPING\r\n".encode())
        raw.expect(b"*-1\r\n+PONG\r\n")
        # RESP3 timeout reply: the null.
        raw.command("HELLO", "3")
        assert raw.read_reply()[b"proto"] == 3
        raw.command("BLPOP", f"topics:{topic}", "0.1")
        raw.expect(b"_\r\n")


def test_a_repeated_key_is_still_checked_against_the_consumer(
    server: ServerThread, topic: str
) -> None:
    """The session's last BLPOP key is not parsed again: another key after it, one naming
    many topics, still gets the exclusive-consumer check, and the first key its consumer."""
    name = f"{group()}:baz"
    many = ",".join([topic, *(f"absent-{i}" for i in range(300))])
    with named(server, name) as raw:
        for key in (topic, topic, topic, many, many, topic):
            raw.command("BLPOP", f"topics:{key}", "0.1")
            if key == topic:
                raw.expect(b"*-1\r\n")
            else:
                raw.expect(
                    f"-CONS Client '{name}' has Consumer '{name}|{topic}' registered "
                    f"(new consID: '{name}|{many}')\r\n".encode()
                )


def test_consumer_config_applies_at_creation_only(
    server: ServerThread, topic: str, engine_name: str
) -> None:  # G4
    with named(server, f"{group()}:bar") as raw:
        raw.command("BLPOP", f'topics:{topic}:{{"auto.offset.reset": "latest"}}', "0.1")
        raw.expect(b"*-1\r\n")
        raw.command("BLPOP", f'topics:{topic}:{{"auto.offset.reset": "malformed"}}', "0.1")
        raw.expect(b"*-1\r\n")
    refused = ['{"a":{"b":1}}', '{"auto.offset.reset":"sideways"}']
    if engine_name == "kafka":  # librdkafka checks every property; Dafka uses only this one
        refused += ['{"invalid_option":"1"}', '{"session.timeout.ms":true}']
    for settings in refused:
        name = f"{group()}:bar2"
        with named(server, name) as raw:
            raw.command("BLPOP", f"topics:{topic}:{settings}", "0.1")
            expected = f"-CONS Failed to register Consumer '{name}|{topic}' for Client '{name}'"
            raw.expect(expected.encode() + b"\r\n")
            # Nothing was registered: a valid BLPOP may follow on the same connection.
            raw.command("BLPOP", f"topics:{topic}", "0.1")
            raw.expect(b"*-1\r\n")
    with named(server, ":nogroup") as raw:
        raw.command("BLPOP", f"topics:{topic}", "0.1")
        expected = f"-CONS Failed to register Consumer ':nogroup|{topic}' for Client ':nogroup'"
        raw.expect(expected.encode() + b"\r\n")


def test_blpop_timeout_zero_waits_for_a_record(
    server: ServerThread, new_topic: Callable[[int], str]
) -> None:
    fresh = new_topic(1)
    with named(server, f"{group()}:forever") as raw, client(server) as producer:
        raw.command("BLPOP", f"topics:{fresh}", "0")
        wait_until(lambda: server.server.waiting_commands == 1, 10, "the BLPOP to wait")
        raw.sock.setblocking(False)
        with pytest.raises(BlockingIOError):
            raw.sock.recv(1)
        raw.sock.setblocking(True)
        assert producer.rpushx(f"topics:{fresh}", "late") == 1
        reply = b"".join(raw.read_line() for _ in range(15))
        assert reply.endswith(b"$5\r\nvalue\r\n$4\r\nlate\r\n")


def test_disconnect_during_blpop_frees_id_and_consumer(server: ServerThread, topic: str) -> None:
    name = f"{group()}:gone"
    raw = named(server, name)
    raw.command("BLPOP", f"topics:{topic}", "0")
    wait_until(lambda: server.server.waiting_commands == 1, 10, "the BLPOP to wait")
    raw.close()
    # The id is free again as soon as the server noticed the disconnect.
    wait_until(lambda: name not in server.server.ctx.clients, 10, "the id to be released")
    with named(server, name) as again:
        again.command("BLPOP", f"topics:{topic}", "0.1")
        again.expect(b"*-1\r\n")


# --- RPUSH acks ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["acks", "sometopic:1:-5"], "CONS offset cannot be negative, got -4"),
        (["acks", "sometopic:1:foo"], 'CONS strconv.ParseInt: parsing "foo": invalid syntax'),
        (["acks", "sometopic:10"], "CONS Cannot parse ack: 'sometopic:10'"),
        (["acks", "sometopic"], "CONS Cannot parse ack: 'sometopic'"),
        (["acks"], "CONS Cannot parse ack: ''"),
        (["wrongkey", "sometopic:1:5"], "CONS You can only RPUSH to the 'acks' key"),
        (["acks", "t:x1:5"], 'CONS strconv.ParseInt: parsing "x1": invalid syntax'),
        (
            ["acks", "t:2147483648:5"],
            'CONS strconv.ParseInt: parsing "2147483648": value out of range',
        ),
        (["acks", "t:1:08"], 'CONS strconv.ParseInt: parsing "08": invalid syntax'),
        (["acks", "t:1:5", "t:1:bad"], 'CONS strconv.ParseInt: parsing "bad": invalid syntax'),
        (
            ["acks", "t:1:9223372036854775807"],
            "CONS offset cannot be negative, got -9223372036854775808",
        ),
    ],
)
def test_ack_errors_with_a_consumer(
    server: ServerThread, topic: str, args: list[str], error: str
) -> None:  # G5
    with named(server, f"{group()}:acker") as raw:
        raw.command("BLPOP", f"topics:{topic}", "0.01")
        raw.expect(b"*-1\r\n")
        raw.command("RPUSH", *args)
        raw.expect(f"-{error}\r\n".encode())


def test_ack_without_consumer(server: ServerThread) -> None:  # A8
    with Raw(server.port) as raw:
        peer = f"127.0.0.1:{raw.sock.getsockname()[1]}"
        raw.command("RPUSH", "acks", "t:0:1")
        raw.expect(f"-CONS No consumer registered for Client {peer}\r\n".encode())
        raw.command("rpush", "ACKS", "t:zz:1")  # parse errors come first
        raw.expect(b'-CONS strconv.ParseInt: parsing "zz": invalid syntax\r\n')


# --- RPUSHX / DUMP -------------------------------------------------------------------------


def test_rpushx_errors(server: ServerThread) -> None:  # A9, G6
    with Raw(server.port) as raw:
        raw.command("RPUSHX", "topics:a")
        raw.expect(b"-PROD RPUSHX accepts 2 arguments, got 1\r\n")
        raw.command("RPUSHX")
        raw.expect(b"-PROD RPUSHX accepts 2 arguments, got 0\r\n")
        for key in ("topics:a:b:c", "invalid-arg"):
            raw.command("RPUSHX", key, "a msg")
            raw.expect(
                b"-PROD First argument must be in the form of 'topics:<topic>' or "
                b"'topics:<topic>:<key>'\r\n"
            )
        # A topic that is not UTF-8: read as text with its bad bytes replaced, topics:a\xff
        # and topics:a\xfe were one topic (Kafka refuses such names).
        for bad in (b"topics:a\xff", b"topics:a\xfe:k"):
            raw.command(b"RPUSHX", bad, b"a msg")
            raw.expect(b"-PROD Broker: Invalid topic\r\n")


def test_dump(server: ServerThread, topic: str) -> None:  # A10
    with Raw(server.port) as raw:
        raw.command("DUMP")
        raw.expect(b":0\r\n")  # no producer yet: 0 before any argument check
        raw.command("RPUSHX", f"topics:{topic}", "m")
        raw.expect(b":1\r\n")
        raw.command("DUMP", "5000")
        raw.expect(b":0\r\n")
        raw.command("DUMP", "abc")
        raw.expect(b"-PROD NaN\r\n")
        raw.command("DUMP")
        raw.expect(b"-PROD DUMP accepts 1 argument, got 0\r\n")
        raw.command("DUMP", "1", "2")
        raw.expect(b"-PROD DUMP accepts 1 argument, got 2\r\n")


def test_rpushx_prefix_not_checked_and_several_values(
    server: ServerThread, new_topic: Callable[[int], str]
) -> None:  # G7, multi-value RPUSHX
    fresh = new_topic(1)
    with client(server) as producer:
        assert producer.rpushx(f"topic:{fresh}:bar", "a msg") == 1
        assert producer.execute_command("RPUSHX", f"x:{fresh}", "b", "c", "d") == 3
        assert producer.execute_command("DUMP", "5000") == 0
    with named(server, f"{group()}:multi") as raw:
        values = [consume(raw, f"topics:{fresh}", "1").split(b"\r\n")[-2] for _ in range(4)]
        assert values == [b"a msg", b"b", b"c", b"d"]
        # Acks: every one validated, then stored; the reply counts them.
        raw.command("RPUSH", "acks", f"{fresh}:0:0", f"{fresh}:0:0x3")
        raw.expect(b":2\r\n")


def test_rpushx_refused_value_keeps_the_values_before_it(
    gateway_config: GatewayConfig, tansu: TansuBroker
) -> None:  # multi-value RPUSHX, refused in the middle: Kafka's size limit
    fresh = tansu.create_topic(1)
    huge = "x" * 2_000_000  # over librdkafka's message.max.bytes: refused at once
    with running(gateway_config("kafka")) as server:
        with Raw(server.port, timeout=20) as raw:
            raw.command("RPUSHX", f"topics:{fresh}", "a", "b", huge, "c")
            raw.expect(b"-PROD Broker: Message size too large\r\n")
            raw.command("RPUSHX", f"topics:{fresh}", "end")
            raw.expect(b":1\r\n")
            raw.command("DUMP", "5000")
            raw.expect(b":0\r\n")  # "a", "b" and "end" delivered; nothing waits for "c"
        with named(server, f"{group()}:partial") as raw:
            values = [consume(raw, f"topics:{fresh}", "1").split(b"\r\n")[-2] for _ in range(3)]
            assert values == [b"a", b"b", b"end"]


def test_pipelined_rpushx_refused_in_a_run_answers_each_alone(
    gateway_config: GatewayConfig, tansu: TansuBroker
) -> None:  # RPUSHX to one key, pipelined, are produced together: one refused in the middle
    fresh = tansu.create_topic(1)
    key = f"topics:{fresh}".encode()
    huge = b"x" * 2_000_000  # over librdkafka's message.max.bytes: refused at once
    sent = [[b"a"], [b"b"], [huge], [b"c"], [b"d", b"e"], [b"f"]]
    with running(gateway_config("kafka")) as server:
        with Raw(server.port, timeout=20) as raw:
            raw.send(b"".join(resp_command(b"RPUSHX", key, *values) for values in sent))
            replies = [raw.read_reply() for _ in sent]
            assert replies == [1, 1, ("-", "PROD Broker: Message size too large"), 1, 2, 1]
            raw.command("DUMP", "5000")
            raw.expect(b":0\r\n")
        with named(server, f"{group()}:run") as raw:
            values = [consume(raw, f"topics:{fresh}", "1").split(b"\r\n")[-2] for _ in range(6)]
            assert values == [b"a", b"b", b"c", b"d", b"e", b"f"]


def test_concurrent_producers(server: ServerThread, topic: str) -> None:  # G9
    producers = [client(server) for _ in range(5)]
    assert [p.rpushx(f"topics:{topic}", "a msg") for p in producers] == [1] * 5
    for p in producers:
        p.close()


# --- HGETALL / DEL / KEYS ------------------------------------------------------------------


def test_stats_key_checks(server: ServerThread) -> None:  # A11, G10
    with Raw(server.port) as raw:
        raw.command("HGETALL", "foo")
        raw.expect(b"-ERR Expected key to be 'stats', got FOO\r\n")
        raw.command("DEL", "foo")
        raw.expect(b"-ERR Expected key to be 'stats', got FOO\r\n")
        raw.command("HGETALL")
        raw.expect(b"-ERR Expected key to be 'stats', got \r\n")
        raw.command("DEL", "STATS", "ignored")
        raw.expect(b":1\r\n")
    stats = client(server, protocol=2).hgetall("stats")
    assert int(stats[b"producer.delivery.errors"]) >= 0
    assert int(stats[b"producer.unflushed.messages"]) >= 0


def test_keys_lists_topics(server: ServerThread, topic: str) -> None:  # A12, G13
    with Raw(server.port) as raw:
        raw.command("KEYS", "*")
        raw.expect(b"-ERR Expected argument to be 'topics:', got *\r\n")
    names: Any = client(server).keys("topics:")
    assert f"topics:{topic}".encode() in names
    assert all(name.startswith(b"topics:") for name in names)


def test_keys_and_rpushx_failures_keep_rafkas_texts(tansu: TansuBroker) -> None:  # #19, #25, #26
    document = {
        "general": {"bootstrap.servers": tansu.bootstrap},
        "producer": {"foo": "bar"},
        "gateway": {"host": "127.0.0.1", "port": 0},
    }
    with running(from_dict(document)) as bad, Raw(bad.port) as raw:
        raw.command("KEYS", "topics:")
        raw.expect(b'-ERR Error spawning producer: No such configuration property: "foo"\r\n')
        raw.command("RPUSHX", "topics:x", "v")
        raw.expect(b'-PROD Error spawning producer: No such configuration property: "foo"\r\n')
        # Pipelined (one run of RPUSHX): each answered as alone, the key's form first.
        raw.send(
            b"*3\r\n$6\r\nRPUSHX\r\n$2\r\nno\r\n$1\r\nv\r\n"
            b"*3\r\n$6\r\nRPUSHX\r\n$8\r\ntopics:x\r\n$1\r\nv\r\n"
        )
        raw.expect(
            b"-PROD First argument must be in the form of 'topics:<topic>' or "
            b"'topics:<topic>:<key>'\r\n"
        )
        raw.expect(b'-PROD Error spawning producer: No such configuration property: "foo"\r\n')
    nobody = {
        "general": {"bootstrap.servers": f"127.0.0.1:{free_port()}", "log_level": 0},
        "gateway": {"host": "127.0.0.1", "port": 0, "metadata_timeout": 0.2},
    }
    with running(from_dict(nobody)) as unreachable, Raw(unreachable.port) as raw:
        raw.command("KEYS", "topics:")
        assert raw.read_line().startswith(b"-ERR Error getting metadata: Local: ")


def test_redis_py_errors_surface_as_response_errors(server: ServerThread) -> None:
    c = client(server)
    with pytest.raises(redis.ResponseError, match=r"^Command not supported: GET$"):
        c.get("x")
    with pytest.raises(redis.ResponseError, match="CONS Connection not ready"):
        c.blpop(["topics:x"], 1)
    c.close()


def test_pipelined_blpops_with_acks_between_hand_out_each_record_once(
    server: ServerThread, new_topic: Callable[[int], str]
) -> None:
    """Records already fetched are answered in the same pass as the other pipelined
    commands (the BLPOP fast path): order, acks and at-most-once-per-member still hold."""
    fresh = new_topic(1)
    with client(server) as producer:
        values = [b"p%d" % i for i in range(30)]
        assert producer.execute_command("RPUSHX", f"topics:{fresh}", *values) == 30
        assert producer.execute_command("DUMP", "10000") == 0
    name = f"{group()}:piped"
    with named(server, name) as raw:
        first = consume(raw, f"topics:{fresh}", "10")  # joins, fetches ahead
        got = [first.split(b"\r\n")[-2]]
        pipeline = []
        for offset in range(1, 30):
            pipeline.append(f"BLPOP topics:{fresh} 10\r\n")
            pipeline.append(f"RPUSH acks {fresh}:0:{offset - 1}\r\n")
        raw.send("".join(pipeline).encode())
        for _ in range(29):
            assert raw.read_line() == b"*8\r\n"
            record = [raw.read_line() for _ in range(14)]
            got.append(record[-1][:-2])
            assert raw.read_line() == b":1\r\n", "the ack between two BLPOPs"
        assert got == values, "each record once, in offset order"
        raw.command("BLPOP", f"topics:{fresh}", "0.2")
        raw.expect(b"*-1\r\n")
