"""BLMPOP, the batch consume command (docs/gateway.md), over real sockets against a
gateway on each real engine: Redis 7's syntax and texts, the reply shape, order, acks in
between pipelined batches, and at least once when a client goes away mid-pipeline."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from backends.base import Record, RecordBatch
from gateway.commands.consume import batch_reply, blpop_reply, record_reply
from gateway.resp import encode
from gateway.runner import ServerThread
from tests.support.fixtures import GatewayConfig
from tests.support.gateway import Raw, client, running
from tests.support.waiting import wait_until


def named(server: ServerThread, group: str, name: str) -> Raw:
    raw = Raw(server.port, timeout=20)
    raw.command("CLIENT", "SETNAME", f"{group}:{name}")
    assert raw.read_reply() == b"OK"
    return raw


def produce(server: ServerThread, topic: str, values: list[bytes]) -> None:
    with client(server) as producer:
        assert producer.execute_command("RPUSHX", f"topics:{topic}", *values) == len(values)
        assert producer.execute_command("DUMP", "10000") == 0


def values_of(reply: Any, key: bytes) -> list[bytes]:
    """The values of a BLMPOP reply, checking its shape: [key, [record, ...]]."""
    assert isinstance(reply, list) and len(reply) == 2, reply
    assert reply[0] == key
    out = []
    for record in reply[1]:
        assert record[0::2] == [b"topic", b"partition", b"offset", b"value"], record
        out.append(record[7])
    return out


def first_batch(raw: Raw, key: str, count: int) -> Any:
    """BLMPOP until a batch comes (the first calls may time out during the group join)."""
    for _ in range(10):
        raw.command("BLMPOP", "2", "1", key, "LEFT", "COUNT", str(count))
        reply = raw.read_reply()
        if reply is not None:
            return reply
    raise AssertionError(f"no batch from {key} after 10 BLMPOPs")


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["0", "1", "topics:t"], "ERR wrong number of arguments for 'blmpop' command"),
        (["x", "1", "topics:t", "LEFT"], "ERR timeout is not a float or out of range"),
        (["-1", "1", "topics:t", "LEFT"], "ERR timeout is negative"),
        (["1", "0", "topics:t", "LEFT"], "ERR numkeys should be greater than 0"),
        (["1", "x", "topics:t", "LEFT"], "ERR numkeys should be greater than 0"),
        (["1", "3", "topics:t", "LEFT"], "ERR syntax error"),
        (["1", "1", "topics:t", "UP"], "ERR syntax error"),
        (["1", "1", "topics:t", "LEFT", "COUNT"], "ERR syntax error"),
        (["1", "1", "topics:t", "LEFT", "NUMBER", "2"], "ERR syntax error"),
        (["1", "1", "topics:t", "LEFT", "COUNT", "0"], "ERR count should be greater than 0"),
        (["1", "1", "topics:t", "RIGHT"], "CONS BLMPOP consumes from the LEFT only"),
        (["1", "1", "foo", "LEFT"], "CONS Cannot parse topics from `foo`"),
        (["1", "1", "topics:t", "LEFT"], "CONS Connection not ready. Identify yourself"),
    ],
)
def test_blmpop_refuses_what_redis_refuses_with_its_texts(
    server: ServerThread, args: list[str], error: str
) -> None:
    with Raw(server.port) as raw:
        raw.command("BLMPOP", *args)
        kind, text = raw.read_reply()
        assert kind == "-" and text.startswith(error), text


@pytest.mark.parametrize("protocol", [2, 3])
def test_blmpop_hands_out_batches_in_order_then_times_out(
    server: ServerThread, new_topic: Callable[[int], str], protocol: int
) -> None:
    topic = new_topic(1)
    values = [b"v%d" % i for i in range(25)]
    produce(server, topic, values)
    key = f'topics:{topic}:{{"auto.offset.reset":"earliest"}}'
    c = client(server, protocol=protocol, client_name=f"g{secrets.token_hex(4)}:redis-py")
    got: list[bytes] = []
    for _ in range(20):
        if len(got) == len(values):
            break
        reply = c.blmpop(2, 1, key, direction="LEFT", count=10)
        if reply is not None:
            batch = values_of(reply, key.encode())
            assert 1 <= len(batch) <= 10, f"{len(batch)} records for COUNT 10"
            got += batch
    assert got == values, "every record once, in offset order"
    assert c.blmpop(0.2, 1, key, direction="LEFT", count=10) is None, "nothing more"
    # BLPOP on the same connection goes on from there, on the same consumer.
    produce(server, topic, [b"after"])
    record = c.blpop([key], 5)
    assert record is not None and record[-1] == b"after"
    c.close()


def test_pipelined_blmpops_with_acks_between_hand_out_each_record_once(
    server: ServerThread, new_topic: Callable[[int], str]
) -> None:
    topic = new_topic(1)
    values = [b"p%d" % i for i in range(60)]
    produce(server, topic, values)
    key = f"topics:{topic}"
    group = f"g{secrets.token_hex(4)}"
    with named(server, group, "piped") as raw:
        got = values_of(first_batch(raw, key, 5), key.encode())
        # Several batches in one write, each ack naming the last offset received before.
        batch = f"BLMPOP 5 1 {key} LEFT COUNT 3\r\n"
        raw.send((f"RPUSH acks {topic}:0:{len(got) - 1}\r\n" + batch * 4).encode())
        assert raw.read_reply() == 1
        for _ in range(4):
            got += values_of(raw.read_reply(), key.encode())
        # Then an ack and a batch per write, until every record came.
        for _ in range(60):
            if len(got) == len(values):
                break
            ack = f"RPUSH acks {topic}:0:{len(got) - 1}\r\n"
            raw.send((ack + f"BLMPOP 5 1 {key} LEFT COUNT 7\r\n").encode())
            assert raw.read_reply() == 1, "the ack between two batches"
            got += values_of(raw.read_reply(), key.encode())
        assert got == values, "each record once, in offset order"
        raw.command("BLMPOP", "0.2", "1", key, "LEFT", "COUNT", "3")
        assert raw.read_reply() is None


def test_a_client_gone_mid_pipeline_gets_its_unacked_records_again(
    server: ServerThread, new_topic: Callable[[int], str]
) -> None:
    """Batches handed out and not acked when the client goes away come to the group's next
    member, from the last ack on; nothing acked comes again."""
    topic = new_topic(1)
    values = [b"m%d" % i for i in range(40)]
    produce(server, topic, values)
    key = f"topics:{topic}"
    group = f"g{secrets.token_hex(4)}"
    raw = named(server, group, "first")
    got = values_of(first_batch(raw, key, 4), key.encode())
    acked = len(got)
    # Ack what came, and pipeline more batches than the client will read.
    command = f"BLMPOP 5 1 {key} LEFT COUNT 4\r\n"
    raw.send(f"RPUSH acks {topic}:0:{acked - 1}\r\n".encode() + command.encode() * 6)
    assert raw.read_reply() == 1
    got += values_of(raw.read_reply(), key.encode())  # handed out, never acked
    raw.close()
    wait_until(lambda: f"{group}:first" not in server.server.ctx.clients, 10, "the session to end")
    with named(server, group, "second") as again:
        rest: list[bytes] = []
        while len(rest) < len(values) - acked:
            rest += values_of(first_batch(again, key, 100), key.encode())
        assert rest == values[acked:], "from the last ack on, in order, nothing lost"
        again.command("BLMPOP", "0.2", "1", key, "LEFT", "COUNT", "3")
        assert again.read_reply() is None, "nothing acked came again"


def test_blpops_and_blmpops_interleaved_with_acks_keep_order_and_at_least_once(
    server: ServerThread, new_topic: Callable[[int], str]
) -> None:
    """BLPOP takes one record and BLMPOP a slice from the same fetched batch (the Kafka
    engine keeps a fetch as one list and hands out slices of it): pipelined together,
    with acks between them, they hand out every record once, in order; a member that
    takes over after a close starts right after the last ack."""
    topic = new_topic(1)
    values = [b"i%d" % i for i in range(45)]
    produce(server, topic, values)
    key = f"topics:{topic}"
    group = f"g{secrets.token_hex(4)}"
    raw = named(server, group, "first")
    first = values_of(first_batch(raw, key, 1), key.encode())
    got: list[tuple[int, bytes]] = []  # (offset, value)
    offset = None
    for _ in range(30):
        if len(got) + len(first) >= 30:
            break
        ack = b"" if offset is None else f"RPUSH acks {topic}:0:{offset}\r\n".encode()
        blpop = f"BLPOP {key} 5\r\n".encode()
        blmpop = f"BLMPOP 5 1 {key} LEFT COUNT 3\r\n".encode()
        raw.send(ack + blpop + blmpop + blpop + blmpop.replace(b"COUNT 3", b"COUNT 2"))
        if ack:
            assert raw.read_reply() == 1, "the ack between two pipelines"
        for _ in range(4):
            reply = raw.read_reply()
            assert reply is not None, f"nothing after {len(got)} records"
            records = reply[1] if reply[0] == key.encode() else [reply]
            for record in records:
                assert record[0::2] == [b"topic", b"partition", b"offset", b"value"], record
                got.append((record[5], record[7]))
        offset = got[-1][0]
    taken = first + [value for _, value in got]
    assert taken == values[: len(taken)], "each record once, in order"
    offsets = [o for o, _ in got]
    assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), "no gap, no repeat"
    # Ack up to the middle of the last pipeline's records, then leave.
    acked = len(taken) - 3
    raw.send(f"RPUSH acks {topic}:0:{got[acked - len(first) - 1][0]}\r\n".encode())
    assert raw.read_reply() == 1
    raw.close()
    wait_until(lambda: f"{group}:first" not in server.server.ctx.clients, 10, "the session to end")
    with named(server, group, "second") as again:
        rest: list[bytes] = []
        while len(rest) < len(values) - acked:
            rest += values_of(first_batch(again, key, 100), key.encode())
        assert rest == values[acked:], "from the last ack on, in order, nothing lost"


@pytest.fixture(scope="module")
def small_batch_server(engine_name: str, gateway_config: GatewayConfig) -> Iterator[ServerThread]:
    with running(gateway_config(engine_name, consume_batch=10)) as gateway:
        yield gateway


def test_blpop_without_acks_goes_on_past_consume_batch(
    small_batch_server: ServerThread, new_topic: Callable[[int], str]
) -> None:
    """Acks only commit offsets: a member that joined before the records and never acks
    gets every record, in order, not only the first gateway.consume_batch (10 here)."""
    server = small_batch_server
    topic = new_topic(1)
    key = f'topics:{topic}:{{"auto.offset.reset":"earliest"}}'
    c = client(server, client_name=f"g{secrets.token_hex(4)}:live")
    assert c.blpop([key], 1) is None, "joins the group before any record"
    values = [b"n%d" % i for i in range(60)]
    got: list[bytes] = []
    producer = client(server)

    def push(first: int, end: int) -> None:
        # No DUMP: the member takes records while later ones are still arriving.
        batch = values[first:end]
        assert producer.execute_command("RPUSHX", f"topics:{topic}", *batch) == len(batch)

    def take(count: int) -> None:
        for _ in range(count):
            record = c.blpop([key], 10)
            assert record is not None, f"BLPOP waited 10 s for nothing after {len(got)} records"
            value = record[-1]
            assert isinstance(value, bytes), record
            got.append(value)

    # The first record taken, the next batch is produced while the gateway holds its
    # share of the first (consume_batch), then the rest is taken without acks.
    push(0, 20)
    take(1)
    push(20, 40)
    take(39)
    push(40, 60)
    take(20)
    assert got == values, "every record once, in offset order"
    producer.close()
    c.close()


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize(
    "records",
    [
        # Several topics, a null value, an empty one, a key: the record-by-record path.
        [
            Record("orders", 3, 41, None, b"x" * 100),
            Record("orders", 3, 42, b"k", None),
            Record("caf\u00e9", 0, 0, None, b""),
        ],
        # Several topics, no null: the columns path with the topic a field of each record.
        [
            Record("a", 0, 7, None, b"1"),
            Record("b.b", 1, 2**40, None, b"\r\n%d%b"),
            Record("a", 0, 8, None, b""),
        ],
        # One topic, written into the format once: a `%` in its name must stay a `%`.
        [Record("100%_%d", p, o, None, b"v%d" % o, 5) for o in range(3) for p in range(2)],
    ],
    ids=["null-values", "topics", "one-topic"],
)
def test_a_batch_is_encoded_as_the_list_of_blpop_records_would_be(
    protocol: int, records: list[Record]
) -> None:
    """BLMPOP encodes its records in one pass: the bytes are those of the generic encoder
    for [key, [record, ...]], whichever path the batch takes."""
    key = b'topics:orders,caf\xc3\xa9:{"a":1}'
    expected = encode([key, [record_reply(record) for record in records]], protocol)
    assert encode(batch_reply(key, records, protocol), protocol) == expected
    # As an engine hands them out in columns (the Kafka engine), a slice of them too.
    assert encode(batch_reply(key, RecordBatch.of(records), protocol), protocol) == expected
    columns = RecordBatch.of(records + records)[len(records) :]
    assert encode(batch_reply(key, columns, protocol), protocol) == expected
    assert encode(batch_reply(key, [], protocol), protocol) == encode([key, []], protocol)


@pytest.mark.parametrize("protocol", [2, 3])
def test_a_blpop_record_is_encoded_as_its_list_would_be(protocol: int) -> None:
    """BLPOP formats its record at once: the bytes of the generic encoder for the list,
    whatever the topic's name, and with a null value too."""
    for record in (
        Record("100%_%d café", 3, 2**40, None, b"v\r\n%d", 5),
        Record("t", 0, 0, b"key", b"", None),
        Record("t", 1, 7, None, None, None),
    ):
        assert encode(blpop_reply(record), protocol) == encode(record_reply(record), protocol)
