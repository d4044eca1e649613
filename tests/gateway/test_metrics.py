"""The Prometheus endpoint (gateway.metrics): scraped over real HTTP and parsed with
prometheus_client's parser, after producing, consuming and acking through redis-py, on
each real engine (Dafka on a network of its own, Kafka on the Tansu fixture). Its
configuration, off by default, and its end with the gateway."""

from __future__ import annotations

import dataclasses
import os
import secrets
import socket
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from backends.ports import free_port
from gateway.config import ConfigError, from_args, from_dict
from gateway.push.spec import parse_subscriptions
from gateway.runner import ServerThread
from gateway.stats import ServerStats
from tests.support.engines import MemoryEngineFactory
from tests.support.fixtures import GatewayConfig
from tests.support.gateway import refused
from tests.support.http_sink import HttpSink
from tests.support.kafka import kafka_document
from tests.support.metrics import Scrape, scrape, scrape_until
from tests.support.processes import listening_addresses
from tests.support.waiting import wait_until

PRODUCED = 12
KEYS = ("a", "b", "c", "d")  # CRC32 (both engines' default): "d" to partition 0, the others 1


def metrics_threads() -> list[threading.Thread]:
    """The endpoint's threads: the HTTP server's, the lag reader's and its workers'."""
    return [
        thread
        for thread in threading.enumerate()
        if thread.name.startswith("rafka-metrics-lag") or "serve_forever" in thread.name
    ]


def consume_all(client: redis.Redis, topic: str) -> tuple[list[tuple[int, int]], int]:
    """Every record produced, as (partition, offset); and how many BLPOPs that took (the
    first ones may time out while the group forms)."""
    got: list[tuple[int, int]] = []
    calls = 0
    while len(got) < PRODUCED:
        assert calls < PRODUCED + 20, f"only {len(got)} of {PRODUCED} records: {got}"
        calls += 1
        reply = client.blpop([f"topics:{topic}"], 2)
        if reply is None:
            continue
        fields = dict(zip(reply[::2], reply[1::2], strict=True))
        got.append((int(fields[b"partition"]), int(fields[b"offset"])))
    return got, calls


def lag_rows(metrics: Scrape, group: str) -> dict[int, tuple[float, float]]:
    """partition -> (committed offset, lag) of `group`, as scraped."""
    rows: dict[int, tuple[float, float]] = {}
    committed = metrics.labelled("rafka_consumer_committed_offset")
    for labels, lag in metrics.labelled("rafka_consumer_lag").items():
        values = dict(labels)
        if values["group"] == group:
            rows[int(values["partition"])] = (committed[labels], lag)
    return rows


