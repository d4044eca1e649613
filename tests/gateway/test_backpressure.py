"""Backpressure (docs/gateway.md, `produce_block_timeout`): an RPUSHX whose records do not
fit the engine's queue holds its connection until there is room, as Kafka's producers
block up to max.block.ms, and answers `PROD Local: Queue full` only after the bound.
Provoked with a tiny queue (Kafka: queue.buffering.max.messages on the Tansu broker;
Dafka: dafka.queue_max_messages), and with a log that takes nothing (Kafka: no broker;
Dafka: its only store stopped with SIGSTOP)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backends.dafka.embedded import EmbeddedNetwork, store_name
from backends.ports import free_port
from gateway.config import Config, from_dict
from gateway.runner import ServerThread
from tests.support.engines import GATEWAY_ENGINES
from tests.support.fixtures import EngineFactories
from tests.support.gateway import Raw, running
from tests.support.kafka import kafka_document

QUEUE = 5  # records the engine may hold not yet durable


def tiny_queue(engines: EngineFactories, engine: str, **gateway: Any) -> Config:
    factory = engines(engine)
    document = factory.document()
    if engine == "kafka":
        document["producer"] = {
            **document.get("producer", {}),
            "queue.buffering.max.messages": QUEUE,
        }
    else:
        document["dafka"] = {**document["dafka"], "queue_max_messages": QUEUE}
    section = {"engine": engine, "host": "127.0.0.1", "port": 0, **gateway}
    return from_dict({**document, "gateway": section})


def rpushx(topic: str, *values: bytes) -> bytes:
    parts = [b"RPUSHX", f"topics:{topic}".encode(), *values]
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


def pipeline(topic: str) -> tuple[bytes, list[bytes], list[int]]:
    """200 one-value RPUSHX then 5 of 20 values: 300 records, 40 times the queue."""
    values = [b"v%03d" % n for n in range(300)]
    data = b"".join(rpushx(topic, value) for value in values[:200])
    data += b"".join(rpushx(topic, *values[200 + 20 * n : 220 + 20 * n]) for n in range(5))
    return data, values, [1] * 200 + [20] * 5


def read_all(raw: Raw, topic: str, count: int) -> list[bytes]:
    """Join a group on `topic` and read `count` records (fewer if they do not come
    within 30 s): their values, in the order read."""
    raw.command("CLIENT", "SETNAME", f"{topic}:reader")
    assert raw.read_reply() == b"OK"
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < count and time.monotonic() < deadline:
        raw.command("BLMPOP", "1", "1", f"topics:{topic}", "LEFT", "COUNT", "500")
        reply = raw.read_reply()
        if reply is not None:
            got += [record[7] for record in reply[1]]
    return got


@pytest.mark.parametrize("engine", GATEWAY_ENGINES)
def test_records_beyond_the_queue_wait_for_room_and_all_arrive_in_order(
    engines: EngineFactories, engine: str
) -> None:
    topic = engines(engine).new_topic(1)
    data, values, counts = pipeline(topic)
    config = tiny_queue(engines, engine, produce_block_timeout=30)
    with running(config) as gateway, Raw(gateway.port, timeout=60) as raw:
        raw.send(data)
        replies = [raw.read_reply() for _ in counts]
        assert replies == counts, f"refused or lost: {[r for r in replies if r not in (1, 20)]}"
        raw.command("DUMP", "30000")
        assert raw.read_reply() == 0
        assert read_all(raw, topic, len(values)) == values, "every record once, in order"


@pytest.mark.parametrize("engine", GATEWAY_ENGINES)
def test_without_a_bound_a_full_queue_answers_queue_full_at_once(
    engines: EngineFactories, engine: str
) -> None:
    """The same pipeline with produce_block_timeout 0 (Rafka's behaviour): the queue
    really is too small for it."""
    topic = engines(engine).new_topic(1)
    data, _, counts = pipeline(topic)
    config = tiny_queue(engines, engine, produce_block_timeout=0)
    with running(config) as gateway, Raw(gateway.port, timeout=60) as raw:
        raw.send(data)
        replies = [raw.read_reply() for _ in counts]
        assert ("-", "PROD Local: Queue full") in replies


@pytest.mark.parametrize("topics", [1, 3])
@pytest.mark.parametrize("engine", GATEWAY_ENGINES)
def test_a_refusal_inside_a_batch_of_rpushx_answers_each_as_if_alone(
    engines: EngineFactories, engine: str, topics: int
) -> None:
    """300 one-value RPUSHX, pipelined, without a bound: to one key, or two in a row to
    each of 3 topics in turn. The gateway produces such a batch with one engine call
    (runs of commands to one key, the runs of every key), which the full queue refuses
    part of. Each command must still be answered for itself: the records stored in each
    topic are exactly those of its commands answered 1, in order, and every other
    command is answered Queue full."""
    names = [engines(engine).new_topic(1) for _ in range(topics)]
    values = [b"v%03d" % n for n in range(300)]
    topic_of = [names[n // 2 % topics] for n in range(len(values))]
    config = tiny_queue(engines, engine, produce_block_timeout=0)
    with running(config) as gateway, Raw(gateway.port, timeout=60) as raw:
        raw.send(b"".join(map(rpushx, topic_of, values)))
        replies = [raw.read_reply() for _ in values]
        refused = ("-", "PROD Local: Queue full")
        assert set(replies) <= {1, refused}, f"other answers: {set(replies) - {1, refused}}"
        assert refused in replies, "the queue was never full: nothing was tested"
        raw.command("DUMP", "30000")
        assert raw.read_reply() == 0
        for topic in names:
            accepted = [
                value
                for value, reply, to in zip(values, replies, topic_of, strict=True)
                if reply == 1 and to == topic
            ]
            with Raw(gateway.port, timeout=60) as reader:
                got = read_all(reader, topic, len(accepted))
                reader.command("BLMPOP", "1", "1", f"topics:{topic}", "LEFT", "COUNT", "500")
                assert reader.read_reply() is None, "records of refused commands were stored"
            assert got == accepted, "the records of the commands answered 1, in order"


@pytest.fixture
def stalled_dafka(tmp_path: Path) -> Iterator[tuple[Config, EmbeddedNetwork]]:
    network = EmbeddedNetwork(tmp_path / "dafka", stores=1)
    network.start()
    tower = network.config
    document = {
        "dafka": {
            "tower_sub_address": tower.get("beacon/sub_address"),
            "tower_pub_address": tower.get("beacon/pub_address"),
            "queue_max_messages": 1,
            "settings": {"beacon/address": "127.0.0.1", "beacon/interval": "200"},
        },
        "gateway": {"engine": "dafka", "host": "127.0.0.1", "port": 0},
    }
    try:
        yield _bounded(document), network
    finally:
        os.kill(network.pids()[store_name(0)], signal.SIGCONT)
        network.stop()


def _bounded(document: dict[str, Any]) -> Config:
    document["gateway"]["produce_block_timeout"] = 0.5
    return from_dict(document)


def kafka_without_broker() -> Config:
    document: dict[str, Any] = kafka_document(f"127.0.0.1:{free_port()}")
    document["producer"] = {**document["producer"], "queue.buffering.max.messages": 1}
    document["general"] = {**document["general"], "log_level": 0}
    document["gateway"] = {"engine": "kafka", "host": "127.0.0.1", "port": 0}
    return _bounded(document)


# Where the record that finds no room goes: the same partition as the one that fits, or
# another topic's (the queue bounds every partition together, as librdkafka's does).
SECOND = ("same topic", "another topic")


def assert_refused_after_the_bound(gateway: ServerThread, topic: str, second: str) -> None:
    """`topic` is `<topic>:<key>`: one partition; the queue holds one record."""
    with Raw(gateway.port, timeout=30) as raw:
        raw.send(rpushx(topic, b"fits"))
        assert raw.read_reply() == 1
        started = time.monotonic()
        then = topic if second == "same topic" else f"other-{topic}"
        # The PING behind the blocked RPUSHX is not read before the RPUSHX is answered.
        raw.send(rpushx(then, b"no room") + b"PING\r\n")
        assert raw.read_reply() == ("-", "PROD Local: Queue full")
        elapsed = time.monotonic() - started
        assert raw.read_reply() == "PONG"
        assert 0.5 <= elapsed < 5, f"answered after {elapsed:.2f}s, the bound is 0.5s"


@pytest.mark.parametrize("second", SECOND)
def test_kafka_answers_queue_full_after_the_bound_when_nothing_drains(second: str) -> None:
    with running(kafka_without_broker()) as gateway:
        assert_refused_after_the_bound(gateway, "anything:key", second)


@pytest.mark.parametrize("second", SECOND)
def test_dafka_answers_queue_full_after_the_bound_when_no_store_acks(
    stalled_dafka: tuple[Config, EmbeddedNetwork], second: str
) -> None:
    config, network = stalled_dafka
    with running(config) as gateway:
        with Raw(gateway.port, timeout=30) as raw:  # the writer exists before the stop
            raw.send(rpushx("stalled:key", b"before"))
            assert raw.read_reply() == 1
            raw.command("DUMP", "10000")
            assert raw.read_reply() == 0
        os.kill(network.pids()[store_name(0)], signal.SIGSTOP)
        assert_refused_after_the_bound(gateway, "stalled:key", second)
