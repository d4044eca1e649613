"""What each consumer group's librdkafka consumer fetches ahead (backends/kafka/settings.py
CONSUMER_DEFAULTS): bounded by default, so that a gateway serving many groups does not
hold a copy of every backlog per group; the configuration and a client's settings still
win, and a smaller fetch answer (`fetch.max.bytes`) is one setting. On a real `rafka`
process and the Tansu broker."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka import Producer

from backends.kafka.settings import (
    CONSUMER_DEFAULTS,
    consumer_config,
    describe,
    parse_settings,
)
from backends.process import Child
from tests.support.connections import rss_bytes
from tests.support.kafka import kafka_document
from tests.support.rafka_process import start_rafka
from tests.support.tansu import TansuBroker
from tests.support.waiting import wait_until

GROUPS = 6
BACKLOG = 8_000  # records of VALUE_SIZE bytes: 16 MB, which librdkafka's defaults would
VALUE_SIZE = 2_000  # fetch whole into every group (up to 64 MiB a group)
READ = 500  # records each group reads before its memory is looked at
# Bytes of gateway memory one group may cost. Measured: 6.6 MiB with the defaults (the
# records in the gateway's buffer, librdkafka's queue and one fetch, its fixed cost),
# 19.7 MiB with librdkafka's (the whole backlog).
PER_GROUP = 10 * 2**20


@pytest.fixture
def gateway(tansu: TansuBroker, tmp_path: Path) -> Iterator[tuple[Child, int]]:
    child, port = start_rafka(tmp_path, kafka_document(tansu.bootstrap), "--engine", "kafka")
    try:
        yield child, port
    finally:
        child.stop(30)


@contextmanager
def rafka_with(
    workdir: Path, bootstrap: str, section: str, properties: dict[str, str]
) -> Iterator[tuple[Child, int]]:
    """A `rafka` on Kafka with `properties` over the tests' Kafka document's `section`."""
    document: dict[str, Any] = kafka_document(bootstrap)
    document.setdefault(section, {}).update(properties)
    workdir.mkdir()
    child, port = start_rafka(workdir, document, "--engine", "kafka")
    try:
        yield child, port
    finally:
        child.stop(30)


def read_records(port: int, group: str, topic: str, count: int) -> list[bytes]:
    """The values of the first `count` records of `topic` for a new `group`, by BLMPOP."""
    got: list[bytes] = []
    with redis.Redis(port=port, client_name=f"{group}:c") as client:
        while len(got) < count:
            reply = client.blmpop(
                30, 1, f"topics:{topic}", direction="LEFT", count=count - len(got)
            )
            assert reply is not None, f"group {group} waited 30 s after {len(got)} records"
            got.extend(dict(zip(r[::2], r[1::2], strict=True))[b"value"] for r in reply[1])
    return got


def settled_rss(pid: int) -> int:
    """The process's RSS once it has stopped growing: four readings 0.25 s apart within
    1 MiB of each other (librdkafka fetches in the background)."""
    readings: list[int] = []

    def steady() -> bool:
        readings.append(rss_bytes(pid))
        last = readings[-4:]
        return len(last) == 4 and max(last) - min(last) < 2**20

    wait_until(steady, 60, "the gateway's memory to stop growing", interval=0.25)
    return readings[-1]


def test_idle_groups_hold_a_bounded_prefetch(
    tansu: TansuBroker, gateway: tuple[Child, int]
) -> None:
    child, port = gateway
    topic = tansu.create_topic(1)
    producer = Producer({"bootstrap.servers": tansu.bootstrap, "linger.ms": 20})
    value = b"v" * VALUE_SIZE
    for _ in range(BACKLOG):
        producer.produce(topic, value)
        producer.poll(0)
    assert producer.flush(60) == 0
    before = settled_rss(child.pid)
    clients = []
    for number in range(GROUPS):
        client = redis.Redis(port=port, client_name=f"prefetch-{number}-{topic}:c")
        clients.append(client)
        got = 0
        while got < READ:
            reply = client.blmpop(30, 1, f"topics:{topic}", direction="LEFT", count=READ - got)
            assert reply is not None, f"group {number} waited 30 s after {got} records"
            got += len(reply[1])
    grown = settled_rss(child.pid) - before
    for client in clients:
        client.close()
    assert grown / GROUPS < PER_GROUP, (
        f"each of {GROUPS} idle groups costs the gateway {grown / GROUPS / 2**20:.1f} MiB "
        f"with a {BACKLOG * VALUE_SIZE / 2**20:.0f} MiB backlog"
    )


def test_the_prefetch_defaults_give_way_to_the_configuration() -> None:
    """The start-up log's consumer settings (describe): the defaults, under `general`
    and `consumer`."""
    plain = describe(parse_settings({}))["consumer"]
    assert isinstance(plain, dict)
    assert {key: plain[key] for key in CONSUMER_DEFAULTS} == dict(CONSUMER_DEFAULTS)
    document: dict[str, object] = {
        "general": {"queued.min.messages": "100000"},
        "consumer": {"queued.max.messages.kbytes": "65536"},
    }
    configured = describe(parse_settings(document))["consumer"]
    assert isinstance(configured, dict)
    assert configured["queued.min.messages"] == "100000"
    assert configured["queued.max.messages.kbytes"] == "65536"
    assert configured["fetch.queue.backoff.ms"] == CONSUMER_DEFAULTS["fetch.queue.backoff.ms"]
    # Not in the producer's: these are consumer properties (librdkafka warns about them).
    producer = describe(parse_settings({}))["producer"]
    assert isinstance(producer, dict) and not set(CONSUMER_DEFAULTS) & set(producer)


def test_a_configured_fetch_bound_reaches_librdkafka_instead_of_the_default(
    tansu: TansuBroker, tmp_path: Path
) -> None:
    """A user's fetch.max.bytes is what librdkafka gets: one past librdkafka's range fails
    the group's consumer (Rafka's CONS error; the log says why, in librdkafka's words),
    where the default serves the BLPOP. (What the bound saves in memory is too noisy to
    assert here: bench/growth.py measures it.)"""
    topic = tansu.create_topic(1)
    producer = Producer({"bootstrap.servers": tansu.bootstrap})
    producer.produce(topic, b"served")
    assert producer.flush(30) == 0
    with rafka_with(tmp_path / "default", tansu.bootstrap, "consumer", {}) as (_, port):
        assert read_records(port, f"default-{topic}", topic, 1) == [b"served"]
    out_of_range = {"fetch.max.bytes": "2147483136"}
    with rafka_with(tmp_path / "user", tansu.bootstrap, "consumer", out_of_range) as (
        child,
        port,
    ):
        name = f"bound-{topic}:c"
        with (
            redis.Redis(port=port, client_name=name) as client,
            pytest.raises(redis.ResponseError) as refused,
        ):
            client.blpop([f"topics:{topic}"], 1)
        assert str(refused.value) == (
            f"CONS Failed to register Consumer '{name}|{topic}' for Client '{name}'"
        )
        wait_until(
            lambda: any(
                'property "fetch.max.bytes" value 2147483136 is outside allowed range' in line
                for line in child.stderr_lines
            ),
            10,
            "the gateway to log librdkafka's refusal of fetch.max.bytes",
        )


@pytest.mark.parametrize("section", ["general", "consumer"])
def test_a_fetch_bound_set_alone_is_accepted_and_large_records_still_arrive(
    tansu: TansuBroker, tmp_path: Path, section: str
) -> None:
    """librdkafka refuses a fetch.max.bytes under message.max.bytes (1,000,000 unless
    set): the gateway lowers message.max.bytes to a smaller fetch bound set alone, and a
    record larger than the bound still arrives whole (the broker sends the first batch
    whatever the bound)."""
    topic = tansu.create_topic(1)
    large = b"L" * 200_000
    producer = Producer({"bootstrap.servers": tansu.bootstrap})
    producer.produce(topic, large)
    producer.produce(topic, b"after")
    assert producer.flush(30) == 0
    properties = {"fetch.max.bytes": "65536"}
    with rafka_with(tmp_path / section, tansu.bootstrap, section, properties) as (_, port):
        assert read_records(port, f"small-{section}-{topic}", topic, 2) == [large, b"after"]


def test_a_fetch_bound_set_alone_lowers_message_max_bytes_to_it() -> None:
    """Only a fetch.max.bytes under librdkafka's default message.max.bytes, set without
    one, moves it; from the configuration or a client's settings alike."""
    assert "message.max.bytes" not in consumer_config({})
    assert "fetch.max.bytes" not in consumer_config({})
    assert consumer_config({"fetch.max.bytes": "65536"})["message.max.bytes"] == "65536"
    assert consumer_config({}, {"fetch.max.bytes": "65536"})["message.max.bytes"] == "65536"
    assert "message.max.bytes" not in consumer_config({"fetch.max.bytes": "2000000"})
    both = consumer_config({"fetch.max.bytes": "10"}, {"message.max.bytes": "20"})
    assert (both["fetch.max.bytes"], both["message.max.bytes"]) == ("10", "20")