def test_scrape_reports_what_happened(
    engine_name: str, gateway_config: GatewayConfig, new_topic: Callable[[int], str]
) -> None:
    topic = new_topic(2)
    group = f"g{secrets.token_hex(4)}"
    config = gateway_config(engine_name, metrics_port=0, metrics_lag_timeout=20)
    with ServerThread(config) as server:
        assert server.server.metrics is not None
        port = server.server.metrics.port
        producer = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=30)
        for number in range(PRODUCED):
            target = f"topics:{topic}:{KEYS[number % len(KEYS)]}"
            assert producer.execute_command("RPUSHX", target, f"v{number}") == 1
        assert producer.execute_command("DUMP", "10000") == 0

        consumer = redis.Redis(
            host="127.0.0.1", port=server.port, socket_timeout=30, client_name=f"{group}:c1"
        )
        records, blpops = consume_all(consumer, topic)
        assert consumer.blpop([f"topics:{topic}"], 0.3) is None  # nothing more: waits 0.3 s
        blpops += 1
        by_partition: dict[int, list[int]] = defaultdict(list)
        for partition, offset in records:
            by_partition[partition].append(offset)
        assert len(by_partition) == 2, f"the keys should use both partitions: {records}"
        # Leave 1 record of the first partition unacked, 2 of the second.
        expected: dict[int, tuple[float, float]] = {}
        acks = 0
        for index, partition in enumerate(sorted(by_partition)):
            offsets = sorted(by_partition[partition])
            keep = min(index + 1, len(offsets) - 1)
            for offset in offsets[: len(offsets) - keep]:
                assert consumer.execute_command("RPUSH", "acks", f"{topic}:{partition}:{offset}")
                acks += 1
            committed = offsets[len(offsets) - keep - 1] + 1
            expected[partition] = (committed, offsets[-1] + 1 - committed)

        # Two clients connected now; the scrape is no Redis client.
        during = scrape(port)
        assert during.value("rafka_server_connections_current") == 2

        consumer.execute_command("QUIT")  # the group commits on close
        consumer.close()

        scrape_until(
            port,
            lambda metrics: lag_rows(metrics, group) == expected,
            60,
            f"scraped lag of {group} == {expected}",
        )
        metrics = scrape_until(
            port,
            lambda metrics: metrics.value("rafka_server_connections_current") == 1,
            20,
            "the consumer's connection counted out",
        )
        assert metrics.value("rafka_consumer_lag_collect_ok") == 1
        # Every offset the topic's partitions end at.
        for partition, offsets in by_partition.items():
            labels = {"topic": topic, "partition": str(partition)}
            assert metrics.value("rafka_partition_next_offset", **labels) == max(offsets) + 1
            assert metrics.value("rafka_partition_first_offset", **labels) == min(offsets)

        # The stats counters: what happened, and what HGETALL stats says.
        assert metrics.value("rafka_producer_produced_messages_total") == PRODUCED
        assert metrics.value("rafka_producer_delivered_messages_total") == PRODUCED
        assert metrics.value("rafka_consumer_consumed_messages_total") == PRODUCED
        assert metrics.value("rafka_consumer_acked_messages_total") == acks
        assert metrics.value("rafka_server_connections_total") == 2
        stats = producer.execute_command("HGETALL", "stats")
        stats = {k.decode(): int(v) for k, v in (stats.items() if isinstance(stats, dict) else [])}
        assert stats, "HGETALL stats answered nothing"
        for name, value in stats.items():
            # Counters' samples end in _total (server.connections.total's already does).
            metric = "rafka_" + name.replace(".", "_")
            if name not in ServerStats.GAUGES and not metric.endswith("_total"):
                metric += "_total"
            assert metrics.value(metric) == value, f"{name}: HGETALL {value}, {metric}"
        assert metrics.types["rafka_producer_produced_messages"] == "counter"
        assert metrics.types["rafka_server_connections_current"] == "gauge"
        assert metrics.types["rafka_consumer_lag"] == "gauge"

        # Latency: one observation per command, per command name.
        assert metrics.types["rafka_command_duration_seconds"] == "histogram"

        def count(command: str, le: str = "+Inf") -> float | None:
            return metrics.value("rafka_command_duration_seconds_bucket", command=command, le=le)

        assert count("rpushx") == PRODUCED
        assert count("dump") == 1
        assert count("blpop") == blpops
        assert count("rpush") == acks
        assert metrics.value("rafka_command_duration_seconds_count", command="blpop") == blpops
        # The BLPOP that waited 0.3 s for nothing is above 0.25 s.
        assert (count("blpop", "0.25") or 0) <= blpops - 1
        assert (metrics.value("rafka_command_duration_seconds_sum", command="blpop") or 0) >= 0.3
        # prometheus_client's standard collectors: this process's.
        assert (metrics.value("process_resident_memory_bytes") or 0) > 0
        assert "python_info" in metrics.types
        # Neither a joined Dafka network nor a Kafka broker keeps the log on this machine.
        assert metrics.labelled("rafka_store_disk_usage_bytes") == {}
        producer.close()
        assert metrics_threads()
    assert refused(port), "the metrics port is still open after the gateway stopped"
    assert metrics_threads() == [], "metrics threads outlived the gateway"


