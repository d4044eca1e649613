"""What each consumer group's librdkafka consumer fetches ahead (backends/kafka/settings.py
CONSUMER_DEFAULTS): bounded by default, so that a gateway serving many groups does not
hold a copy of every backlog per group; the configuration and a client's settings still
win. On a real `rafka` process and the Tansu broker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from confluent_kafka import Producer

from backends.kafka.settings import CONSUMER_DEFAULTS, describe, parse_settings
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