def test_off_by_default() -> None:
    factory = MemoryEngineFactory()
    try:
        config = factory.gateway_config()
        assert config.metrics_port is None
        before = listening_addresses(os.getpid())
        with ServerThread(config) as server:
            assert server.server.metrics is None
            opened = listening_addresses(os.getpid()) - before
            assert opened == {("127.0.0.1", server.port)}, opened
            assert metrics_threads() == []
    finally:
        factory.close()


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (70000, "gateway.metrics_port must be >= 0 and <= 65535, got 70000"),
        (-1, "gateway.metrics_port must be >= 0 and <= 65535, got -1"),
        ("9100", "gateway.metrics_port must be an integer, got '9100'"),
        (True, "gateway.metrics_port must be an integer, got True"),
    ],
)
def test_bad_port_in_the_file(value: object, text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        from_dict({"gateway": {"metrics_port": value}})
    assert str(caught.value) == text


def test_bad_port_and_timeout() -> None:
    with pytest.raises(ConfigError) as caught:
        from_args(["--metrics-port", "65536"])
    assert str(caught.value) == "--metrics-port must be between 0 and 65535, got 65536"
    with pytest.raises(ConfigError) as caught:
        from_args(["--metrics-port", "x"])
    assert "argument --metrics-port: invalid int value: 'x'" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        from_dict({"gateway": {"metrics_lag_timeout": 0}})
    assert str(caught.value) == "gateway.metrics_lag_timeout must be a finite number > 0, got 0"
    assert from_dict({"gateway": {"metrics_port": None}}).metrics_port is None  # off
    config = from_args(["--metrics-port", "9100", "--metrics-host", "127.0.0.2"])
    assert (config.metrics_port, config.metrics_host) == (9100, "127.0.0.2")


def test_taken_port_is_a_clear_error_and_leaves_nothing_open() -> None:
    factory = MemoryEngineFactory()
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        before = listening_addresses(os.getpid())
        with pytest.raises(OSError) as caught:
            ServerThread(factory.gateway_config(metrics_port=port)).start()
        assert str(caught.value) == (
            f"cannot serve metrics on 127.0.0.1:{port}: Address already in use"
        )
        assert listening_addresses(os.getpid()) == before
        assert metrics_threads() == []
    finally:
        taken.close()
        factory.close()


def test_unreachable_engine_bounds_the_scrape_and_never_blocks_commands() -> None:
    """A Kafka engine whose broker does not answer (nothing listens on its port): lag
    cannot be read, so the scrape answers after metrics_lag_timeout with the rest, and
    the gateway answers its clients meanwhile."""
    document = kafka_document(f"127.0.0.1:{free_port()}")
    section = {"host": "127.0.0.1", "port": 0, "metrics_port": 0, "metrics_lag_timeout": 1}
    config = from_dict({**document, "gateway": {"engine": "kafka", **section}})
    with ServerThread(config) as server:
        assert server.server.metrics is not None
        port = server.server.metrics.port
        client = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=10)
        assert client.ping()  # connected before the scrape
        scrapes: list[tuple[Scrape, float]] = []

        def scrape_timed() -> None:
            started = time.monotonic()
            metrics = scrape(port)
            scrapes.append((metrics, time.monotonic() - started))

        scraper = threading.Thread(target=scrape_timed)
        scraper.start()
        pings: list[float] = []
        while scraper.is_alive():
            started = time.monotonic()
            assert client.ping()
            pings.append(time.monotonic() - started)
        scraper.join()
        assert max(pings) < 0.5, f"a PING waited {max(pings):.2f} s during the scrape"
        metrics, seconds = scrapes[0]
        assert 1 <= seconds < 4, f"the scrape took {seconds:.2f} s (bound: 1 s)"
        assert metrics.value("rafka_consumer_lag_collect_ok") == 0
        assert metrics.labelled("rafka_consumer_lag") == {}
        assert metrics.value("rafka_server_connections_current") == 1
        # The next scrape waits for the same collection rather than start another.
        assert scrape(port).value("rafka_consumer_lag_collect_ok") == 0
        client.close()
        stopping = time.monotonic()
    assert time.monotonic() - stopping < 15, "the gateway took long to stop"
    assert refused(port)
    assert metrics_threads() == []


# --- HTTP push counters, and scrapers left connected at stop ----------------------------

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        yield server


def fetch(port: int, accept: str | None = None) -> str:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if accept is not None:
        request.add_header("Accept", accept)
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        return str(response.read().decode())


def test_push_counters_of_two_subscriptions_stay_apart(
    engine_name: str,
    new_topic: Callable[[int], str],
    gateway_config: GatewayConfig,
    sink: HttpSink,
    tmp_path: Path,
) -> None:
    """`orders-eu` and `orders.eu` are two legal, distinct subscription names. Their
    counters must be two series a scraper can tell apart, and the exposition must stay
    valid: every metric family once (OpenMetrics, what Prometheus asks for first, forbids
    a family twice)."""
    pushed, quiet = new_topic(1), new_topic(1)
    subscriptions = [
        {
            "name": "orders-eu",
            "topic": pushed,
            "group": f"g{secrets.token_hex(4)}",
            "urls": [sink.url("/eu")],
        },
        {
            "name": "orders.eu",
            "topic": quiet,
            "group": f"g{secrets.token_hex(4)}",
            "urls": [sink.url("/other")],
        },
    ]
    base = gateway_config(engine_name, metrics_port=0, data_dir=str(tmp_path))
    config = dataclasses.replace(base, subscriptions=parse_subscriptions(subscriptions))
    with ServerThread(config) as server:
        assert server.server.metrics is not None
        port = server.server.metrics.port
        client = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=30)
        assert client.execute_command("RPUSHX", f"topics:{pushed}", "a", "b", "c") == 3
        assert client.execute_command("DUMP", 10_000) == 0
        wait_until(
            lambda: int(client.hgetall("stats").get(b"push.orders-eu.delivered", -1)) == 3,
            60,
            "3 records pushed through orders-eu (HGETALL stats)",
        )
        stats = client.hgetall("stats")
        assert int(stats[b"push.orders.eu.delivered"]) == 0
        client.close()

        text = fetch(port)
        families = Counter(family.name for family in text_string_to_metric_families(text))
        twice = sorted(name for name, seen in families.items() if seen > 1)
        assert twice == [], f"metric families exposed more than once: {twice}"
        try:
            list(openmetrics_families(fetch(port, OPENMETRICS)))
        except ValueError as error:
            pytest.fail(f"the OpenMetrics exposition does not parse: {error}")
        # One series per subscription, told apart by a label.
        delivered = {
            sample.labels.get("subscription"): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "rafka_push_delivered_total"
        }
        assert delivered == {"orders-eu": 3, "orders.eu": 0}, delivered


def _request_threads() -> list[threading.Thread]:
    """The HTTP server's per-connection threads (socketserver.ThreadingMixIn's)."""
    return [t for t in threading.enumerate() if "process_request_thread" in t.name]


def test_stop_ends_the_connections_of_slow_scrapers() -> None:
    """A scraper that connected and has not finished its request (a slow or stuck
    client) when the gateway stops: docs/metrics.md says the endpoint closes with its
    threads. Its connection must be closed, its thread ended."""
    factory = MemoryEngineFactory()
    before = set(_request_threads())
    slow = socket.socket()
    try:
        with ServerThread(factory.gateway_config(metrics_port=0)) as server:
            assert server.server.metrics is not None
            slow.connect(("127.0.0.1", server.server.metrics.port))
            slow.sendall(b"GET /metrics HTTP/1.1\r\n")  # the rest never comes
            wait_until(
                lambda: set(_request_threads()) - before, 10, "the server took the connection"
            )
        slow.settimeout(5)
        try:
            closed = slow.recv(1) == b""
        except TimeoutError:
            closed = False
        left = [t.name for t in set(_request_threads()) - before if t.is_alive()]
        assert closed and not left, (
            f"after the gateway stopped: slow scraper's connection closed: {closed}; "
            f"request threads still running: {left}"
        )
    finally:
        slow.close()
        factory.close()
